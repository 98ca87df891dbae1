"""The ``fp8_dequant`` variant: an FP8 K/V cache served by widening it first.

K and V arrive as FP8 codes (``AttentionProblem.kv_dtype``) with float32 scales, one per tensor (``[1]``)
or one per kv head (``[Hkv]``): the real values are ``codes.float() * scale`` (:mod:`attntune.fp8`). This
variant materialises them in q's dtype — a K/V-sized temporary, twice the codes' bytes — and runs the
problem on the safe path with K/V in q's dtype (torch SDPA where it takes the problem, else eager). It
runs every FP8 decode or prefill problem on any device: the runtime's fallback for FP8 calls (a CPU, a
GPU without Triton, after a failure), never a fast path (``triton_decode`` reads the codes directly).
"""

from __future__ import annotations

from typing import List, Optional

import torch

from attntune.fp8 import dequantize
from attntune.kernels import registry
from attntune.kernels.base import Config, Variant
from attntune.problem import KV_DTYPES, AttentionProblem

#: where the widened K/V go, in order: the first that supports the problem with K/V in q's dtype
SAFE = ("sdpa_default", "eager")


class Fp8DequantVariant(Variant):
    name = "fp8_dequant"
    family = "reference"
    space_depends_on_lengths = False  # no tunables
    kv_dtypes = tuple(KV_DTYPES)
    description = "FP8 K/V widened to q's dtype, then torch SDPA (else eager): the FP8 fallback"

    def supports(self, problem: AttentionProblem) -> List[str]:
        if problem.kv_dtype is None:
            return ["only FP8 K/V (K/V in q's dtype need no widening)"]
        inner = self._inner(problem)
        return [] if inner is not None else ["neither torch SDPA nor eager runs the widened problem"]

    @staticmethod
    def _inner(problem: AttentionProblem):
        wide = problem.model_copy(update={"kv_dtype": None})
        for name in SAFE:
            if registry.exists(name):
                v = registry.get(name)
                try:
                    if not v.supports(wide):
                        return v, wide
                except Exception:  # noqa: BLE001 — a buggy supports() only rules its variant out
                    continue
        return None

    def bind(self, problem: AttentionProblem, config: Config):
        """The inner variant, its problem and its bound call, chosen once per signature (not per call)."""
        inner, wide = self._inner(problem)
        inner_cfg = inner.space(wide).first()
        inner_run = inner.bind(wide, inner_cfg)

        def run(q, k, v, _problem, _config, kv_lens=None, k_scale=None, v_scale=None):
            if k_scale is None or v_scale is None:
                raise ValueError("k_scale/v_scale: required with FP8 K/V")
            return inner_run(q, dequantize(k, k_scale).to(q.dtype), dequantize(v, v_scale).to(q.dtype), wide,
                             inner_cfg, kv_lens)

        return run

    def run(self, q, k, v, problem: AttentionProblem, config: Config, kv_lens: Optional[torch.Tensor] = None,
            k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.bind(problem, config)(q, k, v, problem, config, kv_lens, k_scale, v_scale)


VARIANTS = [Fp8DequantVariant()]
