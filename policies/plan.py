"""Plans: the decision for one problem (which variant, which config, and why), and the plan cache.

A :class:`Plan` is resolved once per problem by :mod:`attntune.policies.policy` and kept in memory;
``plan.run(q, k, v, kv_lens)`` is one call into the chosen variant. :func:`plan` is the public entry:
``plan(problem)`` → the cached plan for that :class:`~attntune.problem.AttentionProblem` (problems are
frozen and hashable, so the problem itself is the dict key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Literal, Optional, Tuple

import torch

from attntune.kernels.base import Variant
from attntune.key import TuneKey, config_key
from attntune.problem import AttentionProblem

#: where a plan came from:
#: ``tuned`` — the exact key's cached winner; ``hint`` — its row tuned here under other software versions;
#: ``nearest`` — the winner of the nearest tuned bucket; ``sibling`` — a row tuned on another device of the
#: same architecture (e.g. an H100's for an H200);
#: ``heuristic`` — the rule table of :mod:`attntune.policies.policy`; ``fixed`` — ``ATTNTUNE_POLICY=fixed:NAME``;
#: ``online`` — tuned in this process by the online policy; ``fallback`` — the safe variant (torch SDPA,
#: else eager): ``ATTNTUNE_DISABLE``, above ``ATTNTUNE_MAX_SEQLEN``, or after the planned variant failed.
Source = Literal["tuned", "hint", "nearest", "sibling", "heuristic", "fixed", "online", "fallback"]


_MEASURED_WHERE = {"nearest": "  (measured at the neighbouring bucket)",
                   "sibling": "  (measured on a sibling device)"}


@dataclass(frozen=True, eq=False)
class Plan:
    """The implementation one problem is dispatched to.

    ``expected_ms`` is the measured median of the row the plan came from (for ``nearest`` it was
    measured at the neighbour's bucket, not at this shape; for ``sibling`` on another device); None when
    nothing was measured.
    ``reasons`` says why, in the order the decision was made (first: what was looked up; last: what
    was chosen).
    """

    variant: str
    config: Dict[str, Any]
    source: Source
    problem: AttentionProblem
    key: Optional[TuneKey] = None
    expected_ms: Optional[float] = None
    #: relative noise of ``expected_ms`` (the tuner's confirmation round); None where not measured
    expected_spread: Optional[float] = None
    runner_up: Optional[str] = None
    runner_up_ms: Optional[float] = None
    reasons: Tuple[str, ...] = ()
    impl: Optional[Variant] = field(default=None, repr=False)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            kv_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One call into the variant: q [B, Hq, Sq, D], k/v [B, Hkv, Skv, D] → [B, Hq, Sq, Dv].

        The tensors must match ``self.problem`` (shapes, dtype, semantics); nothing is checked here —
        that is the caller's contract, which keeps this a single call."""
        return self.impl.run(q, k, v, self.problem, self.config, kv_lens)

    @property
    def config_json(self) -> str:
        return config_key(self.config)

    @property
    def key_id(self) -> Optional[str]:
        return self.key.key_id if self.key is not None else None

    def to_dict(self) -> Dict[str, Any]:
        """JSON-able description (``attntune explain --json``, ``attntune.stats()``)."""
        return {
            "problem": self.problem.short(), "variant": self.variant, "config": self.config,
            "source": self.source, "key_id": self.key_id, "expected_ms": self.expected_ms,
            "expected_spread": self.expected_spread,
            "runner_up": self.runner_up, "runner_up_ms": self.runner_up_ms, "reasons": list(self.reasons),
        }

    def describe(self) -> str:
        """A few human lines: what runs, where the decision came from, and why."""
        cfg = " ".join(f"{k}={v}" for k, v in self.config.items()) or "-"
        lines = [f"problem   {self.problem.short()}",
                 f"variant   {self.variant}  config {cfg}",
                 f"source    {self.source}" + (f"  (key {self.key_id})" if self.key is not None else "")]
        if self.expected_ms is not None:
            spread = f" ±{self.expected_spread * 100:.1f}%" if self.expected_spread is not None else ""
            lines.append(f"expected  {self.expected_ms:.4f} ms{spread}"
                         + _MEASURED_WHERE.get(self.source, ""))
        if self.runner_up:
            lines.append(f"runner-up {self.runner_up}"
                         + (f"  {self.runner_up_ms:.4f} ms" if self.runner_up_ms is not None else ""))
        lines.extend(f"why       {r}" for r in self.reasons)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()
