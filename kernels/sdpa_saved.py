"""torch SDPA's forward and backward as two plain calls, for the compiled training op.

Under ``torch.compile`` a training call is ``attntune::attention_train``, an opaque op whose backward is a
second op (:mod:`attntune.policies.dispatch`). A variant that cannot hand its forward's residuals to that
backward pays one more forward per step: its backward recomputes the forward under autograd. For the SDPA
variants that was every dense training key left to SDPA (untuned bf16/fp16 causal training goes to
``sdpa_default``), so a compiled training step through attntune ran one attention forward more than the same
step through torch's SDPA, which dynamo splits through aten's fused ops.

This module calls those same aten ops: the fused backend's forward returns the output and the row
log-sum-exp, its backward op takes them back. The residual crosses the op boundary in the variant contract's
canonical form (:meth:`~attntune.kernels.base.Variant.forward_saving`): ``lse [B, Hq, Sq]`` float32,
contiguous, natural log. Each backend's own layout is converted at its edge:

==========================  ===========================================  =======================================
backend (aten op)           LSE as the forward returns it                to its backward
==========================  ===========================================  =======================================
flash (CUDA)                ``[B, H, Sq]``                               as is
memory-efficient (CUDA)     ``[B, H, ceil(Sq/32)*32]`` (padded rows)     zero-padded back to that width
cuDNN (CUDA)                ``[B, H, Sq, 1]``                            ``unsqueeze(-1)``
flash (CPU)                 ``[B, H, Sq]`` with ``[B, Sq, H]`` strides   contiguous (the kernel takes strides)
==========================  ===========================================  =======================================

Since the residual is canonical, a backward whose backend differs from its forward's (torch's backend flags
switched between the two) is still correct. Which calls split (everything else returns None and recomputes,
exactly as before):

* no materialised mask (none, or causal that ``is_causal`` expresses), no ``kv_lens``, equal head dims;
* the backend the variant runs: its forced one (while the process allows it), or for ``sdpa_default``
  ``torch._fused_sdp_choice`` — the function torch's SDPA calls to pick — with the same arguments; the math
  backend (composite ops) and decode-sized queries on GPUs (``sdpa_default`` runs them without cuDNN) are
  not split;
* CUDA and CPU builds of torch; on ROCm the residual layouts of AOTriton's kernels are unverified (we have no
  AMD GPU), so ROCm recomputes.

GQA: a variant that passes ``enable_gqa`` (``native_gqa``) hands the aten op K/V with fewer heads, as torch's
SDPA does (the flash kernels take them and return dK/dV per kv head); the others expand K/V, as their
``run`` does, and the backward sums dK/dV over each group. Dropout is never used (attntune has none), so the
random-state tensors the backward ops take are placeholders.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from attntune.kernels.masks import needs_mask
from attntune.kernels.reference import expand_kv
from attntune.problem import DECODE_MAX_SQ, AttentionProblem

_aten = torch.ops.aten
_EFFICIENT_LSE_ALIGN = 32  # the memory-efficient kernel's LSE rows are padded to this multiple


def _no_rng() -> torch.Tensor:
    # what the memory-efficient forward itself returns for its philox seed/offset without dropout (the flash
    # backward takes it too: never read without dropout)
    return torch.empty((), dtype=torch.int64)


_DEVICE_RNG: Dict[torch.device, torch.Tensor] = {}


def _no_rng_on(device: torch.device) -> torch.Tensor:
    """A placeholder seed/offset on ``device`` (cuDNN's backward checks that every tensor argument shares the
    inputs' device; H100, torch 2.11), made once per device so that a captured backward never allocates."""
    t = _DEVICE_RNG.get(device)
    if t is None:
        t = _DEVICE_RNG.setdefault(device, torch.zeros((), dtype=torch.int64, device=device))
    return t


def _flash_fwd(q, k, v, causal: bool, scale: Optional[float]):
    r = _aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return r[0], r[1]


def _flash_bwd(do, q, k, v, o, lse, causal: bool, scale: Optional[float]):
    return _aten._scaled_dot_product_flash_attention_backward(
        do, q, k, v, o, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, _no_rng(), _no_rng(), scale=scale)


def _efficient_fwd(q, k, v, causal: bool, scale: Optional[float]):
    r = _aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)
    return r[0], r[1][:, :, :q.shape[2]]


def _efficient_bwd(do, q, k, v, o, lse, causal: bool, scale: Optional[float]):
    lse = F.pad(lse, (0, -q.shape[2] % _EFFICIENT_LSE_ALIGN))
    # The kernel reads O with the row stride of the layout its forward wrote, [B, Sq, H, Dv] contiguous
    # (H * Dv), whatever strides O comes with: O in [B, H, Sq, Dv] layout gave wrong dQ (H100, torch 2.11).
    o = o.transpose(1, 2).contiguous().transpose(1, 2)
    r = _aten._scaled_dot_product_efficient_attention_backward(
        do, q, k, v, None, o, lse, _no_rng(), _no_rng(), 0.0, [True, True, True, False], causal, scale=scale)
    return r[0], r[1], r[2]


def _cudnn_fwd(q, k, v, causal: bool, scale: Optional[float]):
    r = _aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
    return r[0], r[1].reshape(q.shape[:3])


def _cudnn_bwd(do, q, k, v, o, lse, causal: bool, scale: Optional[float]):
    rng = _no_rng_on(q.device)
    return _aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, o, lse.unsqueeze(-1), rng, rng, None, None, None, q.shape[2], k.shape[2], 0.0, causal,
        scale=scale)


def _cpu_flash_fwd(q, k, v, causal: bool, scale: Optional[float]):
    return _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def _cpu_flash_bwd(do, q, k, v, o, lse, causal: bool, scale: Optional[float]):
    return _aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, causal, scale=scale)


class _Pair(NamedTuple):
    forward: Callable
    backward: Callable


#: (device type, backend) -> the aten forward/backward pair; only ops this torch has
_PAIRS: Dict[Tuple[str, SDPBackend], _Pair] = {
    key: _Pair(fwd, bwd)
    for key, fwd, bwd, op in (
        (("cuda", SDPBackend.FLASH_ATTENTION), _flash_fwd, _flash_bwd, "_scaled_dot_product_flash_attention"),
        (("cuda", SDPBackend.EFFICIENT_ATTENTION), _efficient_fwd, _efficient_bwd,
         "_scaled_dot_product_efficient_attention"),
        (("cuda", SDPBackend.CUDNN_ATTENTION), _cudnn_fwd, _cudnn_bwd, "_scaled_dot_product_cudnn_attention"),
        (("cpu", SDPBackend.FLASH_ATTENTION), _cpu_flash_fwd, _cpu_flash_bwd,
         "_scaled_dot_product_flash_attention_for_cpu"),
    )
    if hasattr(_aten, op) and hasattr(_aten, op + "_backward")
}


def _pair(backend: Optional[SDPBackend], q, k, v, problem: AttentionProblem, gqa: bool) -> Optional[_Pair]:
    """The aten pair that runs ``problem`` on these tensors with ``backend`` (None: torch's own choice), or
    None (recompute)."""
    if needs_mask(problem) or problem.kv_lens or problem.head_dim != problem.head_dim_v or torch.version.hip:
        return None
    if backend is None:
        if q.is_cuda and problem.seqlen_q <= DECODE_MAX_SQ:
            return None  # sdpa_default runs these without cuDNN (switched flags): not what the choice says
        try:
            backend = SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, problem.causal, scale=problem.scale,
                                                         enable_gqa=gqa))
        except (RuntimeError, ValueError, TypeError, AttributeError):  # no kernel, or an older torch's API
            return None
    return _PAIRS.get((q.device.type, backend))


def _split(backend: Optional[SDPBackend], native_gqa: bool, q, k, v, problem: AttentionProblem):
    """``(pair, k, v)``: the aten pair and K/V as the variant's run() hands them to torch (expanded unless it
    passes ``enable_gqa``), or None. The pair is found first: only a forced backend ever expands, and its
    choice needs no tensors."""
    pair = _pair(backend, q, k, v, problem, problem.group > 1 and native_gqa)
    if pair is None:
        return None
    if problem.group > 1 and not native_gqa:
        k, v = expand_kv(k, v, problem.group)
    return pair, k, v


def forward_saving(backend: Optional[SDPBackend], native_gqa: bool, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, problem: AttentionProblem
                   ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``(out [B, Hq, Sq, Dv], lse [B, Hq, Sq] float32 contiguous, natural log)`` of an SDPA variant's
    ``run`` for a training call — ``backend`` its forced backend or None (torch's choice), ``native_gqa``
    whether it passes ``enable_gqa`` — without autograd; None where this module does not split the call
    (module docstring)."""
    split = _split(backend, native_gqa, q, k, v, problem)
    if split is None:
        return None
    pair, ke, ve = split
    out, lse = pair.forward(q, ke, ve, problem.causal, problem.scale)
    return out, lse.float().contiguous()


def backward_saved(backend: Optional[SDPBackend], native_gqa: bool, do: torch.Tensor, q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, problem: AttentionProblem
                   ) -> Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """dq, dk, dv (the inputs' shapes) from :func:`forward_saving`'s ``(out, lse)``; None where it splits
    nothing. dK/dV of expanded K/V are summed over each GQA group."""
    split = _split(backend, native_gqa, q, k, v, problem)
    if split is None:
        return None
    pair, ke, ve = split
    dq, dk, dv = pair.backward(do.contiguous(), q, ke, ve, out, lse, problem.causal, problem.scale)
    if dk.shape[1] != k.shape[1]:  # expanded heads: query head h read kv head h // group
        B, _, S, D = dk.shape
        dk = dk.view(B, k.shape[1], problem.group, S, D).sum(2)
        dv = dv.view(B, v.shape[1], problem.group, S, dv.shape[-1]).sum(2)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


__all__ = ["forward_saving", "backward_saved"]
