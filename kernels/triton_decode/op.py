"""Public split-K flash-decoding op: attention of a few new query positions over a KV cache."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from attntune.kernels.launch_config import typed
from attntune.kernels.triton_decode.launch import DecodeConfig, check_decode_args, check_window, launch_decode

_DEFAULT = DecodeConfig()
from attntune.tolerances import tf32_allowed


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    kv_lens: Optional[torch.Tensor] = None,
    causal: bool = False,
    window: Optional[Tuple[int, int]] = None,
    scale: Optional[float] = None,
    config: Optional[Union[dict, DecodeConfig]] = None,
    out: Optional[torch.Tensor] = None,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Softmax attention of ``Sq`` (1..16) new query positions over a KV cache, forward only.

    Args:
        q:        ``[B, Hq, Sq, D]``, Sq in 1..16 (decode, or a few speculative tokens).
        k_cache:  ``[B, Hkv, S_max, D]``, ``Hq % Hkv == 0``; query head ``h`` reads kv head
                  ``h // (Hq // Hkv)`` (GQA/MQA).
        v_cache:  ``[B, Hkv, S_max, Dv]``. Any strides (e.g. a slice of a larger cache).
        kv_lens:  optional ``int32 [B]`` (int64 accepted): sequence ``b`` holds ``L_b`` valid keys,
                  ``k_cache[b, :, :L_b]``, with ``L_b = clamp(kv_lens[b], 0, S_max)``: values are clamped
                  to ``[0, S_max]``; the clamped length is used for the diagonal too. Keys past ``L_b``
                  are never read (they may hold garbage, NaN included). ``None`` means ``L_b = S_max``.
        causal:   mask later keys. The ``Sq`` queries are the *last* ``Sq`` positions of each sequence
                  (bottom-right alignment per sequence, the FlashAttention/vLLM convention; the only
                  alignment of this op): query row ``i`` of sequence ``b`` sits on key ``L_b - Sq + i``
                  and attends key ``j`` iff ``j < L_b`` and ``j <= L_b - Sq + i``. Without ``causal``
                  (and window) every row attends all ``j < L_b``. For ``Sq == 1`` both are the same.
        window:   sliding window ``(left, right)``, a side ``-1`` = unbounded; ``None`` = no window.
                  Row ``i`` of sequence ``b`` attends key ``j`` iff ``j < L_b`` and
                  ``L_b - Sq + i - left <= j <= L_b - Sq + i + right``. With ``causal`` both masks apply
                  (their intersection: window ``(left, min(right, 0))``). Keys before row 0's window
                  start, ``j < L_b - Sq - left``, are never read either, and the splits divide only the
                  keys from there to ``L_b``: the cost follows the window, not ``S_max``.
        scale:    softmax scale; ``None`` means ``1/sqrt(D)``.
        config:   launch parameters ``{"BLOCK_N", "num_splits", "num_warps", "num_stages"}`` (a dict or
                  :class:`DecodeConfig`); ``num_splits`` / ``num_stages`` 0 or ``"auto"`` pick them from
                  the shape and the GPU (SM count, shared memory). ``None``: BLOCK_N 64, 4 warps, both
                  auto. Any valid config gives the same result up to rounding.
        out:      optional ``[B, Hq, Sq, Dv]`` tensor of q's dtype to write into (any strides).
        k_scale, v_scale: with FP8 caches (``float8_e4m3fn``, ``float8_e5m2``; ``float8_e4m3fnuz`` on
                  ROCm, untested) the float32 dequantisation scales, required: one element (per tensor)
                  or a contiguous ``[Hkv]`` (per kv head). The real keys and values are
                  ``k_cache[b, h].float() * k_scale[h]`` and ``v_cache[b, h].float() * v_scale[h]``
                  (:func:`attntune.fp8.quantize_kv` makes codes and scales from a float cache). q and the
                  output are then float16 or bfloat16. Other caches take no scales.

    Returns:
        ``[B, Hq, Sq, Dv]`` in q's dtype. A row with no admissible key — ``L_b == 0``, or a row whose
        right reach ends before key 0, ``L_b - Sq + i + right < 0`` (``right`` is 0 under causal) — is
        all zeros, never NaN.

    Raises:
        ValueError: naming the argument (``q``, ``k_cache``, ``v_cache``, ``kv_lens``, ``window``,
        ``config``, ``out``, ``k_scale``, ``v_scale``) that does not fit.

    float16, bfloat16 and float32 inputs; D, Dv up to 256 (any value: padded to a power of two and
    masked). float32 uses TF32 dots only when ``torch.get_float32_matmul_precision() != "highest"``.
    Accumulation is float32 throughout; the split partials are float32.
    """
    check_decode_args(q, k_cache, v_cache, kv_lens, k_scale=k_scale, v_scale=v_scale)
    window = check_window(window)
    cfg = typed(DecodeConfig, config, _DEFAULT)
    B, Hq, Sq, _ = q.shape
    shape = (B, Hq, Sq, v_cache.shape[3])
    if out is None:
        out = torch.empty(shape, device=q.device, dtype=q.dtype)
    elif tuple(out.shape) != shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out: expected {shape} {q.dtype} on {q.device}, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    sm_scale = float(scale) if scale is not None else q.shape[3] ** -0.5
    precision = "tf32" if (q.dtype != torch.float32 or tf32_allowed()) else "ieee"
    if k_scale is not None:  # one element of any shape -> [1]; [Hkv] is contiguous (checked)
        k_scale, v_scale = k_scale.reshape(-1), v_scale.reshape(-1)
    return launch_decode(q, k_cache, v_cache, kv_lens, out, causal, sm_scale, cfg, precision, window,
                         k_scale, v_scale)
