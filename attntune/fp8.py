"""FP8 KV caches: quantise a float K/V cache to float8 codes with float32 scales, and back.

A cache quantised here feeds :func:`attntune.kernels.triton_decode.op.decode_attention` (``k_scale``,
``v_scale``), which reads the codes — half the bytes of bf16 — and dequantises in registers. Semantics:
``real = codes.float() * scale``, with one scale per kv head (``per="head"``, shape ``[Hkv]``) or one for
the whole tensor (``per="tensor"``, shape ``[1]``). A scale is the absolute maximum over what it covers
divided by the format's largest finite value (448 for e4m3fn, 57344 for e5m2, 240 for ROCm's e4m3fnuz),
times ``margin``; values beyond ``scale * max`` saturate (the codes are clamped, never inf or NaN).

A serving cache is quantised as it fills: fix the scales from the prompt (or a calibration set), with a
``margin`` above 1 for the tokens still to come, and quantise every new token with those scales
(:func:`quantize`).
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

#: the attribute of an FP8 code tensor that carries its float32 scales (set by attntune.hf_fp8's cache layers,
#: read by the HF backend, attntune.hf)
SCALE_ATTR = "_attntune_scale"

#: the formats the decode kernel reads (e4m3fnuz: ROCm gfx942 — a code path, untested without an AMD GPU)
FORMATS = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz")
                if hasattr(torch, n))


def _check_format(dtype: torch.dtype) -> float:
    if dtype not in FORMATS:
        raise ValueError(f"dtype: expected one of {[str(f) for f in FORMATS]}, got {dtype}")
    return float(torch.finfo(dtype).max)


def scales(x: torch.Tensor, *, per: str = "head", dtype: torch.dtype = torch.float8_e4m3fn,
           margin: float = 1.0) -> torch.Tensor:
    """float32 scales of a cache ``x`` ``[B, Hkv, S, D]``: ``[Hkv]`` (``per="head"``) or ``[1]``
    (``per="tensor"``); an all-zero slice gets scale 1 (its codes are zeros either way).

    >>> x = torch.tensor([[[[1.0, -896.0]], [[0.5, 0.25]]]])          # B=1, Hkv=2, S=1, D=2
    >>> scales(x).tolist(), scales(x, per="tensor").tolist()
    ([2.0, 0.0011160714784637094], [2.0])
    """
    fmax = _check_format(dtype)
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
        raise ValueError(f"x: expected a floating [B, Hkv, S, D] tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if per not in ("head", "tensor"):
        raise ValueError(f"per: expected 'head' or 'tensor', got {per!r}")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 1.0):
        # inf made every scale inf: the dequantised cache was NaN (0 * inf), and so was attention
        raise ValueError(f"margin: expected a finite number >= 1, got {margin!r}")
    a = x.detach().float().abs()
    if a.numel() == 0:  # an empty cache (batch or length 0): nothing to represent, scale 1 as for zeros
        return torch.ones(x.shape[1] if per == "head" else 1, device=x.device, dtype=torch.float32)
    amax = a.amax(dim=(0, 2, 3)) if per == "head" else a.amax().reshape(1)
    if not torch.isfinite(amax).all():
        raise ValueError("x: holds inf or NaN; no finite scale represents it")
    return torch.where(amax > 0, amax * (margin / fmax), torch.ones_like(amax)).contiguous()


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """FP8 codes of ``x`` ``[B, Hkv, S, D]`` under ``scale`` (``[Hkv]`` or ``[1]``): ``x / scale``
    rounded to ``dtype``, saturating at the format's largest finite value."""
    fmax = _check_format(dtype)
    if scale.dim() != 1 or scale.numel() not in (1, x.shape[1]):
        raise ValueError(f"scale: expected [1] or [Hkv={x.shape[1]}], got {tuple(scale.shape)}")
    s = scale.to(device=x.device, dtype=torch.float32).view(1, -1, 1, 1)
    # three ops (FP8StaticLayer runs this per layer and decode step, host-bound in eager generate): a 16-bit or
    # float32 x over the float32 scales divides in float32 by promotion, the same values as x.float() / s; the
    # clamp works in place on that fresh quotient
    q = (x if x.dtype in _FLOAT32_EXACT else x.float()) / s
    return q.clamp_(-fmax, fmax).to(dtype)


#: input dtypes whose division by float32 scales is float32 (by type promotion) and exact as x.float() / scale
_FLOAT32_EXACT = (torch.float16, torch.bfloat16, torch.float32)


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 values ``codes * scale`` (``scale`` ``[Hkv]`` or ``[1]``) — the reference semantics."""
    if not isinstance(scale, torch.Tensor) or scale.dim() != 1 or scale.numel() not in (1, codes.shape[1]):
        raise ValueError(f"scale: expected [1] or [Hkv={codes.shape[1]}], got "
                         f"{tuple(scale.shape) if isinstance(scale, torch.Tensor) else type(scale).__name__}")
    return codes.float() * scale.to(device=codes.device, dtype=torch.float32).view(1, -1, 1, 1)


#: where a V cache's elements lie next to each other: "d" — each key's head dim (``[B, Hkv, S, D]`` storage,
#: PyTorch's contiguous layout), "keys" — each head-dim channel's keys (``[B, Hkv, D, S]`` storage, seen as a
#: ``[B, Hkv, S, D]`` view). The decode kernel's PV dot reads V with the keys as its reduction axis; an FP8 V
#: stored "d" reaches that dot's operand layout a byte at a time (Triton 3.6, sm_90: no transposing shared-memory
#: load for 8-bit types), stored "keys" in 16-byte vectors (``benchmarks/probe_fp8_decode.py --ptx``).
V_LAYOUTS = ("d", "keys")


def keys_contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, H, S, D]`` copied into ``[B, H, D, S]`` storage and returned as a ``[B, H, S, D]`` view of it
    (``stride(-2) == 1``): the same values, each head-dim channel's keys contiguous (:data:`V_LAYOUTS`).

    >>> x = torch.arange(6.0).reshape(1, 1, 3, 2)
    >>> y = keys_contiguous(x)
    >>> torch.equal(x, y), y.stride()
    (True, (6, 6, 1, 3))
    """
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def quantize_kv(k: torch.Tensor, v: torch.Tensor, *, per: str = "head",
                dtype: torch.dtype = torch.float8_e4m3fn, margin: float = 1.0,
                v_layout: str = "d") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(k_codes, v_codes, k_scale, v_scale)`` of a K/V cache ``[B, Hkv, S, D]`` (:func:`scales`,
    :func:`quantize`), ready for ``decode_attention(q, k_codes, v_codes, k_scale=..., v_scale=...)``.
    ``v_layout="keys"`` returns ``v_codes`` keys-contiguous (:func:`keys_contiguous`, :data:`V_LAYOUTS`)."""
    if v_layout not in V_LAYOUTS:
        raise ValueError(f"v_layout: expected one of {list(V_LAYOUTS)}, got {v_layout!r}")
    ks, vs = scales(k, per=per, dtype=dtype, margin=margin), scales(v, per=per, dtype=dtype, margin=margin)
    vc = quantize(v, vs, dtype)
    return quantize(k, ks, dtype), keys_contiguous(vc) if v_layout == "keys" else vc, ks, vs


def device_kv_reasons(kv_dtype: str, device_type: str) -> list:
    """Why a kernel cannot read ``kv_dtype`` codes on this machine's GPU (empty = it can): Triton converts
    e4m3fn/e5m2 on NVIDIA sm_89 and newer (Ada, Hopper, Blackwell) and e4m3fnuz on AMD gfx94x (MI300;
    a code path, untested without an AMD GPU). Not a GPU (the Triton interpreter on a CPU): no reason."""
    if device_type != "cuda" or not torch.cuda.is_available():
        return []
    if torch.version.hip:
        arch = str(getattr(torch.cuda.get_device_properties(0), "gcnArchName", ""))
        if kv_dtype == "float8_e4m3fnuz" and arch.startswith("gfx94"):
            return []
        return [f"{kv_dtype} codes on ROCm {arch or 'this GPU'}: only float8_e4m3fnuz on gfx94x"]
    major, minor = torch.cuda.get_device_capability()
    if kv_dtype == "float8_e4m3fnuz":
        return ["float8_e4m3fnuz is ROCm's format (NVIDIA GPUs read e4m3fn and e5m2)"]
    if (major, minor) < (8, 9):
        return [f"{kv_dtype} codes need sm_89 or newer (this GPU is sm_{major}{minor})"]
    return []


def check_scales(k: torch.Tensor, k_scale, v_scale) -> None:
    """``ValueError`` naming ``k_scale`` or ``v_scale`` unless each is a float32 tensor on ``k``'s device
    with one element (per tensor) or a contiguous ``[Hkv]`` (per kv head)."""
    hkv = k.shape[1]
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(sc, torch.Tensor):
            raise ValueError(f"{name}: expected a float32 tensor ([1] or [Hkv={hkv}]) with FP8 K/V, got "
                             f"{type(sc).__name__}")
        if sc.dtype != torch.float32:
            raise ValueError(f"{name}: expected float32, got {sc.dtype}")
        if sc.device != k.device:
            raise ValueError(f"{name}: device {sc.device} differs from k's {k.device}")
        if sc.numel() != 1 and (sc.dim() != 1 or sc.numel() != hkv or sc.stride(0) != 1):
            raise ValueError(f"{name}: expected one scale or a contiguous [Hkv={hkv}] tensor, got shape "
                             f"{tuple(sc.shape)}")


def check_scale_values(k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """``ValueError`` naming the scale unless every value is finite and > 0 (one host sync: the runtime
    calls it under ``ATTNTUNE_CHECK=1`` only). A NaN scale zeroed its head's output silently; 0 or a
    negative scale has no meaning for codes that :func:`scales` made."""
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not bool(torch.isfinite(sc).all()) or not bool((sc > 0).all()):
            raise ValueError(f"{name}: every scale must be finite and > 0, got {sc.tolist()} "
                             "(checked because ATTNTUNE_CHECK=1)")


__all__ = ["SCALE_ATTR", "FORMATS", "V_LAYOUTS", "scales", "quantize", "dequantize", "quantize_kv",
           "keys_contiguous", "check_scales", "check_scale_values", "device_kv_reasons"]
