"""The eager variant: attention written with torch matmuls and a materialised mask.

Runs every exact problem attntune knows (any mask, kv_lens, GQA, alignment) on any device — the safe
fallback of the runtime, and the "eager attention" of the end-to-end benchmarks. O(Sq·Skv) memory.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from attntune.kernels.base import Config, Variant
from attntune.kernels.reference import masked_softmax_attention
from attntune.problem import AttentionProblem

# Above this many score elements per call the materialised score matrix is a memory hazard.
_MAX_SCORES = 1 << 34


class EagerVariant(Variant):
    name = "eager"
    family = "reference"
    space_depends_on_lengths = False  # no tunables
    description = "torch matmul + softmax with a materialised mask (safe fallback, O(S^2) memory)"

    def supports(self, problem: AttentionProblem) -> List[str]:
        n = problem.batch * problem.heads_q * problem.seqlen_q * problem.seqlen_kv
        if n > _MAX_SCORES:
            return [f"score matrix of {n} elements would not fit"]
        return []

    def run(self, q, k, v, problem: AttentionProblem, config: Config,
            kv_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
        # In float32 at least: a 16-bit QK^T rounds every logit before the softmax (bf16: errors of 4-5e-2
        # on random data, 0.34 at scale 0.5, against SDPA's ~1e-2). The score matrix is float32 either way
        # (the softmax's), so memory grows only by float32 copies of q, k and v.
        cd = torch.promote_types(q.dtype, torch.float32)
        return masked_softmax_attention(q, k, v, problem, kv_lens, compute_dtype=cd).to(q.dtype)


VARIANTS = [EagerVariant()]
