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
from attntune.kernels.triton_flash.config import (FlashBwdConfig, FlashFwdConfig, FlashTrainConfig,
                                                  default_bwd_config, default_fwd_config)


def _configs(config, D: int, dtype: torch.dtype) -> tuple[FlashFwdConfig, FlashBwdConfig]:
    """A training config's two launches; a forward config (or None) with the default backward — what
    :func:`~.op.flash_attention` runs for the same ``config``."""
    if isinstance(config, FlashTrainConfig):
        return config.forward, config.backward
    return typed(FlashFwdConfig, config, default_fwd_config(D, dtype)), default_bwd_config(D, dtype)


def forward_saving(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, causal_align: str,
                   window, scale: Optional[float], config) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``(o [B, Hq, Sq, D], lse [B, Hq, Sq] float32, natural log)`` of
    :func:`~.op.flash_attention` with the same arguments, without autograd. ``None`` for a scale <= 0
    (flash_attention rewrites q for those; the caller then differentiates the whole call instead)."""
    launch.check_inputs(q, k, v)
    D = q.shape[-1]
    sm_scale = float(D**-0.5 if scale is None else scale)
    if sm_scale <= 0:
        return None
    fwd, _ = _configs(config, D, q.dtype)
    mask = launch.mask_args(q.shape[2], k.shape[2], causal, causal_align, window)
    return launch.forward(q, k, v, mask, sm_scale, fwd)


def backward_saved(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, *, causal: bool, causal_align: str, window, scale: Optional[float],
                   config) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """dq, dk, dv (the inputs' shapes and dtypes) from :func:`forward_saving`'s ``(o, lse)``: the backward
    launch of ``config`` — what ``_FlashAttention.backward`` runs. ``None`` exactly where
    :func:`forward_saving` kept nothing (scale <= 0): ``lse`` is then not this call's."""
    D = q.shape[-1]
    sm_scale = float(D**-0.5 if scale is None else scale)
    if sm_scale <= 0:
        return None
    _, bwd = _configs(config, D, q.dtype)
    mask = launch.mask_args(q.shape[2], k.shape[2], causal, causal_align, window)
    return launch.backward(do.contiguous(), q, k, v, o, lse, mask, sm_scale, bwd)
