"""Host launcher of the FP8 cache append: :class:`KVAppender` (argument checks, tile sizes, grid, planned once per
pair of caches) and the one-shot :func:`append_kv_`. The device code is in :mod:`.jit`; its semantics are
:func:`attntune.fp8.quantize`'s, bit for bit.

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
#: most launch plans one appender keeps (one per new-state shape: each prompt length adds one; past this, new
#: shapes are planned per call and not kept, so a long-lived cache does not grow without bound)
MAX_PLANS = 64

_APPEND = None


def _kernel() -> FastKernel:
    global _APPEND
    if _APPEND is None:  # Triton is imported on the first append, not with attntune
        from attntune.kernels.fp8_cache.jit import append_kv_kernel

        _APPEND = FastKernel(append_kv_kernel)
    return _APPEND


class KVAppender:
    """The append into one pair of caches, checked and planned once: ``KVAppender(k_cache, v_cache, k_scale,
    v_scale)(k, v, pos)`` writes ``fp8.quantize(k, k_scale)`` into ``k_cache[:, :, pos:pos+n]`` and likewise V,
    in one launch.

    ``k_cache`` ``[B, H, L, DK]``, ``v_cache`` ``[B, H, L, DV]``: float8 (:data:`FORMAT_BITS`), any strides (a
    keys-contiguous V included); scales float32 ``[H]`` or ``[1]`` on the caches' device — all fixed for the
    appender's life (a cache layer's buffers: static addresses). Per call: ``k`` ``[B, H, n, DK]``, ``v``
    ``[B, H, n, DV]`` in :data:`INPUT_DTYPES`; ``pos``: an integer tensor of one element on the caches' device,
    the first slot (read on the device: a graph replays the launch). The caller guarantees ``pos + n <= L``;
    slots past ``L`` are dropped, never written out of bounds.

    Why a class: a decode step is host-bound, and checking the caches, taking their byte views and building the
    launch arguments took ~30 µs of Python per call on a 2-core VM; the appender does that once, and a call whose
    ``k``/``v`` shapes, strides and dtypes it has seen before only looks its launch up."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor,
                 v_scale: torch.Tensor) -> None:
        if k_cache.dtype not in FORMAT_BITS or v_cache.dtype != k_cache.dtype:
            raise ValueError(f"k_cache/v_cache: expected one float8 format of {list(map(str, FORMAT_BITS))}, "
                             f"got {k_cache.dtype} and {v_cache.dtype}")
        if k_cache.dim() != 4 or v_cache.dim() != 4 or v_cache.shape[:3] != k_cache.shape[:3]:
            raise ValueError(f"k_cache/v_cache: expected [B, H, L, DK] and [B, H, L, DV], got "
                             f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
        B, H, L, DK = k_cache.shape
        for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
            if sc.dtype != torch.float32 or sc.dim() != 1 or sc.numel() not in (1, H) or sc.device != k_cache.device:
                raise ValueError(f"{name}: expected float32 [1] or [H={H}] on {k_cache.device}, got {sc.dtype} "
                                 f"{tuple(sc.shape)} on {sc.device}")
        self.shape = (B, H, L, DK, v_cache.shape[-1])
        self.ck, self.cv = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        self.k_scale, self.v_scale = k_scale, v_scale
        self.format = FORMAT_BITS[k_cache.dtype] + (float(torch.finfo(k_cache.dtype).max),)
        self.fixed = aligned(self.ck, self.cv, k_scale, v_scale)
        self.device_index = k_cache.device.index or 0
        self._plans: Dict[tuple, tuple] = {}

    def __call__(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        memo = (k.shape, v.shape, k.stride(), v.stride(), k.dtype, v.dtype, pos.dtype)
        plan = self._plans.get(memo)
        if plan is None:
            plan = self._plan(k, v, pos)
            if len(self._plans) < MAX_PLANS:
                self._plans[memo] = plan
        ints, key, grid, warps = plan
        if grid is None:  # no new tokens
            return
        _kernel()(key + (k.data_ptr() % 16 == 0, v.data_ptr() % 16 == 0, pos.data_ptr() % 16 == 0), grid,
                  (k, v, self.ck, self.cv, self.k_scale, self.v_scale, pos) + ints, num_warps=warps,
                  num_stages=None, device_index=self.device_index)

    def _plan(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> tuple:
        """``(integer and constexpr arguments after the pointers, specialization key without the per-call pointer
        alignments, grid, num_warps)`` for new states shaped like ``k``/``v`` (checked here, once per shape)."""
        B, H, L, DK, DV = self.shape
        if k.dtype not in INPUT_DTYPES or v.dtype not in INPUT_DTYPES:
            raise ValueError(f"k/v: expected float16/bfloat16/float32, got {k.dtype} and {v.dtype}")
        n = k.shape[-2] if k.dim() == 4 else -1
        if k.shape != (B, H, n, DK) or v.shape != (B, H, n, DV):
            raise ValueError(f"k/v: expected [B={B}, H={H}, n, D] matching the caches, got {tuple(k.shape)} and "
                             f"{tuple(v.shape)} for caches [{B}, {H}, {L}, {DK}] and [{B}, {H}, {L}, {DV}]")
        if pos.numel() != 1 or pos.dtype not in (torch.int32, torch.int64) or pos.device != self.ck.device:
            raise ValueError(f"pos: expected one int32/int64 element on {self.ck.device}, got {pos.dtype} "
                             f"{tuple(pos.shape)} on {pos.device}")
        if n == 0:
            return (), (), None, 0
        mbits, bias, fmax = self.format
        block_t = min(MAX_BLOCK_T, next_pow2(n))
        ints = (n, H, L, *k.stride(), *v.stride(), *self.ck.stride(), *self.cv.stride())
        per_head = (int(self.k_scale.numel() > 1), int(self.v_scale.numel() > 1))
        consts = (DK, DV, block_d(DK), block_d(DV), block_t, fmax, mbits, bias)
        key = (k.dtype, v.dtype, pos.dtype, per_head, consts, int_classes(*ints), self.fixed)
        grid = (B * H, (n + block_t - 1) // block_t, 1)
        return ints + per_head + consts, key, grid, 4 if max(DK, DV) * block_t >= 1024 else 1


def append_kv_(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_scale: torch.Tensor, v_scale: torch.Tensor, pos: torch.Tensor) -> None:
    """One append (:class:`KVAppender`, whose docstring has the arguments): ``fp8.quantize(k, k_scale)`` into
    ``k_cache[:, :, pos:pos+n]`` and likewise V, in one launch. A cache layer keeps its appender instead."""
    KVAppender(k_cache, v_cache, k_scale, v_scale)(k, v, pos)


__all__ = ["FORMAT_BITS", "INPUT_DTYPES", "KVAppender", "append_kv_"]
