"""``attention()`` over an FP8 K/V cache: the calls that pass ``k_scale`` and ``v_scale``.

K and V hold FP8 codes (:data:`attntune.problem.KV_DTYPES`, one format for both), q is float16/bfloat16,
and the real keys and values are ``codes.float() * scale`` with float32 scales of shape ``[1]`` (per
tensor) or ``[Hkv]`` (per kv head) — :mod:`attntune.fp8` makes both from a float cache. The problem
carries ``kv_dtype``; only variants that declare the format (``Variant.kv_dtypes``: ``triton_decode``
reads the codes directly, ``fp8_dequant`` widens them — the fallback) can serve it, so a call in q's dtype
never meets an FP8 kernel and FP8 codes never reach a kernel that would read them as numbers.

The same slot table as every other call (:data:`~attntune.policies.runtime.SLOTS`, its signatures tagged
``"fp8"``): a repeat call is one dict look-up and the bound call with the two scales appended. A new
signature resolves a plan through the policy (the shipped cache has no FP8 rows yet: the heuristic rules
decide, and the online policy does not tune FP8 keys). A variant that fails is quarantined and the call
goes to the fallback, as elsewhere. Not covered yet: latency sampling.

Under ``torch.compile`` (HF ``generate`` compiles the decode step of a static cache by itself on a GPU) the
call is the opaque custom op ``attntune::attention_fp8``: the codes and scales go into the graph as they
are, and the op runs this module's slot path at run time (triton_decode reading the codes), as the regular
op ``attntune::attention`` does for 16-bit K/V. Before, the codes were widened in the graph and the call
went to the regular op: correct, but a bf16 copy of the cache was written and read every step.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from attntune.fp8 import check_scale_values, check_scales
from attntune.policies import runtime as _runtime
from attntune.policies.dispatch import (NO_WINDOW, _check_scalars, _empty, _failed, _family_sig, _put_once,
                                       check_head_dim, check_kv_lens, empty_has_no_plan)
from attntune.policies.dispatch import _new_slot as new_slot
from attntune.policies.runtime import SLOTS, Slot
from attntune.problem import problem_from_tensors, validate_qkv

_FP8 = "fp8"  # first element of these calls' signatures


def attention_fp8(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor, causal, window, scale,
                  kv_lens: Optional[Tensor], approx) -> Tensor:
    """:func:`attntune.attention` with FP8 ``k``/``v`` (module docstring). ``window`` is already
    validated."""
    if torch.compiler.is_compiling():
        _check_scalars(causal, scale, approx)  # Python values at trace time: refused as in eager mode
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            _refuse_grad()  # the op has no backward: it failed only at .backward(), deep in autograd
        wl, wr = window if window is not None else (NO_WINDOW, NO_WINDOW)
        return torch.ops.attntune.attention_fp8(q, k, v, k_scale, v_scale, kv_lens, bool(causal), wl, wr,
                                                None if scale is None else float(scale),
                                                -1 if approx is None else int(bool(approx)))
    try:
        sig = (_FP8, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
               causal, window, scale, approx,
               None if kv_lens is None else (kv_lens.shape, kv_lens.dtype, kv_lens.device),
               k_scale.shape, k_scale.stride(), k_scale.dtype, k_scale.device,
               v_scale.shape, v_scale.stride(), v_scale.dtype, v_scale.device)
        slot = SLOTS.get(sig)
    except (AttributeError, TypeError):  # not tensors / unhashable arguments: say which one
        _check(q, k, v, kv_lens, k_scale, v_scale, causal, scale, approx)
        raise
    if slot is None:
        slot = _new_slot(sig, q, k, v, kv_lens, k_scale, v_scale, causal, window, scale, approx)
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        _refuse_grad()  # checked per call: a signature first seen without grad must not admit it later
    if kv_lens is not None and _runtime.CHECK:
        check_kv_lens(kv_lens, k.shape[2])
    if _runtime.CHECK:
        check_scale_values(k_scale, v_scale)
    slot.calls += 1
    try:
        return slot.fn(q, k, v, slot.problem, slot.config, kv_lens, k_scale, v_scale)
    except Exception as e:  # noqa: BLE001 — quarantine and fall back; re-raised if the fallback fails
        return _failed(sig, slot, e, q, k, v, kv_lens, k_scale, v_scale)



def _check(q, k, v, kv_lens, k_scale, v_scale, causal, scale, approx) -> None:
    validate_qkv(q, k, v, kv_lens, fp8=True)
    check_scales(k, k_scale, v_scale)
    _check_scalars(causal, scale, approx)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        _refuse_grad()


def _refuse_grad() -> None:
    raise ValueError("k_scale/v_scale: an FP8 K/V cache is for inference; no input may require grad")


def _fp8_problem(q, k, v, kv_lens, k_scale, v_scale, causal, window, scale, approx):
    _check(q, k, v, kv_lens, k_scale, v_scale, causal, scale, approx)
    rt = _runtime.get()
    return problem_from_tensors(q, k, v, causal=bool(causal), window=window, kv_lens=kv_lens, mode="fwd",
                                approx=rt.config.allow_approx if approx is None else bool(approx),
                                scale=None if scale is None else float(scale), validate=False)


def explain_fp8(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor, causal, window, scale,
                kv_lens: Optional[Tensor], approx):
    """:func:`attntune.explain` for FP8 K/V (the plan :func:`attention_fp8` would use; nothing recorded)."""
    if _is_empty(q, k, v):
        _check_empty(q, k, v, kv_lens, k_scale, v_scale, causal, scale, approx)
        raise empty_has_no_plan(q, k, v)
    problem = _fp8_problem(q, k, v, kv_lens, k_scale, v_scale, causal, window, scale, approx)
    return _runtime.get().plan_for(problem, q.device, dry=True)


def _new_slot(sig, q, k, v, kv_lens, k_scale, v_scale, causal, window, scale, approx) -> Slot:
    """A never-seen signature's slot: zeros for a call with an empty dimension (as 16-bit calls get; the
    problem model has no empty shapes), else its family's plan when the family has one (a decode loop's
    growing cache resolved a plan at every new length: 200 plans in 200 steps, 0.42 against 0.17 ms a
    step on a CPU), else a plan resolved for the call and remembered for the family."""
    if _is_empty(q, k, v):
        _check_empty(q, k, v, kv_lens, k_scale, v_scale, causal, scale, approx)
        return _put_once(sig, Slot(None, _empty_fp8, None, None, 0, q.device))
    fam = None
    if isinstance(k_scale, Tensor) and isinstance(v_scale, Tensor):
        # the scales' kind is part of the family (one per tensor or per head: the launch specializes on it)
        tag = (_FP8, k_scale.shape, k_scale.stride(), k_scale.dtype, k_scale.device,
               v_scale.shape, v_scale.stride(), v_scale.dtype, v_scale.device)
        fam = _family_sig(tag, q, k, v, kv_lens, causal, "bottom_right", window, scale, approx, False)
    return new_slot(sig, fam, q, k,
                    lambda: _fp8_problem(q, k, v, kv_lens, k_scale, v_scale, causal, window, scale, approx))


def _is_empty(q, k, v) -> bool:
    return isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor) and (
        0 in q.shape or 0 in k.shape or 0 in v.shape)


def _check_empty(q, k, v, kv_lens, k_scale, v_scale, causal, scale, approx) -> None:
    _check(q, k, v, kv_lens, k_scale, v_scale, causal, scale, approx)
    check_head_dim(q)


def _empty_fp8(q, k, v, problem, config, kv_lens, _k_scale=None, _v_scale=None) -> Tensor:
    return _empty(q, k, v, problem, config, kv_lens)


@torch.library.custom_op("attntune::attention_fp8", mutates_args=())
def _attention_fp8_op(q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor, kv_lens: Optional[Tensor],
                      causal: bool, window_left: int, window_right: int, scale: Optional[float],
                      approx: int) -> Tensor:
    """:func:`attention_fp8` as one opaque op for ``torch.compile`` (module docstring): the plan is resolved
    at run time from the real tensors. ``window_left == -2``: no window; ``approx`` -1/0/1 =
    environment/no/yes. Returns a contiguous ``[B, Hq, Sq, Dv]`` tensor (what the fake promises)."""
    window = None if window_left == NO_WINDOW else (window_left, window_right)
    return attention_fp8(q, k, v, k_scale, v_scale, causal, window, scale, kv_lens,
                         None if approx < 0 else bool(approx)).contiguous()


@_attention_fp8_op.register_fake
def _attention_fp8_fake(q, k, v, k_scale, v_scale, kv_lens, causal, window_left, window_right, scale, approx):
    validate_qkv(q, k, v, kv_lens, fp8=True)
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


_runtime.FP8_ATTENTION = attention_fp8
_runtime.FP8_EXPLAIN = explain_fp8

__all__: Tuple[str, ...] = ("attention_fp8", "explain_fp8")
