"""The variant contract: what every attention implementation declares to the tuner and the runtime.

Call order (who calls what, when):

* ``supports(problem)`` — by the tuner when it builds a key's candidates, by the runtime policy when it
  resolves a plan (once per shape signature), and by ``attntune doctor``. Cheap, no device work.
* ``space(problem)`` — by the tuner (to sample configs) and by the cache reader (to validate a stored
  config before it is ever executed). Must be deterministic for a problem.
* ``run(q, k, v, problem, config, kv_lens)`` — on the hot path, for every call. ``config`` has been
  validated against ``space(problem)`` already; ``run`` must not re-validate it.
* ``reuse_reasons(problem, config)`` — by the runtime, for the first call of a never-seen shape whose
  bucket already has a plan on this variant (a decode loop's new KV length, say): may the plan serve
  the exact shape? Must be cheap (it runs on a call's path once per new shape).
* ``source_hash()`` — once per process; stored with tuned rows so a kernel change makes them stale.
  ``accepts_source(stored)`` — by the cache reader: is a row written under ``stored`` still this
  variant's (the current hash, or one of :attr:`Variant.equivalent_sources`)?
"""

from __future__ import annotations

import abc
import functools
import hashlib
import inspect
import itertools
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from attntune.kernels import equivalences
from attntune.problem import AttentionProblem

Config = Dict[str, Any]


@dataclass(frozen=True)
class Param:
    """One tunable launch parameter with a finite, ordered domain."""

    name: str
    choices: Tuple[Any, ...]

    def __post_init__(self):
        if not self.choices:
            raise ValueError(f"Param {self.name}: empty domain")


@dataclass(frozen=True)
class Space:
    """A variant's tunable parameters for one problem.

    ``constraint(config)`` returns the reasons a combination is invalid (shared memory, register
    pressure, …); an empty list means valid. ``default`` is tried first and used by heuristics.
    """

    params: Tuple[Param, ...] = ()
    constraint: Optional[Callable[[Config], List[str]]] = field(default=None, compare=False)
    default: Optional[Config] = None

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def raw_size(self) -> int:
        n = 1
        for p in self.params:
            n *= len(p.choices)
        return n

    def validate(self, config: Any) -> List[str]:
        """Reasons ``config`` must not be executed (empty = valid). Never raises."""
        if not isinstance(config, dict):
            return [f"config is {type(config).__name__}, not an object"]
        reasons = []
        extra = set(config) - set(self.names)
        if extra:
            reasons.append(f"unknown parameters {sorted(extra)}")
        for p in self.params:
            if p.name not in config:
                reasons.append(f"missing parameter {p.name}")
            elif config[p.name] not in p.choices or type(config[p.name]) is not type(p.choices[0]):
                reasons.append(f"{p.name}={config[p.name]!r} outside {list(p.choices)}")
        if not reasons and self.constraint is not None:
            reasons.extend(self.constraint(config))
        return reasons

    def grid(self) -> Iterator[Config]:
        """Every valid config, in declaration order (first choices first)."""
        for values in itertools.product(*(p.choices for p in self.params)):
            cfg = dict(zip(self.names, values))
            if self.constraint is None or not self.constraint(cfg):
                yield cfg

    def first(self) -> Config:
        """The default config if valid, else the first valid one of the grid."""
        if self.default is not None and not self.validate(self.default):
            return dict(self.default)
        for cfg in self.grid():
            return cfg
        raise ValueError("space has no valid configuration")


class Variant(abc.ABC):
    """One attention implementation. Subclasses are instantiated once and registered."""

    #: unique registry name, e.g. ``"sdpa_flash"`` or ``"triton_flash"``
    name: ClassVar[str]
    #: False for approximations (Nyström): never chosen unless approximation is allowed
    exact: ClassVar[bool] = True
    #: one line for ``attntune doctor`` / ``explain``
    description: ClassVar[str] = ""
    #: "sdpa", "triton", "reference", "flex": for filters (ATTNTUNE_TRITON=0) and reports
    family: ClassVar[str] = "other"
    #: modules whose source defines this variant's numerics/speed (hashed into the fingerprint)
    source_modules: ClassVar[Sequence[str]] = ()
    #: False when ``space(problem)`` depends only on what a plan's family fixes exactly (dtype, head
    #: dims, heads, mask kind, mode, device — not batch or sequence lengths): a config valid for one
    #: shape of a family is then valid for all of them, and :meth:`reuse_reasons` skips re-validating it.
    space_depends_on_lengths: ClassVar[bool] = True
    #: FP8 K/V formats (``AttentionProblem.kv_dtype``) this variant reads, with the call's float32
    #: ``k_scale``/``v_scale`` passed to :meth:`run` and bound callables as two more positional arguments
    #: after ``kv_lens``. Empty (the default): K/V only in q's dtype — :func:`registry.reasons` keeps the
    #: variant from FP8 problems, so a variant never receives codes it would read as numbers.
    kv_dtypes: ClassVar[Tuple[str, ...]] = ()
    #: With FP8 K/V, this variant also quantises q and the probabilities to the codes' format for FP8
    #: tensor-core dots (the flash forward): its output is within :data:`attntune.tolerances.FP8_FWD` of
    #: attention over the dequantised K/V rather than within q's dtype's tolerance — the gate holds it to
    #: that. False: FP8 codes are widened exactly and the dots run in a 16-bit type (triton_decode).
    fp8_dots: ClassVar[bool] = False
    #: False for a variant that cannot run inside attntune's opaque custom op (``attntune::attention``,
    #: what a call becomes under an outer ``torch.compile``): the op's calls then take the plan decided
    #: without it (its runner-up row, the next rule), eager calls keep it.
    runs_in_compiled_op: ClassVar[bool] = True

    @abc.abstractmethod
    def supports(self, problem: AttentionProblem) -> List[str]:
        """Reasons this variant cannot run ``problem`` on this machine; empty = it can."""

    def space(self, problem: AttentionProblem) -> Space:
        """Tunable parameters for ``problem`` (default: none)."""
        return Space()

    def reuse_reasons(self, problem: AttentionProblem, config: Config) -> List[str]:
        """Reasons a plan on this variant with ``config``, decided for another shape of ``problem``'s
        family, cannot serve ``problem`` (empty = it can): :meth:`supports`, plus the config's validity
        when the space depends on lengths."""
        out = self.supports(problem)
        if not out and self.space_depends_on_lengths:
            out = self.space(problem).validate(config)
        return out

    def family_generic(self, problem: AttentionProblem, config: Config) -> bool:
        """True when :meth:`bind`'s callable for ``problem`` serves *every* shape of ``problem``'s family
        (what its tuning key fixes: canonical mask, heads, head dims, dtype, mode, device; batch and
        lengths anywhere in their buckets) from the tensors alone — the mask, scale and config it keeps
        are the family's — and :meth:`reuse_reasons` is empty for all of them. The runtime then keeps
        one slot for the whole family: a decode loop, whose KV length is new every step, pays a dict
        store per new length instead of a problem model, a slot and a bound callable. Default False."""
        return False

    def bind(self, problem: AttentionProblem, config: Config) -> Callable[..., torch.Tensor]:
        """A callable with :meth:`run`'s signature for calls of exactly ``problem``'s signature (shapes,
        dtypes, mask, mode) with ``config``: what the runtime keeps per call signature and the tuner times.
        A variant whose host path matters (decode: an eager step is host-bound) returns an object that
        prepares its launches once instead of per call; the default is :meth:`run` itself."""
        return self.run

    @abc.abstractmethod
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem,
            config: Config, kv_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Compute attention: q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] ->
        out [B, Hq, Sq, Dv] in q's dtype, with the mask semantics of :mod:`attntune.problem`.
        Differentiable when ``problem.mode == "fwd_bwd"``."""

    def forward_saving(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem,
                       config: Config, kv_lens: Optional[torch.Tensor] = None
                       ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The forward of a training call (``problem.mode == "fwd_bwd"``) split from its backward, for the
        compiled op (``attntune::attention``), whose backward otherwise recomputes the forward: the output
        and the row log-sum-exp ``lse [B, Hq, Sq]`` float32 (natural log of the sum of
        ``exp(scale * q.k)`` over the admitted keys), without autograd — or ``None`` when this variant (or
        this call) keeps no such residuals. Default ``None``."""
        return None

    def backward_saved(self, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, problem: AttentionProblem, config: Config,
                       kv_lens: Optional[torch.Tensor] = None
                       ) -> Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """dq, dk, dv of the call whose :meth:`forward_saving` returned ``(out, lse)`` (same problem and
        config) — or ``None`` exactly where :meth:`forward_saving` returns ``None`` (``lse`` is then not
        this call's: the caller recomputes). Default ``None``, as :meth:`forward_saving`'s."""
        return None

    @functools.cached_property
    def _hash(self) -> str:
        h = hashlib.sha1(self.name.encode())
        modules = list(self.source_modules) or [type(self).__module__]
        for mod in modules:
            m = sys.modules.get(mod)
            if m is None:
                __import__(mod)
                m = sys.modules[mod]
            try:
                h.update(inspect.getsource(m).encode())
            except (OSError, TypeError):
                h.update(mod.encode())
        return h.hexdigest()[:16]

    def source_hash(self) -> str:
        return self._hash

    @property
    def equivalent_sources(self) -> Dict[str, str]:
        """Source hashes of earlier versions whose rows stay valid, each with why (declared in
        :mod:`attntune.kernels.equivalences`, which says when; they hold only for the source they were declared
        against)."""
        return equivalences.earlier(self.name)

    def accepts_source(self, stored_hash: str, key: Optional[Any] = None) -> bool:
        """True when a row written under ``stored_hash`` for ``key`` (its ``TuneKey``) measured this variant as it
        runs now: the same source, or one declared equivalent to this very source — for all keys, or for
        ``key``'s kind (:mod:`attntune.kernels.equivalences`)."""
        return equivalences.accepts(self.name, self._hash, stored_hash, key)

    def __repr__(self) -> str:
        return f"<variant {self.name}>"


def gpu_only_reasons(problem: AttentionProblem) -> List[str]:
    return [] if problem.device_type == "cuda" else ["needs a CUDA/ROCm device"]
