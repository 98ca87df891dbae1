"""Training with the Gluon forward: its output and row LSE, then ``triton_flash``'s backward kernels from them.

The Gluon forward returns exactly what the Triton forward saves for its backward — ``o [B, Hq, Sq, D]`` and
``lse [B, Hq, Sq]`` float32, natural log, ``-inf`` for a row that admits no key (:func:`.launch.forward`) — so the
backward (:func:`attntune.kernels.triton_flash.launch.backward`: FA2's dK/dV and dQ kernels, deterministic, GQA
summed in the kernel) runs on it unchanged. What a training step gains is the forward's speed (warp-specialized,
softmax overlapped with the tensor cores); the backward is the same code as ``triton_flash``'s.

Scales: the kernels need ``scale > 0``. A negative scale runs as ``(-q) * |scale|`` and a zero one as ``(q * 0)`` at
scale 1 — the same scores — with the rewrite outside the autograd function, so autograd carries dq back through it
(as :func:`attntune.kernels.triton_flash.op.flash_attention` does).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from attntune.kernels.gluon_flash import launch as gluon_launch
from attntune.kernels.gluon_flash.config import GluonTrainConfig
from attntune.kernels.triton_flash import launch as flash_launch


class _GluonTrain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, causal_align: str, window, sm_scale: float, config: GluonTrainConfig):
        o, lse = gluon_launch.forward(q, k, v, config.forward, causal=causal, causal_align=causal_align,
                                      window=window, scale=sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mask = flash_launch.mask_args(q.shape[2], k.shape[2], causal, causal_align, window)
        ctx.sm_scale, ctx.config = sm_scale, config
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_launch.backward(do, q, k, v, o, lse, ctx.mask, ctx.sm_scale, ctx.config.backward)
        return dq, dk, dv, None, None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: GluonTrainConfig, *, causal: bool = False,
              causal_align: str = "bottom_right", window: Optional[Tuple[int, int]] = None,
              scale: Optional[float] = None) -> torch.Tensor:
    """Differentiable attention (shapes, dtypes and mask of :func:`.launch.forward`): the Gluon forward of
    ``config.forward``, the Triton backward of ``config.backward``. Returns ``o [B, Hq, Sq, D]`` in q's dtype.
    Bad inputs are refused by the forward's own checks (:func:`.launch.check_inputs`), once a call."""
    q, sm_scale = gluon_launch.positive_scale(q, scale)
    return _GluonTrain.apply(q, k, v, causal, causal_align, window, sm_scale, config)


def forward_saving(q, k, v, config: GluonTrainConfig, *, causal: bool, causal_align: str, window,
                   scale: Optional[float]) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``(o, lse)`` of :func:`attention` without autograd, for the compiled op's split backward; ``None`` for a
    scale <= 0 (served by rewriting q, which the caller then differentiates as a whole call)."""
    if scale is not None and scale <= 0:
        return None
    _, sm_scale = gluon_launch.positive_scale(q, scale)  # scale > 0 here: q as it is, the scale or 1/sqrt(D)
    return gluon_launch.forward(q, k, v, config.forward, causal=causal, causal_align=causal_align, window=window,
                                scale=sm_scale)


def backward_saved(do, q, k, v, o, lse, config: GluonTrainConfig, *, causal: bool, causal_align: str, window,
                   scale: Optional[float]) -> Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """dq, dk, dv from :func:`forward_saving`'s ``(o, lse)``; ``None`` exactly where it kept nothing."""
    if scale is not None and scale <= 0:
        return None
    _, sm_scale = gluon_launch.positive_scale(q, scale)  # scale > 0 here: q as it is, the scale or 1/sqrt(D)
    mask = flash_launch.mask_args(q.shape[2], k.shape[2], causal, causal_align, window)
    return flash_launch.backward(do, q, k, v, o, lse, mask, sm_scale, config.backward)
