"""The hot path: ``attention()``, the SDPA drop-in, the ``torch.library`` custom op, the F.sdpa patch.

Eager calls (the common case) never enter the dispatcher: a call builds a tuple signature from its
tensors' shapes, dtypes, devices and flags (no pydantic, no validation), looks the signature up in
:data:`~attntune.policies.runtime.SLOTS` and calls the slot's variant — one dict lookup and one call.
The first call of a signature either reuses the plan of its *family* (same TuneKey ingredients: a
never-seen KV length of a decode loop, say — one problem model built, the variant asked whether it takes
the exact shape, nothing else) or validates the inputs, builds the canonical :class:`AttentionProblem`,
resolves the plan (cache index, policy; misses counted, written later off the hot path) and stores the
slot. Gradients flow
through the chosen variant's own autograd.

Under ``torch.compile`` (``torch.compiler.is_compiling()``) the same functions emit the custom op
``attntune::attention`` instead: it takes the call's semantics as primitive arguments and resolves the
plan *inside* its implementation, at run time, from the real tensors — deterministically, through the
same plan cache as eager calls. Dynamic shapes therefore get the plan of each actual shape, and a plan
never gets baked into a graph. Its fake (meta) registration gives the output shape and layout (the inputs':
:func:`_heads_inner`). A call that needs gradients emits ``attntune::attention_train`` instead, which also
returns the row LSE of a variant that keeps one (``Variant.forward_saving``: the flash kernels, the SDPA
variants), and whose backward runs that variant's own backward from it; other variants' backward recomputes
the forward with the same plan under ``enable_grad`` and differentiates it. No graph breaks with
``fullgraph=True``.

CUDA graphs: once a signature has been called (warm-up), its calls do no host synchronisation, no
allocation of host memory beyond Python objects, no I/O and no logging — they can be captured.

Failures: a variant that raises is retried on the safe fallback (torch SDPA, else eager); if that serves
the call, the variant is quarantined for the process (warned once) and its problem keeps the fallback; if
the fallback refuses the call too, the error is the caller's and is raised, nothing quarantined. torch's
own SDPA is never quarantined (``_failed``).
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence, Tuple

import torch
import torch.autograd.forward_ad as _fwad
import torch.nn.functional as F
from torch import Tensor

from attntune.key import bucket
from attntune.kernels.base import Variant as _Variant
from attntune.policies import runtime as _runtime
from attntune.policies.plan import Plan
from attntune.policies.policy import fallback_plan
from attntune.policies.runtime import COUNTS as _COUNTS
from attntune.policies.runtime import FAMILIES, SLOTS, Slot
from attntune.tolerances import tf32_allowed
from attntune.problem import (DTYPE_NAMES, AttentionProblem, canonical_mask, problem_from_tensors, validate_qkv,
                              validate_window)

#: torch's own SDPA, captured when attntune's runtime is imported (before any patch of ours)
_torch_sdpa = F.scaled_dot_product_attention

# Bound once: module-global look-ups are the cheapest the hot path can do.
_get = SLOTS.get
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_any_autocast = torch._C._is_any_autocast_enabled

#: window sides passed to the custom op when there is no window (the op's ints cannot be None)
NO_WINDOW = -2
_DROPIN = "sdpa"  # first element of the drop-in's signatures (keeps them apart from attention()'s)
_OP = "op"        # first element of the custom op's signatures


# ---- public entry points ----------------------------------------------------------------------------
def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              window: Optional[Tuple[int, int]] = None, scale: Optional[float] = None,
              kv_lens: Optional[Tensor] = None, approx: Optional[bool] = None,
              k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None) -> Tensor:
    """Attention through the fastest correct implementation this process knows for the call.

    q ``[B, Hq, Sq, D]``, k ``[B, Hkv, Skv, D]``, v ``[B, Hkv, Skv, Dv]`` → ``[B, Hq, Sq, Dv]`` in q's
    dtype, ``Hq % Hkv == 0`` (GQA/MQA: query head ``h`` reads kv head ``h // (Hq // Hkv)``).

    * ``causal``: query row ``i`` sees keys ``j <= i + Skv - Sq`` (aligned **bottom-right**, as
      FlashAttention: the queries are the last ``Sq`` positions — what decode and chunked prefill need).
    * ``window=(left, right)``: row ``i`` sees ``i + off - left <= j <= i + off + right`` with
      ``off = Skv - Sq``; ``-1`` = unbounded side. Combined with ``causal`` by intersection.
    * ``scale``: softmax scale, default ``1/sqrt(D)``.
    * ``kv_lens``: int32/int64 ``[B]``, keys ``j >= kv_lens[b]`` are padding (a KV cache); the causal
      diagonal then sits at ``kv_lens[b] - Sq`` per sequence (see :mod:`attntune.problem`). Values are
      clamped to ``[0, Skv]`` (every variant and the reference alike); ``ATTNTUNE_CHECK=1`` refuses
      values outside instead (``ValueError``, one host sync per call). Padding slots must hold finite
      values (zeros): the SDPA-based variants weight them by 0, and ``0 * NaN`` is NaN (as in torch's SDPA
      with the equivalent boolean mask); the decode kernel never reads them.
    * ``window`` sides are integers, ``-1`` or ``>= 0``, of any size (clamped to the sequence); bools,
      floats and ``inf`` are refused.
    * ``approx``: allow approximate variants (Nyström) for this call; None = ``ATTNTUNE_ALLOW_APPROX``.
    * ``k_scale``, ``v_scale``: an **FP8 K/V cache** (inference only). ``k``/``v`` then hold FP8 codes
      (``float8_e4m3fn`` or ``float8_e5m2``, one format for both; ``float8_e4m3fnuz`` on ROCm, untested),
      q is float16/bfloat16, and the real keys/values are ``codes.float() * scale`` with float32 scales
      ``[1]`` (per tensor) or contiguous ``[Hkv]`` (per kv head); :func:`attntune.fp8.quantize_kv` makes
      both from a float cache. Only FP8-capable variants serve such calls (:mod:`attntune.policies.fp8`);
      a call without scales never gets an FP8 kernel, and FP8 ``k``/``v`` without scales are refused.

    Rows that admit no key return zeros. Invalid inputs raise ``ValueError`` naming the argument.
    Under ``torch.autocast`` the call runs in the autocast dtype, as torch's SDPA does (float64 excepted).
    """
    if window is not None:
        window = validate_window(window)
    if k_scale is not None or v_scale is not None:  # FP8 K/V: off the common path (attntune.policies.fp8)
        return _runtime.FP8_ATTENTION(q, k, v, k_scale, v_scale, causal, window, scale, kv_lens, approx)
    if _any_autocast():
        dt = _autocast_dtype(q)
        if dt is not None:  # as torch's autocast runs SDPA: inputs cast, autocast off inside
            with torch.autocast(q.device.type, enabled=False):
                return attention(_autocast_cast(q, dt), _autocast_cast(k, dt), _autocast_cast(v, dt), causal=causal,
                                 window=window, scale=scale, kv_lens=kv_lens, approx=approx)
    if _is_compiling():
        _check_scalars(causal, scale, approx)  # Python values at trace time: refused as in eager mode
        return _compiled(q, k, v, kv_lens, causal, False, window, scale, approx)
    try:
        grad = _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        sig = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
               causal, window, scale, approx, grad,
               None if kv_lens is None else (kv_lens.shape, kv_lens.dtype, kv_lens.device), _numerics(q))
        slot = _get(sig)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, nested tensors (their sizes raise),
        validate_qkv(q, k, v, kv_lens)                # unhashable arguments: say which one
        _check_scalars(causal, scale, approx)
        raise
    if slot is None:
        slot = _attention_slot(sig, q, k, v, kv_lens, causal, window, scale, approx, grad)
    if kv_lens is not None and _runtime.CHECK:
        check_kv_lens(kv_lens, k.shape[2])
    n = slot.calls + 1
    slot.calls = n
    if slot.every and n % slot.every == 0:
        return _sampled(sig, slot, q, k, v, kv_lens)
    try:
        return slot.fn(q, k, v, slot.problem, slot.config, kv_lens)
    except Exception as e:  # noqa: BLE001 — quarantine and fall back; re-raised if the fallback fails
        return _failed(sig, slot, e, q, k, v, kv_lens)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, *, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention`` with exactly its signature and
    semantics: ``is_causal`` is aligned **top-left** (row ``i`` sees keys ``j <= i``), ``enable_gqa``
    as torch's. Calls attntune covers — 4-D inputs, no ``attn_mask``, ``dropout_p == 0``, heads equal
    or (``enable_gqa``) divisible, one dtype and device — go through the plan; everything else goes to
    torch's own SDPA unchanged (so torch's broadcasting, masks and errors apply). Never approximate."""
    if attn_mask is not None or dropout_p or (scale is not None and not _finite_number(scale)):
        # masks, dropout, and scales that are not finite plain numbers (a NaN never equals itself and a
        # tensor hashes by identity: each call would make a new slot) are torch's to handle
        if not _is_compiling():
            _COUNTS["passthrough"] += 1
        return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if _any_autocast():
        dt = _autocast_dtype(query)
        if dt is not None:  # torch's autocast semantics, applied before the plan (see attention())
            with torch.autocast(query.device.type, enabled=False):
                return scaled_dot_product_attention(_autocast_cast(query, dt), _autocast_cast(key, dt),
                                                    _autocast_cast(value, dt), None, 0.0, is_causal, scale=scale,
                                                    enable_gqa=enable_gqa)
    if _is_compiling():
        if not _dropin_ok(query, key, value, enable_gqa):
            return _torch_sdpa(query, key, value, None, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa)
        return _compiled(query, key, value, None, is_causal, True, None, scale, False)
    try:
        grad = _grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
        sig = (_DROPIN, query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype,
               query.device, key.device, value.device, is_causal, scale, enable_gqa, grad, _numerics(query))
        slot = _get(sig)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, unhashable, strided nested tensors
        return _torch_sdpa(query, key, value, None, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa)
    if slot is None:
        slot = _dropin_slot(sig, query, key, value, is_causal, scale, enable_gqa, grad)
    n = slot.calls + 1
    slot.calls = n
    if slot.every and n % slot.every == 0:
        return _sampled(sig, slot, query, key, value, None)
    try:
        return slot.fn(query, key, value, slot.problem, slot.config, None)
    except Exception as e:  # noqa: BLE001
        return _failed(sig, slot, e, query, key, value, None)


def explain(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, window: Optional[Tuple[int, int]] = None,
            scale: Optional[float] = None, kv_lens: Optional[Tensor] = None, approx: Optional[bool] = None,
            k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None) -> Plan:
    """The plan ``attention(q, k, v, ...)`` with the same arguments would use, without running it:
    ``plan.variant``, ``plan.config``, ``plan.source`` (tuned / nearest / heuristic / fixed / online /
    fallback), ``plan.expected_ms``, ``plan.runner_up``, ``plan.reasons``; ``print(plan)`` for a summary.
    Nothing is recorded (no miss, no online tuning); a plan already in use is returned as is. FP8 K/V
    codes take their ``k_scale``/``v_scale`` as in :func:`attention`."""
    if k_scale is not None or v_scale is not None:
        return _runtime.FP8_EXPLAIN(q, k, v, k_scale, v_scale, causal, validate_window(window) if window is not None
                                    else None, scale, kv_lens, approx)
    validate_qkv(q, k, v, kv_lens)
    if 0 in q.shape or 0 in k.shape or 0 in v.shape:
        _validate_empty(q, k, v, kv_lens)
        raise empty_has_no_plan(q, k, v)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    problem = _problem(q, k, v, kv_lens, causal, "bottom_right", validate_window(window),
                       scale, approx, grad)
    return _runtime.get().plan_for(problem, q.device, dry=True)


# ---- slot creation (first call of a signature) ------------------------------------------------------
def check_kv_lens(kv_lens: Tensor, seqlen_kv: int) -> None:
    """``ATTNTUNE_CHECK=1``: raise ``ValueError`` naming ``kv_lens`` when a value lies outside
    ``[0, Skv]`` (reads the values: one host sync; skipped while a CUDA graph is being captured, where a
    sync is not allowed). Without the check such values are clamped to ``[0, Skv]`` everywhere."""
    if kv_lens.numel() == 0 or (kv_lens.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    lo, hi = (int(x) for x in torch.aminmax(kv_lens))
    if lo < 0 or hi > seqlen_kv:
        raise ValueError(f"kv_lens: values must lie in [0, {seqlen_kv}] (the key length), got min {lo}, "
                         f"max {hi} (checked because ATTNTUNE_CHECK=1; unchecked they are clamped)")


def _numerics(q) -> Optional[bool]:
    """What a float32 call's plan also depends on: whether its dots may run in TF32 (the problem's ``tf32``,
    read from torch's ``float32_matmul_precision`` per call, so a plan made under one precision never
    serves the other); None for every other dtype (one identity check on the hot path)."""
    return tf32_allowed() if q.dtype is torch.float32 else None


def _finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _autocast_dtype(q) -> Optional[torch.dtype]:
    """The dtype torch's autocast runs SDPA in for ``q``'s device, or None where autocast is off there.

    SDPA is one of autocast's lower-precision ops: torch casts its floating inputs (float64 excepted) to the
    autocast dtype and runs it with autocast off. attntune does the same before it builds a signature, so
    that the plan is the one of what actually runs (a float32 plan would run bfloat16 math through SDPA,
    and a variant that upcasts would have its matmuls cast back down), and so that a compiled call — the
    custom op, which autocast does not see — returns torch's dtype, as an eager one does."""
    if not isinstance(q, Tensor) or q.device.type not in ("cpu", "cuda") or not torch.is_autocast_enabled(
            q.device.type):
        return None
    return torch.get_autocast_dtype(q.device.type)


def _autocast_cast(t, dtype: torch.dtype):
    return t.to(dtype) if isinstance(t, Tensor) and t.is_floating_point() and t.dtype != torch.float64 else t


def _check_scalars(causal, scale, approx=None) -> None:
    if not isinstance(causal, (bool, int)):
        raise ValueError(f"causal: expected a bool, got {type(causal).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        # a bool is an int to Python (True would be a scale of 1.0); numpy's float32 is not a float
        raise ValueError(f"scale: expected a float or None, got {type(scale).__name__}")
    if scale is not None and not math.isfinite(scale):
        # a NaN or infinite scale makes every output NaN (or a hard max): a bug upstream, named here
        raise ValueError(f"scale: expected a finite float or None, got {scale}")
    if approx is not None and not isinstance(approx, (bool, int)):
        # bool("no") is True: a string would silently allow approximate variants
        raise ValueError(f"approx: expected a bool or None, got {type(approx).__name__}")


def _problem(q, k, v, kv_lens, causal, align, window, scale, approx, grad) -> AttentionProblem:
    validate_qkv(q, k, v, kv_lens)
    _check_scalars(causal, scale, approx)
    allow = _runtime.get().config.allow_approx if approx is None else bool(approx)
    return problem_from_tensors(q, k, v, causal=bool(causal), causal_align=align, window=window, kv_lens=kv_lens,
                                mode="fwd_bwd" if grad else "fwd", approx=allow,
                                scale=None if scale is None else float(scale), validate=False)


def _put(rt, sig, slot: Slot) -> Slot:
    """Store ``slot`` under ``sig`` (emptying the table first when it is full, see MAX_SLOTS)."""
    if len(SLOTS) >= _runtime.MAX_SLOTS:
        rt.overflow()
    SLOTS[sig] = slot
    return slot


def _put_once(sig, slot: Slot) -> Slot:
    """Store ``slot`` under ``sig`` unless another thread stored one for it meanwhile, and return the
    stored one. Two threads meeting a new signature at once both build a slot; had the second replaced
    the first, the calls the first had served would vanish from the counts (8 threads x 40 calls were
    counted as 318 on a loaded CPU)."""
    rt = _runtime.get()
    with rt.lock:
        cur = SLOTS.get(sig)
        return cur if cur is not None else _put(rt, sig, slot)


def _store(rt, sig, plan: Plan, fresh_miss: bool, device) -> Slot:
    # ``rt`` is the caller's (held under its lock): calling _runtime.get() here would wait for the
    # module's runtime lock, which reset() holds while it waits for this runtime's lock
    return _put(rt, sig, Slot(
        plan, plan.impl.bind(plan.problem, plan.config), plan.problem, plan.config, rt.config.latency_sample,
        device, miss=plan.key is not None and plan.key.key_id in rt.missed, reported=1 if fresh_miss else 0,
        generic=plan.source != "fallback" and plan.impl.family_generic(plan.problem, plan.config)))


def _family_sig(tag, q, k, v, kv_lens, causal, align, window, scale, approx, grad) -> Optional[tuple]:
    """The call's family signature (:data:`~attntune.policies.runtime.FAMILIES`): what its TuneKey is
    made of — canonical mask, exact heads/head dims/dtypes/devices/flags, bucketed batch and lengths —
    in plain Python. None when the inputs do not even look consistent: the slow path then raises the
    error that names the argument."""
    try:
        b, hq, sq, d = q.shape
        bk, hkv, skv, dk = k.shape
        bv, hv, sv, dv = v.shape
        kvm = None
        if kv_lens is not None:
            if kv_lens.shape != (b,):
                return None
            kvm = (kv_lens.dtype, kv_lens.device)
    except Exception:  # noqa: BLE001 — not tensors, nested tensors, wrong ranks: the slow path explains
        return None
    if bk != b or bv != b or hv != hkv or sv != skv or dk != d or not isinstance(causal, (bool, int)):
        return None
    if window is not None and (window[0] < -1 or window[1] < -1):
        return None
    c, a, w = canonical_mask(sq, skv, kvm is not None, bool(causal), align, window)
    return (tag, bucket(b), hq, hkv, bucket(sq), bucket(skv), d, dv, q.dtype, k.dtype, v.dtype, q.device,
            k.device, v.device, c, a, w, scale, approx, grad, kvm, _numerics(q))


def _reuse(sig, fam: Optional[tuple], q, k) -> Optional[Slot]:
    """A slot for a never-seen exact shape from its family's plan, or None (then the slow path decides).

    A family-generic slot (:meth:`~attntune.kernels.base.Variant.family_generic`: decode) is itself stored
    under the new signature — a dict store, nothing built. Otherwise the problem model is built once (a
    copy of the family's with the new batch and lengths), the variant asked whether it takes the exact
    shape, and a slot made for it. No index look-up, no database, no policy."""
    if fam is None:
        return None
    t = FAMILIES.get(fam)
    if t is None:
        return None
    rt = _runtime.get()
    if t.generic and not rt.config.lengths_too_long(q.shape[2], k.shape[2]):
        return _put_once(sig, t)
    problem = t.problem.resized(q.shape[0], q.shape[2], k.shape[2])
    if rt.reuse_reasons(t.plan, problem):
        return None
    return _put_once(sig, Slot(t.plan, t.plan.impl.bind(problem, t.config), problem, t.config, t.every, t.device,
                               miss=t.miss))


def _remember(fam: Optional[tuple], slot: Slot) -> None:
    """Let other shapes of ``slot``'s family reuse its plan (fallbacks are decided per problem)."""
    if fam is not None and slot.plan is not None and slot.plan.source != "fallback":
        FAMILIES[fam] = slot


def _new_slot(sig, fam: Optional[tuple], q, k, make_problem) -> Slot:
    """The slot of a never-seen signature: the family's plan when it takes the shape, else a plan
    resolved for ``make_problem()`` (under the runtime lock) and remembered for the family."""
    slot = _reuse(sig, fam, q, k)
    if slot is not None:
        return slot
    return resolved_slot(sig, make_problem(), q.device, fam)


def resolved_slot(sig, problem: AttentionProblem, device, fam: Optional[tuple] = None) -> Slot:
    """The slot of ``sig`` with a plan resolved for ``problem`` under the runtime lock (unless another
    thread stored one meanwhile), remembered for ``fam``'s other shapes."""
    rt = _runtime.get()
    with rt.lock:
        slot = SLOTS.get(sig)
        if slot is None:
            plan, fresh = rt.resolve(problem, device)
            slot = _store(rt, sig, plan, fresh, device)
            _remember(fam, slot)
    return slot


def _validate_empty(q, k, v, kv_lens) -> None:
    """The checks of a call with an empty dimension (it needs no plan, but its inputs must still fit)."""
    validate_qkv(q, k, v, kv_lens)
    check_head_dim(q)


def check_head_dim(q) -> None:
    if q.shape[3] == 0:
        raise ValueError("q: head_dim must be >= 1 (the softmax scale 1/sqrt(head_dim) is undefined)")


def empty_has_no_plan(q, k, v) -> ValueError:
    """explain()'s answer for a call with an empty dimension."""
    return ValueError(f"q/k/v: an empty dimension (q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}): "
                      "attention() returns zeros of the output's shape for such calls, without any plan")


def _empty(q, k, v, _problem, _config, _kv_lens) -> Tensor:
    """The result of a call with nothing to compute: every row admits no key (``Skv == 0``) or there
    are no rows, heads or value features — zeros of the output's shape, as the docstring of attention().
    When an input requires grad the zeros come from ``(q @ kᵀ) @ v``, whose contraction over the empty
    axis is exactly 0 whatever q holds, so ``.backward()`` works (zero gradients) as with torch's SDPA."""
    shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)) \
            or k.dtype != q.dtype or v.dtype != q.dtype:
        return q.new_zeros(shape)
    if k.shape[1] and q.shape[1] != k.shape[1]:  # GQA (Hq == 0 too: repeated 0 times)
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return torch.matmul(torch.matmul(q, k.transpose(-2, -1)), v)


def _attention_slot(sig, q, k, v, kv_lens, causal, window, scale, approx, grad) -> Slot:
    if any(isinstance(t, Tensor) and t.is_nested for t in (q, k, v)):
        validate_qkv(q, k, v, kv_lens)  # refuses them, naming the argument (their ragged sizes are symbolic)
    if isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor) and (
            0 in q.shape or 0 in k.shape or 0 in v.shape):
        _validate_empty(q, k, v, kv_lens)
        return _put_once(sig, Slot(None, _empty, None, None, 0, q.device))
    fam = _family_sig("attention", q, k, v, kv_lens, causal, "bottom_right", window, scale, approx, grad)
    return _new_slot(sig, fam, q, k,
                     lambda: _problem(q, k, v, kv_lens, causal, "bottom_right", window, scale, approx, grad))


def _dropin_ok(q, k, v, enable_gqa: bool) -> bool:
    """True when the drop-in's inputs are inside what attntune computes with torch's semantics."""
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)):
        return False
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or q.is_nested or k.is_nested or v.is_nested:
        return False
    if q.dtype not in DTYPE_NAMES or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    if k.device != q.device or v.device != q.device or q.device.type not in ("cpu", "cuda"):
        return False
    b, hq, _, d = q.shape
    _, hk, skv, _ = k.shape
    if k.shape[0] != b or v.shape[0] != b or k.shape[3] != d or v.shape[1] != hk or v.shape[2] != skv:
        return False  # torch broadcasts batch dims; we do not: let torch do it
    if 0 in q.shape or 0 in k.shape or 0 in v.shape:
        return False  # empty batch, heads, lengths or head dims: torch's own result, exactly
    return hq == hk or (bool(enable_gqa) and hq % hk == 0)


def _dropin_slot(sig, q, k, v, is_causal, scale, enable_gqa, grad) -> Slot:
    rt = _runtime.get()
    if rt.config.disabled or not _dropin_ok(q, k, v, enable_gqa) or not isinstance(is_causal, bool) \
            or not (scale is None or isinstance(scale, (int, float)) and math.isfinite(scale)):
        # what attntune.attention refuses (a non-finite scale, odd types) the drop-in hands to torch as is
        causal_, scale_, gqa_ = is_causal, scale, enable_gqa

        def passthrough(q, k, v, _problem, _config, _kv_lens):
            return _torch_sdpa(q, k, v, None, 0.0, causal_, scale=scale_, enable_gqa=gqa_)

        slot = _put_once(sig, Slot(None, passthrough, None, None, 0, q.device if isinstance(q, Tensor) else None))
        return slot
    fam = _family_sig(("sdpa", bool(enable_gqa)), q, k, v, None, is_causal, "top_left", None, scale, False,
                      grad)
    return _new_slot(sig, fam, q, k,
                     lambda: _problem(q, k, v, None, is_causal, "top_left", None, scale, False, grad))


# ---- failures and sampling (off the common path) ----------------------------------------------------
def _failed(sig, slot: Slot, error: Exception, q, k, v, kv_lens, *scales) -> Tensor:
    """A planned call that raised: quarantine its variant and serve the call (and the signature's later
    ones) from the safe fallback. ``scales``: an FP8 call's ``k_scale, v_scale``, passed on to every run."""
    plan = slot.plan
    if plan is None or plan.source == "fallback":
        raise error  # torch's own SDPA / the safe fallback failed: a real error, not ours to hide
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        raise error  # not the kernel's fault, and the fallback (eager: O(S^2)) would need more memory
    rt = _runtime.get()
    # a family-generic slot's problem is its family's first shape: the fallback needs this call's
    problem = slot.problem.resized(q.shape[0], q.shape[2], k.shape[2]) if slot.generic else slot.problem
    if _in_transform():
        return _failed_in_transform(plan, problem, error, q, k, v, kv_lens, scales)
    # Possibly the arguments' fault, not the variant's: values the signature cannot see, or inputs torch
    # itself refuses (an inference-mode tensor in autograd) — any error type. The safe fallback decides: if it
    # refuses the call too, the caller gets the error and nothing is quarantined (one bad call must not send
    # every later call of the process to a slower implementation).
    fb = fallback_plan(problem, plan.key, [], rt.quarantine)
    # the failing plan *is* the safe fallback's choice (torch's own SDPA): the next one is tried for this call
    torch_own = (fb.variant, fb.config_json) == (plan.variant, plan.config_json)
    if torch_own:
        fb = fallback_plan(problem, plan.key, [], rt.quarantine | {(plan.variant, plan.config_json)})
    try:
        out = fb.impl.run(q, k, v, fb.problem, fb.config, kv_lens, *scales)
    except Exception:  # noqa: BLE001 — the arguments' fault: the variant's error is the clearer one
        raise error from None
    if torch_own:
        # Never quarantined: torch's SDPA failing on one call (a backend the user switched off with
        # sdpa_kernel, a torch bug at one shape) says nothing of the process's other calls, and eager — the
        # only alternative — is O(S^2) in memory and many times slower. The call is served; said once.
        rt.warn_once(f"torch-sdpa-failed:{type(error).__name__}",
                     f"torch SDPA failed on {problem.short()} ({type(error).__name__}: "
                     f"{str(error).splitlines()[0] if str(error) else ''}); that call was served by "
                     f"{fb.variant} (later calls try torch SDPA again)")
        return out
    fb = rt.quarantine_plan(plan, error, problem)
    with rt.lock:
        new = Slot(fb, fb.impl.run, fb.problem, fb.config, slot.every, slot.device, slot.miss, slot.reported)
        new.calls = slot.calls
        new.samples = slot.samples
        SLOTS[sig] = new
    return out


def _in_transform() -> bool:
    """True inside a torch.func transform (vmap, grad, jvp, jacrev, ...) or a forward-mode AD level."""
    return torch._C._functorch.peek_interpreter_stack() is not None or _fwad._current_level >= 0


def _failed_in_transform(plan: Plan, problem, error: Exception, q, k, v, kv_lens, scales) -> Tensor:
    """A planned call that raised under a torch.func transform or forward-mode AD. Such a failure is the
    transform's (torch's CPU flash kernel has no forward-AD formula; the mask builder writes in place and
    cannot take a vmapped ``kv_lens``), not the variant's: quarantining it would send every later plain call
    of the process to the fallback. This call alone is served by the safe fallback without the failed
    variant; nothing is quarantined. If that fails too, the error says what is unsupported."""
    rt = _runtime.get()
    fb = fallback_plan(problem, plan.key, [], rt.quarantine | {(plan.variant, plan.config_json)})
    try:
        return fb.impl.run(q, k, v, fb.problem, fb.config, kv_lens, *scales)
    except Exception as e2:  # noqa: BLE001
        hint = ""
        if kv_lens is not None and torch._C._functorch.is_batchedtensor(kv_lens):
            hint = ("kv_lens: batched by vmap together with a causal mask or a window is not supported (the "
                    "mask's per-sequence diagonal is written in place, which vmap cannot batch); pass kv_lens "
                    "unbatched (in_dims=None) or loop over that dimension. ")
        raise NotImplementedError(
            f"{hint}attntune.attention under a torch.func transform or forward-mode AD: {plan.variant} raised "
            f"{type(error).__name__}: {error}; the fallback {fb.variant} raised {type(e2).__name__}: {e2}") from error


def _sampled(sig, slot: Slot, q, k, v, kv_lens) -> Tensor:
    """Run one call and time it: CUDA events on a GPU (read later, in stats(), never synchronised
    here), a host clock on the CPU. Skipped while a CUDA graph is being captured."""
    dev = slot.device
    if dev is not None and dev.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return _run_slot(sig, slot, q, k, v, kv_lens)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        out = _run_slot(sig, slot, q, k, v, kv_lens)
        end.record()
        if slot.events is None:
            slot.events = []
        slot.events.append((start, end))
        if len(slot.events) >= 64:
            _drain_events(slot, block=False)
        return out
    t0 = time.perf_counter()
    out = _run_slot(sig, slot, q, k, v, kv_lens)
    _samples(slot).append((time.perf_counter() - t0) * 1e3)
    return out


def _samples(slot: Slot) -> deque:
    if slot.samples is None:
        slot.samples = deque(maxlen=_runtime.MAX_SAMPLES)
    return slot.samples


def _drain_events(slot: Slot, block: bool) -> None:
    """Move finished CUDA event pairs into ``slot.samples`` (``block``: wait for the last ones)."""
    keep = []
    for start, end in slot.events:
        if block:
            end.synchronize()
        if end.query():
            _samples(slot).append(start.elapsed_time(end))
        else:
            keep.append((start, end))
    slot.events = keep


def _run_slot(sig, slot: Slot, q, k, v, kv_lens) -> Tensor:
    try:
        return slot.fn(q, k, v, slot.problem, slot.config, kv_lens)
    except Exception as e:  # noqa: BLE001
        return _failed(sig, slot, e, q, k, v, kv_lens)


# ---- torch.compile: the custom op -------------------------------------------------------------------
def _compiled(q, k, v, kv_lens, causal, top_left: bool, window, scale, approx) -> Tensor:
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    wl, wr = window if window is not None else (NO_WINDOW, NO_WINDOW)
    scale = None if scale is None else float(scale)
    approx = -1 if approx is None else int(bool(approx))
    if grad:  # a training call: the op that keeps the forward's residuals for its backward
        return torch.ops.attntune.attention_train(q, k, v, kv_lens, bool(causal), top_left, wl, wr, scale, approx)[0]
    return torch.ops.attntune.attention(q, k, v, kv_lens, bool(causal), top_left, wl, wr, scale, approx, False)


def _op_slot(q, k, v, kv_lens, causal, top_left, wl, wr, scale, approx, grad) -> Tuple[tuple, Slot]:
    window = None if wl == NO_WINDOW else (wl, wr)
    appr = None if approx < 0 else bool(approx)
    sig = (_OP, q.shape, k.shape, v.shape, q.dtype, q.device, causal, top_left, window, scale, appr, grad,
           None if kv_lens is None else (kv_lens.shape, kv_lens.dtype), _numerics(q))
    slot = _get(sig)
    if slot is None and (0 in q.shape or 0 in k.shape or 0 in v.shape):  # as attention() in eager mode
        _validate_empty(q, k, v, kv_lens)
        slot = _put_once(sig, Slot(None, _empty, None, None, 0, q.device))
    if slot is None:
        align = "top_left" if top_left else "bottom_right"
        fam = _family_sig(_OP, q, k, v, kv_lens, causal, align, window, scale, appr, grad)
        slot = _new_slot(sig, fam, q, k,
                         lambda: _problem(q, k, v, kv_lens, causal, align, window, scale, appr, grad))
        if slot.plan is not None and not slot.plan.impl.runs_in_compiled_op:
            slot = _op_safe_slot(sig, fam, slot)
    return sig, slot


def _op_safe_slot(sig, fam: Optional[tuple], slot: Slot) -> Slot:
    """``slot`` (just made for an op signature) re-planned without the variants that cannot run inside
    the op (:attr:`~attntune.kernels.base.Variant.runs_in_compiled_op`: Flex): the plan decided as if
    they were quarantined — for this op signature and its family only; eager calls of the same problem
    keep theirs. Nothing is warned: the op is not failing, it routes around a variant it cannot host."""
    rt = _runtime.get()
    with rt.lock:
        plan, excluded = slot.plan, set()
        while not plan.impl.runs_in_compiled_op:
            tag = (plan.variant, plan.config_json)
            if tag in excluded:  # a policy that ignores the exclusion (fixed): torch SDPA / eager
                plan = fallback_plan(slot.problem, plan.key, [f"{plan.variant} cannot run inside the compiled op"],
                                     frozenset(rt.quarantine | excluded))
                break
            excluded.add(tag)
            plan = rt.resolve_excluding(slot.problem, slot.device, excluded)
        new = _store(rt, sig, plan, False, slot.device)
        if fam is not None and FAMILIES.get(fam) is slot:
            del FAMILIES[fam]
        _remember(fam, new)
    return new


# The compiled ops' tensors follow their inputs' layout: a model's q/k/v are usually [B, S, H, D] tensors
# viewed as [B, H, S, D] (transposed), and its next step (transpose back, reshape, projection) reads the
# output in that layout too. Contiguous [B, H, S, D] outputs cost a copy inside the op (SDPA's kernels write
# q's layout) and another after it, per output and per gradient. Two layouts, chosen by one rule that the
# fake registrations and the implementations both apply to the same input strides, so they always agree.
def _heads_inner(ref: Tensor) -> bool:
    """True when ``ref [B, H, S, X]`` keeps its heads inside its sequence positions ([B, S, H, X] memory)."""
    return ref.stride(1) < ref.stride(2)


def _empty_like_layout(ref: Tensor, shape, dtype=None) -> Tensor:
    """An empty ``shape`` ([B, H, S, X]) tensor in ``ref``'s layout (see :func:`_heads_inner`)."""
    dtype = ref.dtype if dtype is None else dtype
    if _heads_inner(ref):
        return ref.new_empty((shape[0], shape[2], shape[1], shape[3]), dtype=dtype).transpose(1, 2)
    return ref.new_empty(shape, dtype=dtype)


def _in_layout(t: Tensor, ref: Tensor) -> Tensor:
    """``t`` ([B, H, S, X]) with the strides :func:`_empty_like_layout` gives ``ref``'s layout (those of the
    fake registrations, which a compiled graph asserts) wherever a dimension has more than one element —
    a size-1 dimension's stride is never used to index (a decode call's one query row), and inductor does not
    check it: itself when it has them, else a copy."""
    B, H, S, X = t.shape
    want = (S * H * X, X, H * X, 1) if _heads_inner(ref) else (H * S * X, S * X, X, 1)
    if all(n == 1 or st == w for n, st, w in zip(t.shape, t.stride(), want)):
        return t
    return _empty_like_layout(ref, t.shape, t.dtype).copy_(t)


@torch.library.custom_op("attntune::attention", mutates_args=())
def _attention_op(q: Tensor, k: Tensor, v: Tensor, kv_lens: Optional[Tensor], causal: bool, top_left: bool,
                  window_left: int, window_right: int, scale: Optional[float], approx: int,
                  needs_grad: bool) -> Tensor:
    """``attention`` as one opaque op: the plan is resolved here, at run time, from the real tensors.
    ``window_left == -2`` means no window; ``approx`` -1/0/1 = environment/no/yes. Returns ``[B, Hq, Sq, Dv]``
    in q's layout (:func:`_in_layout`: what the fake registration promises)."""
    sig, slot = _op_slot(q, k, v, kv_lens, causal, top_left, window_left, window_right, scale, approx, needs_grad)
    if kv_lens is not None and _runtime.CHECK:
        check_kv_lens(kv_lens, k.shape[2])
    slot.calls += 1
    return _in_layout(_run_slot(sig, slot, q, k, v, kv_lens), q)


@_attention_op.register_fake
def _attention_fake(q, k, v, kv_lens, causal, top_left, window_left, window_right, scale, approx, needs_grad):
    validate_qkv(q, k, v, kv_lens)
    return _out_fake(q, v)


def _out_fake(q, v) -> Tensor:
    """The compiled ops' output ``[B, Hq, Sq, Dv]`` in q's layout (fake registrations)."""
    return _empty_like_layout(q, (q.shape[0], q.shape[1], q.shape[2], v.shape[3]))


def _grads_fake(q, k, v) -> Tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of the compiled backward ops, each in its input's layout (fake registrations)."""
    return tuple(_empty_like_layout(t, t.shape) for t in (q, k, v))


@torch.library.custom_op("attntune::attention_backward", mutates_args=())
def _attention_backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, kv_lens: Optional[Tensor],
                           causal: bool, top_left: bool, window_left: int, window_right: int,
                           scale: Optional[float], approx: int) -> Tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of :func:`_attention_op` by recomputing its forward with the same plan (resolved for
    ``mode="fwd_bwd"``) under ``enable_grad`` and differentiating it."""
    sig, slot = _op_slot(q, k, v, kv_lens, causal, top_left, window_left, window_right, scale, approx, True)
    return _recompute_grads(sig, slot, grad_out, q, k, v, kv_lens)


def _recompute_grads(sig, slot: Slot, grad_out, q, k, v, kv_lens) -> Tuple[Tensor, Tensor, Tensor]:
    with _autograd_reenabled(), torch.enable_grad():
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
        out = _run_slot(sig, slot, qg, kg, vg, kv_lens)
        grads = torch.autograd.grad(out, (qg, kg, vg), grad_out, allow_unused=True)
    return tuple(_in_layout(torch.zeros_like(t) if g is None else g, t) for g, t in zip(grads, (q, k, v)))


@_attention_backward_op.register_fake
def _attention_backward_fake(grad_out, q, k, v, kv_lens, causal, top_left, window_left, window_right, scale,
                             approx):
    return _grads_fake(q, k, v)


@contextmanager
def _autograd_reenabled() -> Iterator[None]:
    """An op's implementation runs below the autograd dispatch keys (they are excluded in TLS), so
    nothing recorded there would have a ``grad_fn``. Re-include them for the recompute of the
    backward op; restored on exit."""
    DK = torch._C.DispatchKey
    with torch._C._SetExcludeDispatchKeyGuard(DK.AutogradFunctionality, False), \
            torch._C._SetExcludeDispatchKeyGuard(DK.ADInplaceOrView, False):
        yield


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, kv_lens, causal, top_left, wl, wr, scale, approx, _needs_grad = inputs
    ctx.save_for_backward(q, k, v, kv_lens)
    ctx.args = (causal, top_left, wl, wr, scale, approx)


def _backward(ctx, grad_out):
    q, k, v, kv_lens = ctx.saved_tensors
    dq, dk, dv = torch.ops.attntune.attention_backward(_in_layout(grad_out, q), q, k, v, kv_lens, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


# A training call under torch.compile. ``attntune::attention``'s backward can only recompute the forward
# (its variant is a black box behind the op), one more forward per step; this op returns the residuals of a
# variant that splits its forward from its backward (Variant.forward_saving: the flash kernels' row LSE)
# with the output, and its backward runs that variant's backward from them.
def _splitting(slot: Slot):
    """The slot's variant when it may split its forward from its backward, else None."""
    impl = None if slot.plan is None else slot.plan.impl
    if impl is None or type(impl).forward_saving is _Variant.forward_saving or impl.name in _runtime.get().no_split:
        return None
    return impl


@torch.library.custom_op("attntune::attention_train", mutates_args=())
def _attention_train_op(q: Tensor, k: Tensor, v: Tensor, kv_lens: Optional[Tensor], causal: bool, top_left: bool,
                        window_left: int, window_right: int, scale: Optional[float],
                        approx: int) -> Tuple[Tensor, Tensor]:
    """``(out, lse)``: ``out`` as ``attntune::attention`` (contiguous ``[B, Hq, Sq, Dv]``) for a call that
    needs gradients; ``lse [B, Hq, Sq]`` float32, the row log-sum-exp the plan's variant kept for its
    backward (:meth:`Variant.forward_saving`), or NaN where it keeps none — its backward then recomputes
    the forward. (NaN, not zeros: residuals read by another plan's backward — only possible when
    ``attntune.reset()`` runs between a forward and its backward — give NaN gradients, never silently
    wrong ones.)"""
    sig, slot = _op_slot(q, k, v, kv_lens, causal, top_left, window_left, window_right, scale, approx, True)
    if kv_lens is not None and _runtime.CHECK:
        check_kv_lens(kv_lens, k.shape[2])
    slot.calls += 1
    impl = _splitting(slot)
    if impl is not None:
        try:
            saved = impl.forward_saving(q, k, v, slot.problem, slot.config, kv_lens)
        except Exception as e:  # noqa: BLE001 — as _run_slot: the fallback serves, the variant is quarantined
            return _in_layout(_failed(sig, slot, e, q, k, v, kv_lens), q), _no_residuals(q)
        if saved is not None:
            return _in_layout(saved[0], q), saved[1]
    return _in_layout(_run_slot(sig, slot, q, k, v, kv_lens), q), _no_residuals(q)


def _no_residuals(q: Tensor) -> Tensor:
    return torch.full(q.shape[:3], math.nan, device=q.device, dtype=torch.float32)


@_attention_train_op.register_fake
def _attention_train_fake(q, k, v, kv_lens, causal, top_left, window_left, window_right, scale, approx):
    validate_qkv(q, k, v, kv_lens)
    return _out_fake(q, v), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("attntune::attention_train_backward", mutates_args=())
def _attention_train_backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, kv_lens: Optional[Tensor],
                                 out: Tensor, lse: Tensor, causal: bool, top_left: bool, window_left: int,
                                 window_right: int, scale: Optional[float],
                                 approx: int) -> Tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of :func:`_attention_train_op`: the variant's own backward from the kept ``(out, lse)``
    (:meth:`Variant.backward_saved`) where its forward kept them, else the forward recomputed and
    differentiated, as ``attntune::attention_backward`` does."""
    sig, slot = _op_slot(q, k, v, kv_lens, causal, top_left, window_left, window_right, scale, approx, True)
    impl = _splitting(slot)
    if impl is not None:
        try:
            grads = impl.backward_saved(grad_out, q, k, v, out, lse, slot.problem, slot.config, kv_lens)
        except Exception as e:  # noqa: BLE001 — the recompute below still serves; this variant splits no more
            rt = _runtime.get()
            rt.no_split.add(impl.name)
            rt.warn_once(f"split-backward:{impl.name}",
                         f"{impl.name}'s backward from its kept residuals failed under torch.compile "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); its compiled "
                         "training calls recompute the forward instead (one more forward a step)")
            grads = None
        if grads is not None:
            return tuple(_in_layout(g, t) for g, t in zip(grads, (q, k, v)))
    return _recompute_grads(sig, slot, grad_out, q, k, v, kv_lens)


@_attention_train_backward_op.register_fake
def _attention_train_backward_fake(grad_out, q, k, v, kv_lens, out, lse, causal, top_left, window_left,
                                   window_right, scale, approx):
    return _grads_fake(q, k, v)


def _train_setup_context(ctx, inputs, output) -> None:
    q, k, v, kv_lens, causal, top_left, wl, wr, scale, approx = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, kv_lens, out, lse)
    ctx.args = (causal, top_left, wl, wr, scale, approx)


def _train_backward(ctx, grad_out, _grad_lse):
    q, k, v, kv_lens, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.attntune.attention_train_backward(_in_layout(grad_out, q), q, k, v, kv_lens, out, lse,
                                                             *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


_attention_train_op.register_autograd(_train_backward, setup_context=_train_setup_context)


# ---- patching torch.nn.functional.scaled_dot_product_attention --------------------------------------
_PATCH_LOCK = threading.Lock()
_depth = 0
_saved = None  # what F.scaled_dot_product_attention was when the outermost enable() patched it
_guard = threading.local()


def _patched_sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                  dropout_p: float = 0.0, is_causal: bool = False, *, scale: Optional[float] = None,
                  enable_gqa: bool = False) -> Tensor:
    """What ``F.scaled_dot_product_attention`` is while patched: the drop-in, except that an SDPA call
    made *by* a variant (re-entry on the same thread) goes to torch's own SDPA — no recursion."""
    if _is_compiling():
        return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                            enable_gqa=enable_gqa)
    if getattr(_guard, "active", False):
        return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    _guard.active = True
    try:
        return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                            enable_gqa=enable_gqa)
    finally:
        _guard.active = False


def _torchscript_sees_torchs() -> None:
    """TorchScript compiles what ``F.scaled_dot_product_attention`` names when a module is scripted: while
    patched, that was :func:`_patched_sdpa`, which it cannot compile (a ``try`` block) — ``torch.jit.script``
    of a stock ``nn.MultiheadAttention`` inside ``dispatch()`` failed, and the failure left TorchScript's
    compilation unit broken for the process. Registered as the builtin of torch's own op, scripted code
    calls ``aten::scaled_dot_product_attention`` (torch's SDPA: a scripted module runs without Python, so
    without attntune, and saves as usual). Best effort: a torch without this table scripts as before."""
    try:
        from torch.jit import _builtins

        _builtins._register_builtin(_patched_sdpa, "aten::scaled_dot_product_attention")
    except Exception:  # noqa: BLE001 — a private table: its absence must not break dispatch()
        pass


_torchscript_sees_torchs()  # once: the patch function never changes


def enable() -> None:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` through attntune until the matching
    :func:`disable`. Re-entrant (a depth counter) and thread-safe; the patch is process-wide, so it
    affects every thread. Code that bound the function earlier (``from torch.nn.functional import
    scaled_dot_product_attention``) keeps torch's; TorchScript compiles torch's own op in its place."""
    global _depth, _saved
    with _PATCH_LOCK:
        if _depth == 0:
            current = F.scaled_dot_product_attention
            _saved = _torch_sdpa if current is _patched_sdpa else current
            F.scaled_dot_product_attention = _patched_sdpa
        _depth += 1


def disable() -> None:
    """Undo one :func:`enable`; the outermost restores what was there before. Extra calls are no-ops."""
    global _depth, _saved
    with _PATCH_LOCK:
        if _depth == 0:
            return
        _depth -= 1
        if _depth == 0:
            F.scaled_dot_product_attention = _saved if _saved is not None else _torch_sdpa
            _saved = None


def is_enabled() -> bool:
    return _depth > 0


@contextmanager
def dispatch() -> Iterator[None]:
    """``with attntune.dispatch(): model(x)`` — F.sdpa goes through attntune inside the block."""
    enable()
    try:
        yield
    finally:
        disable()


def original_sdpa():
    """torch's own ``scaled_dot_product_attention`` (never the patch)."""
    return _torch_sdpa


__all__: Sequence[str] = ("attention", "scaled_dot_product_attention", "explain", "enable", "disable",
                          "dispatch", "is_enabled", "original_sdpa")
