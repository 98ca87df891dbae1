"""Tuning keys: a problem with its sizes bucketed, plus the device fingerprint.

Any runtime call maps to a key; buckets only decide which measurement speaks for a call, never what is
computed (every kernel is correct for any shape under any valid config).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Annotated, Any, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field

from attntune.device import DeviceFingerprint
from attntune.problem import SIZE_MAX, AttentionProblem, Align, Mode


def bucket(n: int) -> int:
    """The bucket of a size (sequence length or batch): exact up to 16, then the next value of the
    series 16, 24, 32, 48, 64, 96, 128, … (powers of two and their midpoints, 1.5·2^k), rounding up.

    >>> [bucket(n) for n in (0, 1, 2, 3, 15, 16, 17, 24, 25, 97, 1000, 1024, 1025, 2048, 4097)]
    [0, 1, 2, 3, 15, 16, 24, 24, 32, 128, 1024, 1024, 1536, 2048, 6144]
    >>> bucket(-1)
    Traceback (most recent call last):
    ...
    ValueError: n: must be >= 0, got -1
    """
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    if n <= 16:
        return n
    p = 1 << (n - 1).bit_length()  # next power of two >= n
    mid = 3 * p // 4
    return mid if n <= mid else p


def window_bucket(w: int) -> int:
    """Window sides are bucketed like sizes; -1 (unbounded) stays -1.

    >>> [window_bucket(w) for w in (-1, 0, 5, 100, 1024, 4000)]
    [-1, 0, 5, 128, 1024, 4096]
    """
    return -1 if w < 0 else bucket(w)


def log_distance(a: int, b: int) -> float:
    """Distance between two sizes on a log scale (used to find the nearest tuned bucket).

    >>> log_distance(1024, 2048) == log_distance(2048, 4096)
    True
    """
    return abs(math.log2(max(a, 1)) - math.log2(max(b, 1)))


#: A key's sizes: what a kernel can be launched with (an import of batch=-1 or heads=1e20 was stored valid).
_Size = Annotated[int, Field(strict=True, ge=1, le=SIZE_MAX)]


class TuneKey(BaseModel):
    """What a winner is stored under. Fields not bucketed must match exactly for a row to apply."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: DeviceFingerprint
    dtype: str
    batch: _Size
    heads_q: _Size
    heads_kv: _Size
    seqlen_q: _Size
    seqlen_kv: _Size
    head_dim: _Size
    head_dim_v: _Size
    causal: bool
    causal_align: Align
    window: Optional[Tuple[int, int]]
    kv_lens: bool
    mode: Mode
    approx: bool
    #: FP8 K/V format (``AttentionProblem.kv_dtype``); None — the default, left out of :attr:`key_id` so
    #: that every key without it keeps the id it had before the field existed
    kv_dtype: Optional[str] = None
    #: float32 with TF32 dots (``AttentionProblem.tf32``); False — the default, left out of :attr:`key_id`
    #: as ``kv_dtype`` is, so every other key keeps its id
    tf32: bool = False

    @classmethod
    def from_problem(cls, problem: AttentionProblem, device: DeviceFingerprint) -> "TuneKey":
        """The key of ``problem``'s canonical form (:meth:`AttentionProblem.canonical`): equivalent
        problems share one key."""
        problem = problem.canonical()
        align = problem.causal_align
        return cls(
            device=device, dtype=problem.dtype, batch=bucket(problem.batch), heads_q=problem.heads_q,
            heads_kv=problem.heads_kv, seqlen_q=bucket(problem.seqlen_q),
            seqlen_kv=bucket(problem.seqlen_kv), head_dim=problem.head_dim,
            head_dim_v=problem.head_dim_v, causal=problem.causal, causal_align=align,
            window=None if problem.window is None else tuple(window_bucket(w) for w in problem.window),
            kv_lens=problem.kv_lens, mode=problem.mode, approx=problem.approx, kv_dtype=problem.kv_dtype,
            tf32=problem.tf32,
        )

    def representative(self) -> AttentionProblem:
        """A concrete problem at this key's bucket sizes — what the tuner measures."""
        return AttentionProblem(
            batch=max(self.batch, 1), heads_q=self.heads_q, heads_kv=self.heads_kv,
            seqlen_q=self.seqlen_q, seqlen_kv=self.seqlen_kv, head_dim=self.head_dim,
            head_dim_v=self.head_dim_v, dtype=self.dtype, device_type=self.device.device_type,
            causal=self.causal, causal_align=self.causal_align, window=self.window,
            kv_lens=self.kv_lens, mode=self.mode, approx=self.approx, kv_dtype=self.kv_dtype,
            tf32=self.tf32,
        )

    def _shape_family(self) -> tuple:
        """The problem's side of a family: everything but the device and the bucketed sizes."""
        return (self.dtype, self.heads_q, self.heads_kv, self.head_dim, self.head_dim_v, self.causal,
                self.causal_align, self.window is not None, self.kv_lens, self.mode, self.approx, self.kv_dtype,
                self.tf32)

    def family(self) -> tuple:
        """Everything but the bucketed sizes: keys of one family may stand in for each other."""
        return (self.device.arch, self.device.name) + self._shape_family()

    def arch_family(self) -> tuple:
        """:meth:`family` across the devices of one architecture (backend and arch, any name or unit
        count): where a *sibling* device's winner may stand in (e.g. an H100's row for a GH200 or H200,
        both sm_90 with 132 multiprocessors) when this device has no usable row of the family."""
        return (self.device.backend, self.device.arch) + self._shape_family()

    def _size_distance(self, other: "TuneKey") -> float:
        d = (log_distance(self.seqlen_q, other.seqlen_q) + log_distance(self.seqlen_kv, other.seqlen_kv)
             + 0.5 * log_distance(self.batch, other.batch))
        if self.window is not None and other.window is not None:
            d += sum(log_distance(max(a, 0), max(b, 0)) for a, b in zip(self.window, other.window))
        return d

    def distance(self, other: "TuneKey") -> float:
        """Log-distance over the bucketed sizes (and window sides); inf across families."""
        if self.family() != other.family():
            return math.inf
        return self._size_distance(other)

    def sibling_distance(self, other: "TuneKey") -> float:
        """:meth:`distance` to a key of another device of the same architecture (:meth:`arch_family`),
        plus the log2 ratio of their unit counts (a split-K plan sized for 132 multiprocessors fits 114
        less well); inf for the same device (that is :meth:`distance`) or another architecture.

        >>> from attntune.device import DeviceFingerprint as F
        >>> h100, h200 = F(backend="cuda", arch="sm_90", name="H100", units=132), F(backend="cuda", arch="sm_90",
        ...     name="H200", units=132)
        >>> k = TuneKey(device=h100, dtype="bfloat16", batch=1, heads_q=8, heads_kv=8, seqlen_q=64, seqlen_kv=64,
        ...             head_dim=64, head_dim_v=64, causal=False, causal_align="bottom_right", window=None,
        ...             kv_lens=False, mode="fwd", approx=False)
        >>> a100 = F(backend="cuda", arch="sm_80", name="A100", units=108)
        >>> [k.sibling_distance(k.model_copy(update={"device": d})) for d in (h200, h100, a100)]
        [0.0, inf, inf]
        """
        if self.device == other.device or self.arch_family() != other.arch_family():
            return math.inf
        return self._size_distance(other) + log_distance(self.device.units, other.device.units)

    @property
    def key_id(self) -> str:
        """A stable id (sha1 of the canonical JSON): the cache's primary key. ``kv_dtype`` and ``tf32``
        enter only when set (see the fields)."""
        exclude = {n for n, unset in (("kv_dtype", self.kv_dtype is None), ("tf32", not self.tf32)) if unset}
        return hashlib.sha1(self.model_dump_json(exclude=exclude).encode()).hexdigest()[:20]

    def short(self) -> str:
        s = (f"B{self.batch} H{self.heads_q}/{self.heads_kv} S{self.seqlen_q}x{self.seqlen_kv} "
             f"D{self.head_dim} {self.dtype}")
        if self.causal:
            s += " causal"
        if self.window is not None:
            s += f" win({self.window[0]},{self.window[1]})"
        if self.kv_lens:
            s += " kv_lens"
        if self.approx:
            s += " approx"
        if self.kv_dtype is not None:
            s += f" kv:{self.kv_dtype.removeprefix('float8_')}"
        if self.tf32:
            s += " tf32"
        return s + f" {self.mode}"


def config_key(config: Any) -> str:
    """The identity of a launch config (its dict form): canonical JSON, keys sorted. What the cache
    stores, what "tried already" and plan equality compare — one definition for all of them."""
    return json.dumps(config, sort_keys=True, default=str)
