"""The variant registry: the one place that knows which implementations exist.

Nothing else in attntune branches on variant names; it asks the registry and the variants.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Dict, FrozenSet, List, NamedTuple, Optional, Tuple

from attntune.kernels.base import Variant
from attntune.problem import AttentionProblem

_REGISTRY: Dict[str, Variant] = {}


class Quirk(NamedTuple):
    """A wrong result of the library under a variant (torch, a driver), not of the variant's own code:
    the variant is kept from the problems ``when`` selects on ``device_types``, with ``why``. Kept here,
    not in the variants' ``supports()``, because it is a fact about the library a variant calls (a new
    torch may fix it; say which version showed it) and the variants' source is hashed into tuned rows."""
    variants: FrozenSet[str]
    device_types: FrozenSet[str]
    when: Callable[[AttentionProblem], bool]
    why: str


def _causal_nonpositive_scale(p: AttentionProblem) -> bool:
    # Causal with a scale <= 0. Only the calls the SDPA variants make with is_causal=True (no materialised
    # mask) go wrong, but whether a mask is needed depends on the exact lengths, and a plan is shared by a
    # family of lengths: the test stays on what the family fixes (canonical mask, scale).
    return p.causal and p.scale is not None and p.scale <= 0


def _bf16_under_triton_interpreter(p: AttentionProblem) -> bool:
    # Read per call, not at import: tests and users switch the interpreter on in the environment.
    return p.dtype == "bfloat16" and os.environ.get("TRITON_INTERPRET") == "1"


#: Known wrong results (each found by a test that compares against the float64 reference).
QUIRKS: Tuple[Quirk, ...] = (
    # torch 2.13 CPU: the flash kernel (SDPA's CPU default) fills masked scores with -inf times the scale:
    # NaN at scale 0, +inf below; with a boolean mask, or the math backend, the result is right
    Quirk(frozenset({"sdpa_default", "sdpa_flash"}), frozenset({"cpu"}), _causal_nonpositive_scale,
          "torch's CPU flash kernel returns NaN for is_causal with a scale <= 0 (seen with torch 2.13)"),
    # torch 2.11 + CUDA 13 on the H200: SDPA's flash and cuDNN kernels (and the default, which picks them)
    # return NaN for is_causal with a scale <= 0 too (tests/test_edge_calls.py); the efficient and math
    # backends are right. Kept on ROCm as well (its flash kernel is untested here: no AMD GPU).
    Quirk(frozenset({"sdpa_default", "sdpa_flash", "sdpa_cudnn"}), frozenset({"cuda"}), _causal_nonpositive_scale,
          "torch's CUDA flash and cuDNN kernels return NaN for is_causal with a scale <= 0 (seen with torch 2.11)"),
    # Triton's interpreter (TRITON_INTERPRET=1: how Triton kernels run without a GPU) computes bfloat16
    # tl.dot wrong — errors of 1e8 and more with Triton 3.6-3.9 (DESIGN.md; benchmarks/diag_split_d.py
    # runs its CPU smoke in float16 for this reason): the Triton variants are kept from such calls there
    Quirk(frozenset({"triton_flash", "triton_local", "triton_decode"}), frozenset({"cpu"}),
          _bf16_under_triton_interpreter,
          "Triton's interpreter computes bfloat16 dots wrong (TRITON_INTERPRET=1, seen with Triton 3.6-3.9)"),
)


def quirk_reasons(variant: Variant, problem: AttentionProblem) -> List[str]:
    """The :data:`QUIRKS` that keep ``variant`` from ``problem`` (their ``why``), else []."""
    return [q.why for q in QUIRKS if variant.name in q.variants and problem.device_type in q.device_types
            and q.when(problem)]


def register(variant: Variant) -> Variant:
    """Add a variant instance. Names are unique; re-registering the same class is a no-op."""
    name = variant.name
    old = _REGISTRY.get(name)
    if old is not None and type(old) is not type(variant):
        raise ValueError(f"variant name {name!r} already registered by {type(old).__name__}")
    _REGISTRY[name] = variant
    return variant


def unregister(name: str) -> None:
    """Remove a variant (tests use this to add throw-away variants)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> Variant:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown variant {name!r}; known: {sorted(_REGISTRY)}") from None


def exists(name: str) -> bool:
    return name in _REGISTRY


def all_variants() -> List[Variant]:
    return list(_REGISTRY.values())


def env_reasons(variant: Variant) -> List[str]:
    """Reasons the environment switches exclude a variant (``ATTNTUNE_TRITON``, ``ATTNTUNE_VARIANTS``)."""
    reasons = []
    if os.environ.get("ATTNTUNE_TRITON", "1").strip() == "0" and variant.family == "triton":  # as config reads it
        reasons.append("ATTNTUNE_TRITON=0")
    allow = allowed_variants()
    if allow is not None and variant.name not in allow:
        reasons.append("not in ATTNTUNE_VARIANTS")
    return reasons


def allowed_variants() -> Optional[frozenset]:
    """The registered names ``ATTNTUNE_VARIANTS`` lists, or None (no restriction) when it is unset or names
    no registered variant — a typo must not silently disable every variant; the runtime warns about
    unknown names once (:mod:`attntune.policies.config`)."""
    raw = os.environ.get("ATTNTUNE_VARIANTS", "").strip()
    if not raw:
        return None
    names = frozenset(a.strip() for a in raw.split(",") if a.strip() in _REGISTRY)
    return names or None


def kv_reasons(variant: Variant, problem: AttentionProblem) -> List[str]:
    """Why ``variant`` cannot read ``problem``'s K/V (an FP8 format it does not declare), else []."""
    if problem.kv_dtype is None or problem.kv_dtype in variant.kv_dtypes:
        return []
    return [f"K/V in {problem.kv_dtype}: reads only " + (", ".join(variant.kv_dtypes) + " codes or "
                                                          if variant.kv_dtypes else "") + "q's dtype"]


def reasons(variant: Variant, problem: AttentionProblem, env: bool = True) -> List[str]:
    """Everything that keeps ``variant`` from ``problem``: environment (unless ``env`` is False: the safe
    fallback ignores allow-lists), K/V format, known library bugs, exactness, its own supports()."""
    out = (env_reasons(variant) if env else []) + kv_reasons(variant, problem) + quirk_reasons(variant, problem)
    if not variant.exact and not problem.approx:
        out.append("approximate; the call did not allow approximation")
    try:
        out.extend(variant.supports(problem))
    except Exception as e:  # a buggy supports() must not take the caller down
        out.append(f"supports() raised {type(e).__name__}: {e}")
    return out


def candidates(problem: AttentionProblem) -> List[Variant]:
    """Variants that can run ``problem`` here (exact ones, plus approximate ones if allowed)."""
    return [v for v in _REGISTRY.values() if not reasons(v, problem)]


def explain_candidates(problem: AttentionProblem) -> List[Tuple[Variant, List[str]]]:
    return [(v, reasons(v, problem)) for v in _REGISTRY.values()]


def _register_with_the_cache() -> None:
    """Hand this registry to the cache's row judging (the cache never imports the kernels)."""
    from attntune.cache import models

    models.set_variant_lookup(sys.modules[__name__])


_register_with_the_cache()
