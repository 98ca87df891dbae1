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
``ATTNTUNE_CHECK=1``       validate ``kv_lens`` values on every call (one host sync): a value outside
                           ``[0, Skv]`` raises ``ValueError`` naming ``kv_lens``. Off, such values are
                           clamped to ``[0, Skv]`` by every variant and the reference alike.
``ATTNTUNE_CACHE_TIMEOUT`` seconds a plan resolution waits for a locked cache database (default 0.2):
                           past it the cache layer is skipped with one warning (heuristic dispatch).
=========================  =========================================================================

An invalid value of any switch is reported once (a ``RuntimeWarning``) saying what is used instead.

``ATTNTUNE_CACHE`` / ``ATTNTUNE_SYSTEM_CACHE`` are read by :mod:`attntune.cache.layered` when the index
is loaded, ``ATTNTUNE_TRITON`` / ``ATTNTUNE_VARIANTS`` by :func:`attntune.kernels.registry.env_reasons` and
``ATTNTUNE_GLUON`` (``0``: the ``gluon_flash`` variant stays out) by its ``supports()``
when a plan is resolved — both happen once per process (or per ``reset()``), never per call.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass
from typing import List, Optional

LOG = logging.getLogger("attntune")

POLICIES = ("tuned", "heuristic", "fixed", "online")


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(name: str, warns: List[str]) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw and raw not in _TRUE + _FALSE:
        warns.append(f"{name}={raw!r} is not 1/0 (true/false, yes/no, on/off); using 0")
    return raw in _TRUE


def _number(name: str, default, warns: List[str], cast=int, minimum=None, unset_note: str = "", maximum=None):
    """``cast(os.environ[name])``, else ``default`` with a warning when the value is not a number or is
    outside ``minimum`` .. ``maximum`` (``unset_note`` says what ``default`` means, e.g. "no limit")."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    instead = f"using {unset_note or default}"
    try:
        val = cast(raw)
    except ValueError:
        warns.append(f"{name}={raw!r} is not {'an integer' if cast is int else 'a number'}; {instead}")
        return default
    if val != val or val in (math.inf, -math.inf) or (minimum is not None and val < minimum):
        # NaN, infinite (a timeout of inf overflowed the cache's connect and dropped both caches), or out of range
        warns.append(f"{name}={raw!r} must be a finite number >= {minimum}; {instead}")
        return default
    if maximum is not None and val > maximum:
        # a finite value can overflow too (1e308 s as SQLite's busy timeout in ms: both caches dropped)
        warns.append(f"{name}={raw!r} must be at most {maximum}; {instead}")
        return default
    return val


def _variants(warns: List[str]) -> None:
    """Report ``ATTNTUNE_VARIANTS`` names no registered variant has (they are ignored, and a list with no
    known name restricts nothing: :func:`attntune.kernels.registry.allowed_variants`)."""
    from attntune.kernels import registry  # lazily: the registry imports every variant

    raw = os.environ.get("ATTNTUNE_VARIANTS", "").strip()
    names = [a.strip() for a in raw.split(",") if a.strip()]
    unknown = [n for n in names if not registry.exists(n)]
    if not unknown:
        return
    known = sorted(v.name for v in registry.all_variants())
    rest = [n for n in names if registry.exists(n)]
    warns.append(f"ATTNTUNE_VARIANTS names unknown variant(s) {', '.join(unknown)} (known: {', '.join(known)}); "
                 + (f"using {', '.join(rest)}" if rest else "ignoring it: every variant may run"))


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
    check: bool = False
    cache_timeout: float = 0.2
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
            warns.append(f"ATTNTUNE_LOG={level!r} is not info/debug/warning/error; ignoring it")
            level = None
        triton = os.environ.get("ATTNTUNE_TRITON", "").strip()
        if triton not in ("", "0", "1"):
            warns.append(f"ATTNTUNE_TRITON={triton!r} is not 0 or 1; using 1 (Triton variants may run)")
        gluon = os.environ.get("ATTNTUNE_GLUON", "").strip()
        if gluon not in ("", "0", "1"):
            warns.append(f"ATTNTUNE_GLUON={gluon!r} is not 0 or 1; using 0 (the Gluon variant stays out)")
        _variants(warns)
        return cls(
            disabled=_flag("ATTNTUNE_DISABLE", warns),
            policy=policy,
            fixed_variant=fixed,
            allow_approx=_flag("ATTNTUNE_ALLOW_APPROX", warns),
            max_seqlen=_number("ATTNTUNE_MAX_SEQLEN", None, warns, minimum=1, unset_note="no limit"),
            log_level=level,
            latency_sample=_number("ATTNTUNE_LATENCY_SAMPLE", 0, warns, minimum=0, unset_note="0 (off)"),
            online_trials=_number("ATTNTUNE_ONLINE_TRIALS", 6, warns, minimum=1),
            online_seconds=_number("ATTNTUNE_ONLINE_SECONDS", 5.0, warns, cast=float, minimum=0.1),
            check=_flag("ATTNTUNE_CHECK", warns),
            cache_timeout=_number("ATTNTUNE_CACHE_TIMEOUT", 0.2, warns, cast=float, minimum=0.0, maximum=3600.0),
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
        return self.lengths_too_long(problem.seqlen_q, problem.seqlen_kv)

    def lengths_too_long(self, seqlen_q: int, seqlen_kv: int) -> bool:
        """:meth:`too_long` from the two lengths (the hot path's family reuse has no problem model)."""
        return self.max_seqlen is not None and max(seqlen_q, seqlen_kv) > self.max_seqlen

    @property
    def policy_label(self) -> str:
        return f"fixed:{self.fixed_variant}" if self.policy == "fixed" else self.policy
