"""torch FlexAttention as a variant: ``torch.compile(flex_attention)`` with a block mask built from the
problem's causal/window semantics (see :mod:`attntune.problem`), so fully masked tiles are skipped.

q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] -> [B, Hq, Sq, Dv]; GQA through
``enable_gqa``. Row ``i`` attends ``j`` iff ``j <= i + off`` (causal) and
``i + off - l <= j <= i + off + r`` (window), ``off = Skv - Sq`` (bottom-right) or 0 (top-left).
Rows with no admissible key come back as zeros (FlexAttention's own convention, checked by the tests).

The block mask depends only on the problem, so it is built once per problem and kept (bounded LRU).
Per-sequence ``kv_lens`` would change the mask every call and are not taken. Offered only for problems
SDPA cannot run without a materialised mask (windows, bottom-right causal with Sq != Skv), since every
new shape costs a compile. On the CPU it is not offered (a ~10 s inductor compile per shape, and no
backward); tests call ``run`` directly.
"""

from __future__ import annotations

import functools
from typing import List, Optional

import torch

from attntune.kernels.base import Config, Variant
from attntune.kernels.masks import needs_mask
from attntune.problem import AttentionProblem

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5
    flex_attention = create_block_mask = None


@functools.lru_cache(maxsize=1)
def _compiled():
    # One compiled callable for every shape: dynamo recompiles per new shape (then marks sizes
    # dynamic), which is the same cost FlexAttention users pay.
    return torch.compile(flex_attention)


def _mask_mod(problem: AttentionProblem):
    left, right = problem.window_bounds
    off = problem.offset

    def mod(b, h, i, j):
        ok = j >= 0
        if right is not None:
            ok = ok & (j <= i + off + right)
        if left is not None:
            ok = ok & (j >= i + off - left)
        return ok

    return mod


@functools.lru_cache(maxsize=256)
def _block_mask(problem: AttentionProblem, device: torch.device):
    left, right = problem.window_bounds
    if left is None and right is None:
        return None
    return create_block_mask(_mask_mod(problem), None, None, problem.seqlen_q, problem.seqlen_kv,
                             device=device)


class FlexVariant(Variant):
    name = "flex"
    family = "flex"
    description = "torch FlexAttention (torch.compile) with a block mask for causal/window"
    source_modules = ("attntune.kernels.flex",)
    # Its torch.compile'd flex_attention does not run inside attntune's custom op at an outer compiled
    # graph's run time: H100, torch 2.11, a compiled window training step: "NYI: querying is_contiguous
    # inside of vmap" (the flex HOP's eager path), which quarantined Flex for the whole process; CPU, torch
    # 2.13: a fake-tensor error in the inner compile, warmed up or not (benchmarks/bench_compile_train.py)
    runs_in_compiled_op = False

    def supports(self, problem: AttentionProblem) -> List[str]:
        reasons = []
        if flex_attention is None:
            reasons.append("this torch has no FlexAttention")
        if problem.device_type != "cuda":
            reasons.append("needs a CUDA/ROCm device (a CPU compile per shape costs ~10 s)")
        if problem.kv_lens:
            reasons.append("kv_lens change the block mask every call")
        if problem.dtype == "float64":
            reasons.append("float64 not supported")
        if problem.seqlen_q == 0 or problem.seqlen_kv == 0:
            reasons.append("empty sequence")
        if problem.head_dim != problem.head_dim_v:
            reasons.append("head_dim_v != head_dim")
        if not reasons and not needs_mask(problem):
            # Each shape costs a compile (tens of seconds at tune time); where SDPA runs the problem
            # without a mask its fused backends are at least as fast, so Flex is not offered there.
            reasons.append("plain or top-left causal problem: SDPA's fused backends cover it")
        return reasons

    def run(self, q, k, v, problem: AttentionProblem, config: Config,
            kv_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
        bm = _block_mask(problem, q.device)
        return _compiled()(q, k, v, block_mask=bm, scale=problem.scale, enable_gqa=problem.group > 1)


VARIANTS = [FlexVariant()] if flex_attention is not None else []
