"""Launch-parameter spaces of the flash kernels and their shared-memory and register model (the configs
themselves: :mod:`attntune.kernels.triton_flash.config`).

Shared by the ``triton_flash`` and ``triton_local`` variants (one definition, no copy-paste).
"""

from __future__ import annotations

import functools

import torch
from attntune.kernels.base import Space
from attntune.kernels.launch_config import ON_ROCM, LaunchConfig
from attntune.kernels.triton_common import block_d
from attntune.kernels.triton_flash.config import (FlashFwdConfig, FlashTrainConfig, default_fwd_config,
                                                  default_train_config)
from attntune.kernels.triton_flash.launch import tf32_b_copies

from attntune.problem import AttentionProblem

# Largest dynamic shared memory one program may take, in bytes, by arch (CUDA's "max shared memory
# per block (opt-in)"; LDS per workgroup on AMD gfx9).
SMEM_LIMIT = {
    "sm_90": 227 * 1024,
    "sm_100": 227 * 1024,
    "sm_80": 163 * 1024,
    "sm_87": 163 * 1024,
    "sm_86": 99 * 1024,
    "sm_89": 99 * 1024,
    "sm_120": 99 * 1024,
    "sm_75": 64 * 1024,
    "gfx9": 64 * 1024,
}
# The interpreter has no shared memory; it is given Hopper's limit so that the CPU tests walk the
# same space a Hopper GPU declares.
INTERPRETER_ARCH = "sm_90"


@functools.cache
def device_arch(device_type: str) -> str:
    """``sm_90``-style arch of the current device, ``gfx9`` for AMD CDNA/GCN, the interpreter's stand-in
    on the CPU."""
    if device_type != "cuda" or not torch.cuda.is_available():
        return INTERPRETER_ARCH
    if torch.version.hip:
        name = torch.cuda.get_device_properties(0).gcnArchName
        return "gfx9" if name.startswith("gfx9") else name.split(":")[0]
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def tma_arch(arch: str) -> bool:
    """Hopper or newer NVIDIA (``sm_90``+): Triton lowers tensor-descriptor loads/stores to TMA there."""
    return arch.startswith("sm_") and arch[3:].isdigit() and int(arch[3:]) >= 90


def smem_limit(arch: str) -> int:
    return SMEM_LIMIT.get(arch, 99 * 1024)  # unknown arch: assume the common consumer limit


def fwd_smem_bytes(bm: int, bn: int, bd: int, elem: int, stages: int) -> int:
    """Q tile resident + one K and one V tile per pipeline stage (P stays in registers). Matches what
    Triton 3.6 reports for sm_90 exactly for num_stages >= 2 and over-counts num_stages = 1."""
    return elem * bd * (bm + 2 * bn * max(stages, 1))


def bwd_smem_bytes(bm: int, bn: int, bd: int, elem: int, stages: int) -> int:
    """dK/dV kernel (the larger of the two): K, V resident [BN, BD]; Q and dO tiles [BM, BD] per
    stage; P^T and dS^T [BN, BM] staged in shared memory for their dots."""
    return elem * (2 * bn * bd + 2 * bm * bd * max(stages, 1) + 2 * bn * bm)


def fwd_regs_per_thread(bm: int, bn: int, bd: int, warps: int) -> float:
    """fp32 values each thread holds live: the O accumulator [BM, BD] + the scores [BM, BN]. Above
    ~128 Triton 3.6 spills on sm_90 (measured by compiling the space with ptxas)."""
    return (bm * bd + bm * bn) / (32 * warps)


def bwd_regs_per_thread(bm: int, bn: int, bd: int, warps: int) -> float:
    """dK/dV kernel: dK and dV accumulators [BN, BD] + P^T and dP^T [BN, BM], fp32 values per thread. A
    proxy for spilling, calibrated on the H200 (Triton 3.6, D=128 bf16, 48 backward configs timed on two
    shapes): every config above 256 (128-key blocks with 4 warps: 288-384) ran 2-3.8x slower than the
    best, while the best ones sit at 160-192."""
    return (2 * bn * bd + 2 * bn * bm) / (32 * warps)


FWD_REG_LIMIT = 128
BWD_REG_LIMIT = 256


def constraint_reasons(config: LaunchConfig, head_dim: int, dtype: torch.dtype, arch: str) -> list[str]:
    """Why a typed config (:class:`FlashFwdConfig` or :class:`FlashTrainConfig`) would not compile, not
    fit, or spill badly on ``arch`` (empty = fine)."""
    bd, es, limit = block_d(head_dim), dtype.itemsize, smem_limit(arch)
    out = []
    bm, bn, w, s = config.BLOCK_M, config.BLOCK_N, config.num_warps, config.num_stages
    if bm == 32 and w != 4:  # H200, D=128 bf16: 32-row blocks with 8 warps ran 6-7x slower than the best
        out.append("BLOCK_M=32 takes 4 warps")
    if config.LOADS and not tma_arch(arch):
        out.append(f"LOADS={config.LOADS} (tensor descriptors) needs NVIDIA sm_90 or newer, not {arch}")
    if config.LOADS == 2 and w < 8:
        # H200, Triton 3.6: every 4-warp config with the warp-specialized loop failed to compile
        # ("PassManager::run failed") at lengths that are not a multiple of the blocks (1025 x 1100, D 64
        # and 128; 31 configs), while every 8-warp one compiled and ran
        out.append("LOADS=2 (warp-specialized key loop) takes 8 warps")
    smem = fwd_smem_bytes(bm, bn, bd, es, s)
    if smem > limit:
        out.append(f"forward shared memory ~{smem} B > {limit} B on {arch}")
    regs = fwd_regs_per_thread(bm, bn, bd, w)
    if regs > FWD_REG_LIMIT:
        out.append(f"forward holds ~{regs:.0f} fp32 values per thread (> {FWD_REG_LIMIT}: spills)")
    if isinstance(config, FlashTrainConfig):
        bm, bn, w, s = config.BWD_BLOCK_M, config.BWD_BLOCK_N, config.BWD_WARPS, config.BWD_STAGES
        smem = bwd_smem_bytes(bm, bn, bd, es, s)
        if tf32_b_copies(dtype):  # dV's dO and dK's Q tiles come from the copies too (jit_bwd's ALT_B)
            smem += 2 * bm * bd * es * max(s, 1)
        if smem > limit:
            out.append(f"backward shared memory ~{smem} B > {limit} B on {arch}")
        regs = bwd_regs_per_thread(bm, bn, bd, w)
        if regs > BWD_REG_LIMIT:
            out.append(f"backward holds ~{regs:.0f} fp32 values per thread (> {BWD_REG_LIMIT}: spills)")
    return out


def flash_space(problem: AttentionProblem) -> Space:
    """The launch space of the flash kernels for ``problem`` (independent of sequence lengths and
    batch, so that a config tuned for one bucket stays valid for every shape that maps to it): a
    :class:`FlashTrainConfig` space for ``fwd_bwd``, else a :class:`FlashFwdConfig` one."""
    dtype, d = problem.torch_dtype, problem.head_dim
    arch = device_arch(problem.device_type)
    # the ROCm knobs only where the problem runs on a ROCm GPU (the interpreter's CPU runs take none)
    rocm = ON_ROCM and problem.device_type == "cuda"
    if problem.mode == "fwd_bwd":
        cls, default = FlashTrainConfig, default_train_config(d, dtype)
    else:
        cls, default = FlashFwdConfig, default_fwd_config(d, dtype)
    return cls.space(default, lambda cfg: constraint_reasons(cfg, d, dtype, arch), rocm=rocm)
