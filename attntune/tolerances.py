"""Dtype-keyed tolerances (xFormers' forward/backward table), used by tests and the tuner's gate."""

from __future__ import annotations

from typing import Dict, Tuple

# dtype name -> (atol, rtol)
FWD: Dict[str, Tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (3e-4, 2e-5),
    "float16": (4e-3, 4e-4),
    "bfloat16": (2e-2, 5e-3),
}
BWD: Dict[str, Tuple[float, float]] = {
    "float64": (1e-6, 1e-6),
    "float32": (5e-4, 5e-4),
    "float16": (0.2, 2e-2),
    "bfloat16": (0.9, 0.1),
}
# FP8 tensor-core forward (kernels/triton_flash with FP8 K/V): q and P quantised to the K/V format inside
# the kernel, compared with attention over the dequantised K/V in float64; K/V format name -> (atol, rtol).
# e4m3 keeps 3 mantissa bits (2^-4 relative rounding), e5m2 2 bits (2^-3). For unit-sized values and scores,
# 54 CPU cases (12-70 keys, causal/window, q fp16) measured at most 0.11 (e4m3) and 0.20 (e5m2) absolute.
FP8_FWD: Dict[str, Tuple[float, float]] = {
    "float8_e4m3fn": (0.15, 0.05),
    "float8_e4m3fnuz": (0.15, 0.05),
    "float8_e5m2": (0.3, 0.1),
}
# TF32 dots (fp32 inputs, precision "high"/"medium"): about 10 mantissa bits.
TF32_FWD = (3e-3, 2e-3)


def fwd_tol(dtype: str, tf32: bool = False) -> Tuple[float, float]:
    if dtype == "float32" and tf32:
        return TF32_FWD
    return FWD[dtype]


def bwd_tol(dtype: str, tf32: bool = False) -> Tuple[float, float]:
    if dtype == "float32" and tf32:
        return (2e-2, 2e-2)
    return BWD[dtype]


def tf32_allowed() -> bool:
    """TF32 only when the user lowered float32 matmul precision (DESIGN: fp32 stays exact otherwise)."""
    import torch

    return torch.get_float32_matmul_precision() != "highest"


def tf32_supported(device_type: str) -> bool:
    """Whether float32 dots can run in TF32 on ``device_type`` at all: NVIDIA GPUs (a ROCm build's
    kernels keep IEEE float32 dots; CPUs have no TF32). A TF32 key exists only where this holds."""
    if device_type != "cuda":
        return False
    import torch

    return not torch.version.hip


def tf32_active(dtype: str, device_type: str) -> bool:
    """Whether a problem of ``dtype`` on ``device_type`` runs its dots in TF32 now: float32 on an NVIDIA
    GPU with TF32 allowed (ROCm kernels keep IEEE float32 dots; CPUs have no TF32). It is part of the
    problem and its tune key (``tf32``): the fastest implementation differs by far between the two
    numerics (the TF32 forward is ~4.7x SDPA on the H200, the IEEE one is not)."""
    return dtype == "float32" and tf32_supported(device_type) and tf32_allowed()
