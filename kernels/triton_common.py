"""What the Triton ops (flash, decode) share: device reasons, head-dim padding, dot precision, log2(e).

No Triton import: the variants' ``supports()`` and spaces use these where Triton is missing too.
"""

from __future__ import annotations

import importlib.util
import os
from typing import List

import torch

from attntune.kernels.launch_config import ON_ROCM  # noqa: F401 — re-exported for the Triton ops
from attntune.problem import AttentionProblem
from attntune.tolerances import tf32_allowed

#: Triton's ``exp2`` runs the softmax in base 2: scores are scaled by ``scale * LOG2E``
LOG2E = 1.4426950408889634
#: the smallest tensor-core tile side (``tl.dot`` needs M, N, K >= 16)
MIN_BLOCK = 16
HAS_TRITON = importlib.util.find_spec("triton") is not None
#: the dtypes the Triton kernels take (``tl.dot`` has no float64 path)
TRITON_DTYPES = ("float16", "bfloat16", "float32")


def interpreted() -> bool:
    """Kernels run on the CPU under Triton's interpreter (tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def device_reasons(problem: AttentionProblem) -> List[str]:
    """Why a Triton kernel cannot run ``problem`` on this machine: device, Triton, dtype (empty = it can)."""
    out = []
    if problem.device_type == "cpu":
        if not interpreted():
            out.append("needs a CUDA/ROCm device (or TRITON_INTERPRET=1 on the CPU)")
    elif problem.device_type != "cuda":
        out.append(f"needs a CUDA/ROCm device, got {problem.device_type}")
    if not HAS_TRITON:
        out.append("triton is not installed")
    if problem.dtype not in TRITON_DTYPES:
        out.append(f"{problem.dtype} not supported ({', '.join(TRITON_DTYPES)}: tl.dot has no float64 path)")
    return out


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def block_d(head_dim: int) -> int:
    """Head dim padded to a power of two, at least :data:`MIN_BLOCK` (``tl.arange`` and ``tl.dot`` need
    one); the padding lanes are masked."""
    return max(MIN_BLOCK, next_pow2(head_dim))


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` of every ``tl.dot``: TF32 for float32 inputs only when torch's float32 matmul
    precision is not "highest" (DESIGN: fp32 stays exact otherwise). For fp16/bf16 operands the value
    does not change the arithmetic; "tf32" is the NVIDIA default. ROCm: "ieee" (its default; TF32 is
    not offered on every gfx arch — untested, no AMD GPU was available)."""
    if torch.version.hip:  # read per call (prepared launches call this once): tests stand in for ROCm
        return "ieee"
    if dtype == torch.float32 and not tf32_allowed():
        return "ieee"
    return "tf32"
