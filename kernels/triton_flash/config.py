"""The flash kernels' typed launch configs (:mod:`attntune.kernels.launch_config`) and their defaults.

* :class:`FlashFwdConfig` — a forward launch (``fwd`` keys);
* :class:`FlashBwdConfig` — the backward's two kernels (dK/dV, dQ);
* :class:`FlashTrainConfig` — what a ``fwd_bwd`` key tunes: a forward config (a subclass: its forward
  knobs over a narrower domain, since the backward dominates a training step's time, so the sweep stays
  in the hundreds) plus the backward's knobs.

The ROCm knobs (``waves_per_eu``, ``matrix_instr_nonkdim``: Triton's HIP backend options) apply to every
launch of a config; they exist on ROCm builds only and are UNTESTED (no AMD GPU was available).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict

import torch

from attntune.kernels.launch_config import ON_ROCM, LaunchConfig, at_least, knob, pow2_at_least, warps_valid
from attntune.kernels.triton_common import MIN_BLOCK

_HIP = ("waves_per_eu", "matrix_instr_nonkdim")
_TILE = pow2_at_least(MIN_BLOCK)
_STAGES = at_least(1)


def _LOADS(v: int):  # noqa: N802 — a knob's validity check, named as the knob
    return None if v in (0, 1, 2) else f"must be 0, 1 or 2, got {v}"


def _block_m(default: int, choices=(32, 64, 128)):
    return knob(default, choices, "query rows per program (resident Q tile)", valid=_TILE)


def _block_n(default: int, choices=(32, 64, 128)):
    return knob(default, choices, "keys per inner-loop tile (K/V tiles streamed)", valid=_TILE)


def _warps(default: int, choices=(4, 8)):
    return knob(default, choices, "warps per program", valid=warps_valid)


def _stages(default: int, choices=(1, 2, 3, 4)):
    return knob(default, choices, "software-pipeline stages of the K/V loads", valid=_STAGES)


def _loads(choices=(0, 1, 2)):
    return knob(0, choices, "Q/K/V/O traffic: 0 pointer loads; 1 tensor descriptors (TMA, sm_90+); "
                "2 descriptors and a warp-specialized key loop (sm_90+)", valid=_LOADS)


def _waves():
    return knob(2, (0, 1, 2), "ROCm: waves per execution unit (occupancy hint)", rocm_only=True)


def _nonkdim():
    return knob(16, (16, 32), "ROCm: MFMA instruction size", rocm_only=True)


def _bwd_m(default: int):
    return knob(default, (16, 32, 64), "backward: rows streamed by dK/dV, keys streamed by dQ", valid=_TILE)


def _bwd_n(default: int):
    return knob(default, (64, 128), "backward: keys resident in dK/dV, rows resident in dQ", valid=_TILE)


def _bwd_warps(default: int):
    return knob(default, (4, 8), "backward: warps per program", valid=warps_valid)


def _bwd_stages(default: int):
    # 3-4 stages won every D=128 training case of the H200's wide sweep (benchmarks/bench_flash.py
    # --wide-bwd, flash_h200_bwd_sweep.json): 1.08-1.3x over 2 stages at the same tiles
    # (1 stage lost everywhere at D=128, 1.15-1.7x, but it is what fits shared memory at D > 128)
    return knob(default, (1, 2, 3, 4), "backward: software-pipeline stages", valid=_STAGES)


class _Launch(LaunchConfig):
    def _opts(self, warps: int, stages: int) -> Dict[str, int]:
        opts = {"num_warps": warps, "num_stages": stages}
        if ON_ROCM:
            opts.update({k: getattr(self, k) for k in _HIP})
        return opts


@dataclass(frozen=True)
class FlashFwdConfig(_Launch):
    """One forward launch: ``BLOCK_M`` rows x ``BLOCK_N``-key tiles, ``num_warps``, ``num_stages``."""

    BLOCK_M: int = _block_m(128)
    BLOCK_N: int = _block_n(64)
    num_warps: int = _warps(8)
    num_stages: int = _stages(3)
    LOADS: int = _loads()
    waves_per_eu: int = _waves()
    matrix_instr_nonkdim: int = _nonkdim()

    def launch_opts(self) -> Dict[str, int]:
        """Triton's launch options of the forward kernel."""
        return self._opts(self.num_warps, self.num_stages)


@dataclass(frozen=True)
class FlashBwdConfig(_Launch):
    """The backward's launches: the dK/dV kernel keeps ``BWD_BLOCK_N`` keys and streams ``BWD_BLOCK_M``
    rows; the dQ kernel mirrors the roles."""

    ARG = "bwd_config"
    BWD_BLOCK_M: int = _bwd_m(64)
    BWD_BLOCK_N: int = _bwd_n(128)
    BWD_WARPS: int = _bwd_warps(8)
    BWD_STAGES: int = _bwd_stages(3)
    waves_per_eu: int = _waves()
    matrix_instr_nonkdim: int = _nonkdim()

    def launch_opts(self) -> Dict[str, int]:
        """Triton's launch options of the two backward kernels."""
        return self._opts(self.BWD_WARPS, self.BWD_STAGES)


@dataclass(frozen=True)
class FlashTrainConfig(FlashFwdConfig):
    """A training (``fwd_bwd``) key's config: a forward and a backward launch, tuned together. Its forward
    knobs sweep a narrower domain than a forward key's (the backward dominates a training step)."""

    BLOCK_M: int = _block_m(128, (64, 128))
    num_stages: int = _stages(3, (2, 3))
    LOADS: int = _loads((0,))  # training forwards keep pointer loads until descriptors are measured
    BWD_BLOCK_M: int = _bwd_m(64)
    BWD_BLOCK_N: int = _bwd_n(128)
    BWD_WARPS: int = _bwd_warps(8)
    BWD_STAGES: int = _bwd_stages(3)

    @functools.cached_property
    def forward(self) -> FlashFwdConfig:
        return FlashFwdConfig(BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, num_warps=self.num_warps,
                              num_stages=self.num_stages, waves_per_eu=self.waves_per_eu,
                              matrix_instr_nonkdim=self.matrix_instr_nonkdim, LOADS=self.LOADS)

    @functools.cached_property
    def backward(self) -> FlashBwdConfig:
        return FlashBwdConfig(self.BWD_BLOCK_M, self.BWD_BLOCK_N, self.BWD_WARPS, self.BWD_STAGES,
                              self.waves_per_eu, self.matrix_instr_nonkdim)


def _fp32(dtype: torch.dtype) -> bool:
    return dtype == torch.float32


def default_fwd_config(head_dim: int, dtype: torch.dtype) -> FlashFwdConfig:
    """A config that runs everywhere the space is valid and is near the best on Hopper."""
    if _fp32(dtype):
        if head_dim <= 128:
            # H200, TF32 with V keys-contiguous, B4 H16 S4096 D128 (probe_tf32_h200.json): the fastest of six
            # configs dense (2.55 ms) and causal (1.51 ms); 64/32/4/3 took 3.18/1.79 ms
            return FlashFwdConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
        return FlashFwdConfig(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)
    if head_dim <= 64:
        return FlashFwdConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    if head_dim <= 128:
        return FlashFwdConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    return FlashFwdConfig(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2)


def default_bwd_config(head_dim: int, dtype: torch.dtype) -> FlashBwdConfig:
    if _fp32(dtype):
        if head_dim <= 128:
            return FlashBwdConfig(BWD_BLOCK_M=32, BWD_BLOCK_N=64, BWD_WARPS=4, BWD_STAGES=2)
        return FlashBwdConfig(BWD_BLOCK_M=16, BWD_BLOCK_N=64, BWD_WARPS=8, BWD_STAGES=1)
    if head_dim <= 64:
        # H100, D=64 bf16, device time of the three backward kernels over 24 configs
        # (benchmarks/diag_bwd_kernels.py, diag_bwd_kernels_h100_2026-12-06{,b_d64}.json): the best or within
        # 0.5 % of it on causal S1024/S4096, dense GQA S2048 and a W1024 GQA window; the former default
        # (32/128/8/2) was 1.38-1.71x slower on all four
        return FlashBwdConfig(BWD_BLOCK_M=64, BWD_BLOCK_N=64, BWD_WARPS=4, BWD_STAGES=3)
    if head_dim <= 128:
        # H200, D=128 bf16 (wide sweep, flash_h200_bwd_sweep.json): within 1 % of the best of 48 backward
        # configs on causal S=8192 and 5 % on window-1024 S=16384; the former default (16/128/8/2) was
        # 1.47x (window) and 1.48x (causal) slower
        return FlashBwdConfig(BWD_BLOCK_M=64, BWD_BLOCK_N=128, BWD_WARPS=8, BWD_STAGES=3)
    return FlashBwdConfig(BWD_BLOCK_M=16, BWD_BLOCK_N=64, BWD_WARPS=8, BWD_STAGES=1)


def default_train_config(head_dim: int, dtype: torch.dtype) -> FlashTrainConfig:
    """The forward and backward defaults as one training config."""
    f, b = default_fwd_config(head_dim, dtype), default_bwd_config(head_dim, dtype)
    return FlashTrainConfig(BLOCK_M=f.BLOCK_M, BLOCK_N=f.BLOCK_N, num_warps=f.num_warps, num_stages=f.num_stages,
                            BWD_BLOCK_M=b.BWD_BLOCK_M, BWD_BLOCK_N=b.BWD_BLOCK_N, BWD_WARPS=b.BWD_WARPS,
                            BWD_STAGES=b.BWD_STAGES)
