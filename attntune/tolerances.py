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
