"""A fix for the Triton interpreter's float -> FP8 conversion, installed by conftest under the interpreter.

The interpreter (triton.runtime.interpreter._convert_float, checked with Triton 3.6 and 3.9) rounds a
float down-cast by adding the cut-off bit to the kept mantissa and OR-ing the result into the exponent
field, so a round-up that carries into the next binade loses the carry: 127.9 converts to e4m3 as 64, not
128 (7 or 8 of 1024 uniform values in [0, 448] come out halved). The GPUs' conversion (``cvt.rn.satfinite``)
rounds to nearest even and saturates at the format's largest finite value. Kernels that *quantise* in
registers (the FP8 flash forward) would be tested against the interpreter's bug instead of their own
arithmetic, so float32/float16 -> FP8 down-casts go through torch's round-to-nearest-even conversion, after
clamping to the format's range (what satfinite does). Every other conversion is left to the interpreter.
"""

from __future__ import annotations

import numpy as np
import torch

_TORCH_FP8 = {"fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2, "fp8e4b8": torch.float8_e4m3fnuz,
              "fp8e5b16": torch.float8_e5m2fnuz}
_NP_FLOAT = {32: np.float32, 16: np.float16}


def install() -> bool:
    """Patch the interpreter's conversion; False where Triton (or its interpreter) is absent."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = interpreter._convert_float
    if getattr(original, "_attntune_fp8_fix", False):
        return True

    def convert(input, input_dtype, output_dtype, rounding_mode):
        fmt = _TORCH_FP8.get(str(output_dtype))
        width = getattr(input_dtype, "primitive_bitwidth", 0)
        if fmt is None or width not in _NP_FLOAT or input_dtype == tl.bfloat16:
            return original(input, input_dtype, output_dtype, rounding_mode)
        x = torch.from_numpy(np.ascontiguousarray(input).view(_NP_FLOAT[width]).astype(np.float32))
        big = torch.finfo(fmt).max
        codes = x.clamp(-big, big).to(fmt).view(torch.uint8).numpy()
        return codes.reshape(input.shape)

    convert._attntune_fp8_fix = True
    interpreter._convert_float = convert
    return True
