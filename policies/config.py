"""Runtime switches, read from the environment once when the runtime first initialises.

``attntune.reset()`` re-reads them (and drops every plan). Reading them once keeps the hot path free of
``os.environ`` look-ups and makes a process's dispatch decisions consistent for its whole life.

=========================  =========================================================================
``ATTNTUNE_DISABLE=1``     ``attention()`` and the patched SDPA go straight to torch SDPA (``attention``
                           uses the eager variant where SDPA cannot run the problem); no cache, no plans.
``ATTNTUNE_POLICY``        ``tuned`` (default) | ``heuristic`` | ``fixed:NAME`` | ``online``.
``ATTNTUNE_ALLOW_APPROX``  ``1``: approximate variants (Nyström) may serve calls that pass ``approx=None``.
``ATTNTUNE_MAX_SEQLEN``    calls with ``max(Sq, Skv)`` above it get the safe fallback, never a tuned kernel.
``ATTNTUNE_LOG``           ``info`` / ``debug``: log plan decisions on ``logging.getLogger("attntune")``
                           (once per plan, never per call).
``ATTNTUNE_LATENCY_SAMPLE``  ``N``: time every Nth call of each plan (CUDA events on GPU, a host clock on
                           CPU) for the P50/P95/P99 in ``attntune.stats()``; 0 (default) = off.
``ATTNTUNE_ONLINE_TRIALS`` trials per key for the ``online`` policy (default 6).
``ATTNTUNE_ONLINE_SECONDS`` wall-time budget per key for the ``online`` policy (default 5).
=========================  =========================================================================

``ATTNTUNE_CACHE`` / ``ATTNTUNE_SYSTEM_CACHE`` are read by :mod:`attntune.cache.layered` when the index
is loaded, and ``ATTNTUNE_TRITON`` / ``ATTNTUNE_VARIANTS`` by :func:`attntune.kernels.registry.env_reasons`
when a plan is resolved — both happen once per process (or per ``reset()``), never per call.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Optional

LOG = logging.getLogger("attntune")

POLICIES = ("tuned", "heuristic", "fixed", "online")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _int(name: str, default: Optional[int]) -> Optional[int]:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        LOG.warning("%s=%r is not an integer; ignoring it", name, raw)
        return default


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        LOG.warning("%s=%r is not a number; ignoring it", name, raw)
        return default


@dataclass(frozen=True)
class RuntimeConfig:
    """The environment switches as the runtime uses them (see the module docstring)."""

    disabled: bool = False
    policy: str = "tuned"
    fixed_variant: Optional[str] = None
    allow_approx: bool = False
    max_seqlen: Optional[int] = None
    log_level: Optional[str] = None
    latency_sample: int = 0
    online_trials: int = 6
    online_seconds: float = 5.0
    #: problems in the policy string that could not be parsed (reported once by the runtime)
    warnings: tuple = ()

    @classmethod
    def from_env(cls) -> "RuntimeConfig":
        warns = []
        raw = os.environ.get("ATTNTUNE_POLICY", "").strip() or "tuned"
        policy, _, arg = raw.partition(":")
        policy = policy.strip().lower()
        fixed = None
        if policy == "fixed":
            fixed = arg.strip() or None
            if fixed is None:
                warns.append(f"ATTNTUNE_POLICY={raw!r} names no variant (fixed:NAME); using 'tuned'")
                policy = "tuned"
        elif policy not in POLICIES:
            warns.append(f"ATTNTUNE_POLICY={raw!r} is not one of tuned, heuristic, fixed:NAME, online; "
                         "using 'tuned'")
            policy = "tuned"
        level = os.environ.get("ATTNTUNE_LOG", "").strip().lower() or None
        if level is not None and level not in ("info", "debug", "warning", "error"):
            warns.append(f"ATTNTUNE_LOG={level!r} is not info/debug; ignoring it")
            level = None
        max_seqlen = _int("ATTNTUNE_MAX_SEQLEN", None)
        if max_seqlen is not None and max_seqlen < 0:
            max_seqlen = None
        return cls(
            disabled=_flag("ATTNTUNE_DISABLE"),
            policy=policy,
            fixed_variant=fixed,
            allow_approx=_flag("ATTNTUNE_ALLOW_APPROX"),
            max_seqlen=max_seqlen,
            log_level=level,
            latency_sample=max(0, _int("ATTNTUNE_LATENCY_SAMPLE", 0) or 0),
            online_trials=max(1, _int("ATTNTUNE_ONLINE_TRIALS", 6) or 6),
            online_seconds=max(0.1, _float("ATTNTUNE_ONLINE_SECONDS", 5.0)),
            warnings=tuple(warns),
        )

    def apply_logging(self) -> None:
        """Honour ``ATTNTUNE_LOG``: set the level of the ``attntune`` logger and, if nothing would print
        its records, attach one stderr handler (only ours; the root logger is left alone)."""
        if self.log_level is None:
            return
        LOG.setLevel(getattr(logging, self.log_level.upper()))
        if not LOG.handlers and not logging.getLogger().handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter("attntune %(levelname)s: %(message)s"))
            h._attntune = True  # type: ignore[attr-defined]  # marks our handler so reset() does not stack them
            LOG.addHandler(h)

    def too_long(self, problem) -> bool:
        """True when ``ATTNTUNE_MAX_SEQLEN`` keeps ``problem`` on the safe fallback."""
        return self.max_seqlen is not None and max(problem.seqlen_q, problem.seqlen_kv) > self.max_seqlen

    @property
    def policy_label(self) -> str:
        return f"fixed:{self.fixed_variant}" if self.policy == "fixed" else self.policy
