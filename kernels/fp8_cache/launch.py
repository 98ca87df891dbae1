"""Host launcher of the FP8 cache append: :func:`append_kv_` (argument checks, tile sizes, grid). The device code
is in :mod:`.jit`; its semantics are :func:`attntune.fp8.quantize`'s, bit for bit.

Why a kernel: in eager ``generate`` a decode step is host-bound, and the append ran per layer and step as 9 torch
ops (quantise K and V: divide, clamp, cast; two ``index_copy_``; the length's increment) at ~8.5 µs of host
time each on the H100 VM, against ~13.8 µs for one Triton launch through Triton's own path and less through
:class:`~attntune.kernels.triton_launch.FastKernel` (``benchmarks/probe_launch_cost.py``). The caller still
increments the length (one op).
"""

from __future__ import annotations

from typing import Dict

import torch

from attntune.kernels.triton_common import block_d, next_pow2
from attntune.kernels.triton_launch import FastKernel, aligned, int_classes

#: (mantissa bits, exponent bias) of the formats the kernel encodes; e4m3fnuz (ROCm) is not among them
FORMAT_BITS: Dict[torch.dtype, tuple] = {torch.float8_e4m3fn: (3, 7), torch.float8_e5m2: (2, 15)}
#: the input dtypes whose float32 widening is exact (a float64 input would round first: not taken)
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: most new tokens one program quantises (a prompt's append spreads over programs; a decode step is one token)
MAX_BLOCK_T = 16

_APPEND = None


def _kernel() -> FastKernel:
    global _APPEND
    if _APPEND is None:  # Triton is imported on the first append, not with attntune
        from attntune.kernels.fp8_cache.jit import append_kv_kernel

        _APPEND = FastKernel(append_kv_kernel)
    return _APPEND


def append_kv_(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_scale: torch.Tensor, v_scale: torch.Tensor, pos: torch.Tensor) -> None:
    """Write ``fp8.quantize(k, k_scale)`` into ``k_cache[:, :, pos:pos+n]`` and likewise V, in one launch.

    ``k_cache`` ``[B, H, L, DK]``, ``v_cache`` ``[B, H, L, DV]``: float8 (:data:`FORMAT_BITS`), any strides (a
    keys-contiguous V included); ``k`` ``[B, H, n, DK]``, ``v`` ``[B, H, n, DV]`` in :data:`INPUT_DTYPES`;
    scales float32 ``[H]`` or ``[1]``; ``pos``: an integer tensor of one element on the caches' device, the
    first slot (read on the device: a graph replays the launch). The caller guarantees ``pos + n <= L``; slots
    past ``L`` are dropped, never written out of bounds."""
    if k_cache.dtype not in FORMAT_BITS or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"k_cache/v_cache: expected one float8 format of {list(map(str, FORMAT_BITS))}, "
                         f"got {k_cache.dtype} and {v_cache.dtype}")
    if k.dtype not in INPUT_DTYPES or v.dtype not in INPUT_DTYPES:
        raise ValueError(f"k/v: expected float16/bfloat16/float32, got {k.dtype} and {v.dtype}")
    B, H, L, DK = k_cache.shape
    DV, n = v_cache.shape[-1], k.shape[-2]
    if (k.shape != (B, H, n, DK) or v.shape != (B, H, n, DV) or v_cache.shape != (B, H, L, DV)):
        raise ValueError(f"k/v: expected [B={B}, H={H}, n, D] matching the caches, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)} for caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s.dtype != torch.float32 or s.dim() != 1 or s.numel() not in (1, H) or s.device != k_cache.device:
            raise ValueError(f"{name}: expected float32 [1] or [H={H}] on {k_cache.device}, got {s.dtype} "
                             f"{tuple(s.shape)} on {s.device}")
    if n == 0:
        return
    mbits, bias = FORMAT_BITS[k_cache.dtype]
    ck, cv = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    block_t = min(MAX_BLOCK_T, next_pow2(n))
    ints = (n, H, L, *k.stride(), *v.stride(), *ck.stride(), *cv.stride())
    consts = (DK, DV, block_d(DK), block_d(DV), block_t, float(torch.finfo(k_cache.dtype).max), mbits, bias)
    args = (k, v, ck, cv, k_scale, v_scale, pos, *ints, int(k_scale.numel() > 1), int(v_scale.numel() > 1),
            *consts)
    key = (k.dtype, v.dtype, k_scale.numel() > 1, v_scale.numel() > 1, pos.dtype, consts,
           int_classes(*ints), aligned(k, v, ck, cv, k_scale, v_scale, pos))
    grid = (B * H, (n + block_t - 1) // block_t, 1)
    _kernel()(key, grid, args, num_warps=4 if max(DK, DV) * block_t >= 1024 else 1, num_stages=None,
              device_index=k_cache.device.index or 0)


__all__ = ["FORMAT_BITS", "INPUT_DTYPES", "append_kv_"]
