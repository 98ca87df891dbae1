"""Typed launch configs: one frozen dataclass per op, every tunable field (a *knob*) declared once.

A knob's declaration holds its default, its tuning domain (what ``attntune tune`` sweeps) and a line of
documentation; everything else derives from the class:

* the tuning :class:`~attntune.kernels.base.Space` (:meth:`LaunchConfig.space`: the knobs, the per-shape
  default, the per-shape constraint, which sees a typed config);
* the dict form the cache and the tuner store (:meth:`LaunchConfig.to_dict`; its keys are the field
  names, so rows written before the configs were typed read unchanged) and its identity
  (:func:`attntune.kernels.base.config_key`);
* parsing and checking a dict a user or a cached row gives (:meth:`LaunchConfig.from_dict`: unknown keys
  and non-integers are refused naming the key, then the op's own :meth:`LaunchConfig.problems`);
* the keyword arguments of the launcher (each op reads its fields by name).

Knobs marked ``rocm_only`` (Triton's HIP backend options) exist only on ROCm: absent from the space, the
dict form and the launch options elsewhere. Adding a knob is one field here plus its use in the launcher.
No Triton import: spaces are built where Triton is missing too.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

import torch

from attntune.kernels.base import Config, Param, Space

#: this build of torch targets ROCm (then the ``rocm_only`` knobs exist)
ON_ROCM = torch.version.hip is not None

C = TypeVar("C", bound="LaunchConfig")


@dataclass(frozen=True)
class Knob:
    """A tunable launch parameter: its tuning domain, one line of documentation, whether only ROCm has
    it, and ``valid(value)``: why a value (in the domain or not) cannot launch, None when it can."""

    choices: Tuple[Any, ...]
    doc: str
    rocm_only: bool = False
    valid: Optional[Callable[[int], Optional[str]]] = None


def knob(default: int, choices, doc: str, *, rocm_only: bool = False,
         valid: Optional[Callable[[int], Optional[str]]] = None):
    """Declare a knob: a dataclass field with its default and :class:`Knob` metadata."""
    return field(default=default, metadata={"knob": Knob(tuple(choices), doc, rocm_only, valid)})


def pow2_at_least(lo: int) -> Callable[[int], Optional[str]]:
    """``valid`` of a tile side: a power of two (``tl.arange``) of at least ``lo``."""
    return lambda v: None if v >= lo and not v & (v - 1) else f"must be a power of two >= {lo}"


def warps_valid(v: int) -> Optional[str]:
    return None if v in (1, 2, 4, 8, 16) else "must be 1, 2, 4, 8 or 16"


def at_least(lo: int, note: str = "") -> Callable[[int], Optional[str]]:
    return lambda v: None if v >= lo else f"must be >= {lo}{note}"


class LaunchConfig:
    """Base of the typed configs (subclasses are frozen dataclasses whose fields are all knobs)."""

    #: the name errors use for the argument that carried the config
    ARG: ClassVar[str] = "config"

    @classmethod
    @functools.cache
    def knobs(cls, rocm: bool = ON_ROCM) -> Tuple[Tuple[str, Knob], ...]:
        """(name, knob) in declaration order, the ``rocm_only`` ones only when ``rocm``."""
        out = []
        for f in dataclasses.fields(cls):
            k = f.metadata.get("knob")
            if k is None:
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with knob()")
            if rocm or not k.rocm_only:
                out.append((f.name, k))
        return tuple(out)

    @classmethod
    def names(cls, rocm: bool = ON_ROCM) -> Tuple[str, ...]:
        return tuple(n for n, _ in cls.knobs(rocm))

    @classmethod
    def coerce(cls, name: str, value: Any) -> int:
        """One value of a dict as the field's int (an op may accept spellings such as ``"auto"``)."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{cls.ARG}: {name} must be an integer, got {value!r}")
        return value

    @classmethod
    def from_dict(cls: Type[C], config: Optional[Mapping[str, Any]], rocm: bool = ON_ROCM) -> C:
        """The typed config of ``config`` (None or empty: the declared defaults; missing knobs take their
        default). Raises ValueError naming the key: unknown keys, non-integers, :meth:`problems`."""
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise ValueError(f"{cls.ARG}: expected a dict or {cls.__name__}, got {type(config).__name__}")
        names = cls.names(rocm)
        unknown = sorted(set(config) - set(names))
        if unknown:
            raise ValueError(f"{cls.ARG}: unknown keys {unknown} (known: {list(names)})")
        cfg = cls(**{k: cls.coerce(k, v) for k, v in config.items()})
        bad = cfg.problems()
        if bad:
            raise ValueError(f"{cls.ARG}: " + "; ".join(bad))
        return cfg

    def problems(self) -> List[str]:
        """Why this config cannot launch at all, whatever the shape (empty = it can): each knob's
        ``valid``."""
        out = []
        for n, k in self.knobs():
            msg = k.valid(getattr(self, n)) if k.valid is not None else None
            if msg:
                out.append(f"{n} {msg}, got {getattr(self, n)}")
        return out

    def to_dict(self, rocm: bool = ON_ROCM) -> Config:
        """The stored (cache, tuner) form: knob name -> value."""
        return {n: getattr(self, n) for n in self.names(rocm)}

    def replace(self: C, **changes) -> C:
        return dataclasses.replace(self, **changes)

    @classmethod
    def space(cls, default: "LaunchConfig", constraint: Optional[Callable[[Any], List[str]]] = None,
              rocm: bool = ON_ROCM) -> Space:
        """The tuning space: every knob over its domain, ``default`` first, ``constraint`` (reasons a
        typed config of this class does not fit a shape; empty = fits) on each combination."""
        params = tuple(Param(n, k.choices) for n, k in cls.knobs(rocm))

        def check(cfg: Config) -> List[str]:
            return constraint(cls(**cfg)) if constraint is not None else []

        return Space(params=params, constraint=check, default=default.to_dict(rocm))


def typed(cls: Type[C], config: Any, default: C) -> C:
    """``config`` as a ``cls``: itself, parsed from a dict, or ``default`` for None."""
    if config is None:
        return default
    if isinstance(config, cls):
        return config
    return cls.from_dict(config)


def cached_parser(cls: Type[C]) -> Callable[[Config], C]:
    """A parser of stored dicts for a variant's hot path: one :meth:`LaunchConfig.from_dict` per distinct
    dict, then a dict lookup (the runtime hands the same plan config to every call)."""
    memo: Dict[Tuple, C] = {}

    def parse(config: Config) -> C:
        key = tuple(config.items())
        cfg = memo.get(key)
        if cfg is None:
            cfg = memo.setdefault(key, cls.from_dict(config))
        return cfg

    return parse
