"""The flash forward and backward as two plain calls, for the compiled op (``attntune::attention``).

Under ``torch.compile`` a call is one opaque custom op whose autograd formula is a second op; without a
split like this one the backward op can only recompute the forward under autograd (one more forward per
training step). :func:`forward_saving` returns what :class:`~.op._FlashAttention` saves — the output and
the row log-sum-exp — and :func:`backward_saved` runs the same backward kernels from them. Not hashed into
the variants' tuned rows: the tuner times :func:`~.op.flash_attention` (eager autograd), whose kernels
these call unchanged.
"""

from __future__ import annotations

from typing import Optional

import torch

from attntune.kernels.launch_config import typed
from attntune.kernels.triton_flash import launch
from attntune.kernels.triton_flash.config import (FlashFwdConfig, FlashTrainConfig,
                                                  default_bwd_config, default_fwd_config)


def _launch_args(q, k, causal: bool, causal_align: str, window, scale: Optional[float], config):
    """``(mask, sm_scale, forward config, backward config)`` of a call — or None for a scale <= 0, which
    :func:`~.op.flash_attention` serves by rewriting q (the caller then differentiates the whole call).
    A training config gives both launches; a forward config (or None) comes with the default backward —
    what flash_attention runs for the same ``config``."""
    D = q.shape[-1]
    sm_scale = float(D**-0.5 if scale is None else scale)
    if sm_scale <= 0:
        return None
    if isinstance(config, FlashTrainConfig):
        fwd, bwd = config.forward, config.backward
    else:
        fwd, bwd = typed(FlashFwdConfig, config, default_fwd_config(D, q.dtype)), default_bwd_config(D, q.dtype)
    return launch.mask_args(q.shape[2], k.shape[2], causal, causal_align, window), sm_scale, fwd, bwd


def forward_saving(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, causal_align: str,
                   window, scale: Optional[float], config) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``(o [B, Hq, Sq, D], lse [B, Hq, Sq] float32, natural log)`` of
    :func:`~.op.flash_attention` with the same arguments, without autograd. ``None`` for a scale <= 0."""
    launch.check_inputs(q, k, v)
    args = _launch_args(q, k, causal, causal_align, window, scale, config)
    if args is None:
        return None
    mask, sm_scale, fwd, _ = args
    return launch.forward(q, k, v, mask, sm_scale, fwd)


def backward_saved(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, *, causal: bool, causal_align: str, window, scale: Optional[float],
                   config) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """dq, dk, dv (the inputs' shapes and dtypes) from :func:`forward_saving`'s ``(o, lse)``: the backward
    launch of ``config`` — what ``_FlashAttention.backward`` runs. ``None`` exactly where
    :func:`forward_saving` kept nothing (scale <= 0): ``lse`` is then not this call's."""
    args = _launch_args(q, k, causal, causal_align, window, scale, config)
    if args is None:
        return None
    mask, sm_scale, _, bwd = args
    return launch.backward(do, q, k, v, o, lse, mask, sm_scale, bwd)  # any strides, as the eager autograd passes it
