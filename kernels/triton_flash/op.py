"""Public flash-attention op (Triton): one differentiable function."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from attntune.kernels.launch_config import typed
from attntune.kernels.triton_flash import launch
from attntune.kernels.triton_flash.config import (FlashBwdConfig, FlashFwdConfig, FlashTrainConfig,
                                                  default_bwd_config, default_fwd_config)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask: launch.MaskArgs, sm_scale: float, config: FlashFwdConfig, bwd_config: Any):
        o, lse = launch.forward(q, k, v, mask, sm_scale, config)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mask, ctx.sm_scale, ctx.bwd_config = mask, sm_scale, bwd_config
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        # parsed here, not in forward: an inference call never pays for its backward config
        bwd = typed(FlashBwdConfig, ctx.bwd_config, default_bwd_config(q.shape[-1], q.dtype))
        dq, dk, dv = launch.backward(do, q, k, v, o, lse, ctx.mask, ctx.sm_scale, bwd)
        return dq, dk, dv, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    causal_align: str = "bottom_right",
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    config: Optional[Union[dict, FlashFwdConfig, FlashTrainConfig]] = None,
    bwd_config: Optional[Union[dict, FlashBwdConfig]] = None,
    return_lse: bool = False,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
):
    """Exact softmax attention with Triton flash kernels (forward and backward).

    Args:
        q: ``[B, Hq, Sq, D]`` float16 / bfloat16 / float32, any strides.
        k: ``[B, Hkv, Skv, D]``, ``Hq % Hkv == 0``; query head ``h`` reads kv head ``h // (Hq // Hkv)``
            (GQA/MQA without repeating K/V).
        v: ``[B, Hkv, Skv, D]`` (``head_dim_v == head_dim`` only). ``1 <= D <= 256``.
        causal: apply the causal mask.
        causal_align: ``"bottom_right"`` (FlashAttention's convention, ``off = Skv - Sq``) or
            ``"top_left"`` (torch's ``is_causal``, ``off = 0``).
        window: ``(left, right)`` sliding window; -1 on a side = unbounded; ``None`` = no window.
        scale: softmax scale; ``None`` = ``1 / sqrt(D)``.
        config: forward launch config, a :class:`FlashFwdConfig` or its dict
            ``{BLOCK_M, BLOCK_N, num_warps, num_stages}`` (missing keys: the class defaults); ``None`` = the
            default for this head dim and dtype. A :class:`FlashTrainConfig` gives both launches.
        bwd_config: backward launch config, a :class:`FlashBwdConfig` or its dict
            ``{BWD_BLOCK_M, BWD_BLOCK_N, BWD_WARPS, BWD_STAGES}``; ``None`` = the default (or the
            backward of a :class:`FlashTrainConfig` ``config``).
        return_lse: also return the log-sum-exp.
        k_scale, v_scale: with k/v as FP8 codes (``float8_e4m3fn``/``float8_e5m2``, one format; q float16
            or bfloat16): float32 scales, ``[Hkv]`` (per kv head) or ``[1]``; the real keys are
            ``k.float() * k_scale[hkv]``, the values likewise. Inference only (no gradients). Both dots run
            on FP8 tensor cores: q is quantised to k's format per row and the probabilities with a fixed
            scale (:mod:`.jit_fwd`), so the output is within :data:`attntune.tolerances.FP8_FWD` of
            attention over the dequantised K/V, not within q's dtype's tolerance.

    Mask semantics (exactly those of :mod:`attntune.problem`): with ``off = Skv - Sq`` for
    ``bottom_right`` and ``0`` for ``top_left``, query row ``i`` attends key ``j`` iff

    * causal:        ``j <= i + off``
    * window (l, r): ``i + off - l <= j <= i + off + r`` (a side given as -1 is unbounded)

    Only key blocks that intersect a row block's window are visited (cost ~ S * W for a window W).
    A row with no admissible key yields zeros, LSE ``-inf`` and zero gradients — never NaN.

    Float32 inputs use TF32 tensor-core dots only when ``torch.get_float32_matmul_precision()`` is
    not ``"highest"``; otherwise exact fp32 dots.

    Returns:
        ``o [B, Hq, Sq, D]`` in q's dtype; with ``return_lse`` also ``lse [B, Hq, Sq]`` float32
        (natural log, not differentiable).
    """
    if torch.compiler.is_compiling():
        # Inductor re-compiles a traced user kernel and fails on this one (Triton 3.6, torch 2.11: a
        # CompilationError in the forward's key loop), so a torch.compile trace runs this call eagerly behind a
        # graph break; compiled models reach these kernels through attntune.attention's opaque custom ops
        return _flash_attention_eager(q, k, v, causal=causal, causal_align=causal_align, window=window, scale=scale,
                                      config=config, bwd_config=bwd_config, return_lse=return_lse, k_scale=k_scale,
                                      v_scale=v_scale)
    launch.check_inputs(q, k, v, k_scale, v_scale)
    D = q.shape[-1]
    mask = launch.mask_args(q.shape[2], k.shape[2], causal, causal_align, window)
    sm_scale = float(D**-0.5 if scale is None else scale)
    if sm_scale < 0:
        # the kernels fold the scale into the running max (max(qk) * scale), valid only for scale >= 0;
        # q * scale == (-q) * |scale| keeps everything else unchanged, and autograd flips dq back
        q, sm_scale = -q, -sm_scale
    elif sm_scale == 0:
        # every admitted score is 0, but a masked one would be -inf * 0 = NaN in the running max: q * 0 at
        # scale 1 gives the same scores (and zero gradients for q), finite
        q, sm_scale = q * 0.0, 1.0
    if k_scale is not None:  # FP8 K/V: a forward only (check_inputs made sure both scales are there)
        if torch.is_grad_enabled() and q.requires_grad:
            raise ValueError("k_scale/v_scale: FP8 K/V are for inference; q must not require grad")
        if isinstance(config, FlashTrainConfig):
            config = config.forward
        config = typed(FlashFwdConfig, config, default_fwd_config(D, q.dtype))
        o, lse = launch.forward(q, k, v, mask, sm_scale, config, k_scale, v_scale)
        return (o, lse) if return_lse else o
    if isinstance(config, FlashTrainConfig):
        if bwd_config is not None:
            raise ValueError("bwd_config: not with a FlashTrainConfig config (it holds the backward)")
        config, bwd_config = config.forward, config.backward
    else:
        config = typed(FlashFwdConfig, config, default_fwd_config(D, q.dtype))
        if bwd_config is not None and not isinstance(bwd_config, FlashBwdConfig):
            bwd_config = FlashBwdConfig.from_dict(bwd_config)  # refused here, not first in backward
    o, lse = _FlashAttention.apply(q, k, v, mask, sm_scale, config, bwd_config)
    return (o, lse) if return_lse else o


_flash_attention_eager = torch.compiler.disable(flash_attention)
