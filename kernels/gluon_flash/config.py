"""The Gluon forward's typed launch config (:mod:`attntune.kernels.launch_config`), its shared-memory model and
the shapes it takes. No Triton import: the variant's ``supports()`` and space use these where Triton is missing."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Dict, List

import torch

from attntune.kernels.launch_config import LaunchConfig, at_least, knob, pow2_at_least
from attntune.kernels.triton_common import block_d
from attntune.kernels.triton_flash.config import FlashBwdConfig, default_bwd_config

#: head dims compiled for sm_90 without spills (``benchmarks/results/probe_gluon_fwd_compile_sm90_triton36.json``:
#: D 64, 80 and 128 at every config, <= 246 registers); wider heads need smaller tiles, not yet measured
MAX_HEAD_DIM = 128
#: the TMA descriptors need 16-byte strides: a 16-bit head dim a multiple of 8
HEAD_DIM_MULTIPLE = 8
#: Hopper's opt-in shared memory per block
SMEM_LIMIT = 227 * 1024
#: the warp-specialized kernel's ``maxnreg``: its 4 + 4 + 1 warps round to 12 (registers go by warpgroup), 168 x 384
#: threads fill the 64K register file; the loader keeps 24 a thread and the consumers get 240 (``jit_ws``)
WS_MAXNREG = 168


def _warps(v: int):  # noqa: N802 — a knob's validity check
    return None if v == 8 else "must be 8 (two warpgroups of 64 rows: the kernel's wgmma layout)"


def _flag(v: int):
    return None if v in (0, 1) else "must be 0 or 1"


def _rows(v: int):
    return None if v == 128 else "must be 128 (64 rows per warpgroup)"


@dataclass(frozen=True)
class GluonFwdConfig(LaunchConfig):
    """One forward launch: ``BLOCK_M`` query rows, K/V blocks of ``BLOCK_N`` keys through a ``num_stages``-deep
    ring of TMA loads, ``num_warps`` warps."""

    BLOCK_M: int = knob(128, (128,), "query rows per program (64 per warpgroup)", valid=_rows)
    BLOCK_N: int = knob(128, (64, 128), "keys per K/V block", valid=pow2_at_least(16))
    num_stages: int = knob(3, (2, 3), "K/V blocks in flight (the TMA ring's depth)", valid=at_least(1))
    num_warps: int = knob(8, (8,), "warps per program", valid=_warps)
    WS: int = knob(1, (0, 1), "1: warp-specialized, a 1-warp TMA loader and two 4-warp consumers taking turns on "
                   "the tensor cores (FlashAttention-3's ping-pong); 0: one 8-warp partition", valid=_flag)

    def launch_opts(self) -> Dict[str, int]:
        if self.WS:  # num_warps is the default partition's: the first consumer (kernels/gluon_flash/jit_ws.py)
            return {"num_warps": self.num_warps // 2, "maxnreg": WS_MAXNREG}
        return {"num_warps": self.num_warps}


def _backward_knob(name: str):
    """A field declared as ``FlashBwdConfig``'s knob ``name`` (its default, domain and check: one declaration)."""
    f = FlashBwdConfig.__dataclass_fields__[name]
    return dataclasses.field(default=f.default, metadata=f.metadata)


@dataclass(frozen=True)
class GluonTrainConfig(GluonFwdConfig):
    """A training (``fwd_bwd``) key's config: the Gluon forward's launch and the backward of ``triton_flash``
    (:class:`~attntune.kernels.triton_flash.config.FlashBwdConfig`'s knobs, reading the forward's output and LSE),
    tuned together. The forward sweeps the warp-specialized schedule only (the faster one at every timed shape),
    since the backward dominates a training step."""

    WS: int = knob(1, (1,), "1: warp-specialized (the only schedule a training key sweeps)", valid=_flag)
    BWD_BLOCK_M: int = _backward_knob("BWD_BLOCK_M")
    BWD_BLOCK_N: int = _backward_knob("BWD_BLOCK_N")
    BWD_WARPS: int = _backward_knob("BWD_WARPS")
    BWD_STAGES: int = _backward_knob("BWD_STAGES")

    @functools.cached_property
    def forward(self) -> GluonFwdConfig:
        return GluonFwdConfig(BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, num_stages=self.num_stages,
                              num_warps=self.num_warps, WS=self.WS)

    @functools.cached_property
    def backward(self) -> FlashBwdConfig:
        return FlashBwdConfig(BWD_BLOCK_M=self.BWD_BLOCK_M, BWD_BLOCK_N=self.BWD_BLOCK_N, BWD_WARPS=self.BWD_WARPS,
                              BWD_STAGES=self.BWD_STAGES)


def smem_bytes(cfg: GluonFwdConfig, head_dim: int, elem: int = 2) -> int:
    """Q tile + the K and V rings (the output tile reuses their space) + the mbarriers and what the compiler adds:
    128 bytes (one partition), 512 (WS: the ring's "empty" barriers, the turn pair, the partitions' scratch); the
    allocation Triton 3.6 makes on sm_90 is at most that much below (the compile results above)."""
    return elem * block_d(head_dim) * (cfg.BLOCK_M + 2 * cfg.BLOCK_N * cfg.num_stages) + (512 if cfg.WS else 128)


def constraint_reasons(cfg: GluonFwdConfig, head_dim: int) -> List[str]:
    need = smem_bytes(cfg, head_dim)
    out = [f"shared memory ~{need} B > {SMEM_LIMIT} B"] if need > SMEM_LIMIT else []
    if cfg.WS and cfg.num_stages < 2:  # a consumer frees block j-1 only after it has issued S_j (jit_ws)
        out.append("WS=1 needs num_stages >= 2")
    return out


def default_train_config(head_dim: int, dtype: torch.dtype) -> GluonTrainConfig:
    """The forward's default with ``triton_flash``'s default backward for ``head_dim`` and ``dtype``."""
    f, b = default_config(head_dim), default_bwd_config(head_dim, dtype)
    return GluonTrainConfig(BLOCK_N=f.BLOCK_N, num_stages=f.num_stages, BWD_BLOCK_M=b.BWD_BLOCK_M,
                            BWD_BLOCK_N=b.BWD_BLOCK_N, BWD_WARPS=b.BWD_WARPS, BWD_STAGES=b.BWD_STAGES)


def default_config(head_dim: int) -> GluonFwdConfig:
    """Warp-specialized, 128/128 with a 3-deep ring (229.5 KB at D 128): the fastest config at every timed shape
    on an H100 (``benchmarks/results/probe_gluon_fwd_ws_h100_2026-12-07j.json``: D 64/96/128, dense and causal);
    tuned rows replace it."""
    cfg = GluonFwdConfig()
    return cfg if not constraint_reasons(cfg, head_dim) else GluonFwdConfig(num_stages=2)
