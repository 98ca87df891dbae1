"""Which earlier kernel sources a variant's cached rows may have been written under and still count as
measuring the code that runs now (``Variant.accepts_source``).

A cached row records its variant's source hash (``Variant.source_hash``: the variant's name and the text of its
``source_modules``). Any edit of those modules changes the hash and stales every row written before it — right
for an edit that could move what a row recorded (its winner's output or time): such rows must re-tune. An edit
that cannot (code deciding which problems a variant is *offered*, a host-side refactor that launches the same
kernels with the same arguments) may instead be declared here, reviewed by hand, never automatically:

* ``current`` — the variant's source hash the declaration was made against (after the edit);
* ``earlier`` — each earlier hash whose rows stay valid, with why;
* ``scoped`` — each earlier hash whose rows stay valid only for some keys (:class:`Scoped`): an edit that changes
  what some launches compile to and leaves every other launch's code as it was (checked by compiling both
  sources, e.g. ``benchmarks/ptx_of.py --dump``), so the rows of the other keys still measured what runs.

The declarations hold only while the variant's hash is ``current``: a later edit of a hashed module ends them
together with the rows of ``current`` itself, unless that edit is declared in turn (add ``current`` to
``earlier`` with its reason and put the new hash in ``current``). Before 2026-12-07 the earlier hashes were
accepted whatever the current source was, so a kernel edit left every row listed once valid (the decode kernel's
38 shipped rows, all written under listed hashes, survived an edit of its loop).

This module is not among any variant's ``source_modules``: a declaration changing the hash it declares against
would have no fixed point.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional


class Scoped(NamedTuple):
    """An earlier source whose rows measured the current code for some keys only."""

    why: str  #: why those rows measured what the current source runs
    scope: str  #: which keys, in words (shown with ``why``)
    holds: Callable[[Any], bool]  #: the row's ``TuneKey`` -> whether it is one of them


class Equivalence(NamedTuple):
    current: str  #: the variant's source hash these declarations were made against
    earlier: Mapping[str, str]  #: earlier source hash -> why its rows measured what ``current`` runs
    scoped: Mapping[str, Scoped] = MappingProxyType({})  #: earlier source hash -> for which keys, and why


_MOVED = "equivalence declarations moved out of the hashed modules into this one (no code change)"

# SDPA backends (attntune/kernels/sdpa.py; the same list for the five, each hash is one backend's).
# 2026-12-05: the support probe moved to attntune.kernels.sdpa_probe (which problems a backend is offered, not how
# it runs) and _sdpa_with took a lock and keeps backends the user switched off — under tuning (one thread, every
# backend on) the same backend runs the same call; an uncontended lock is ~0.1 µs against calls of microseconds
# and more. 2026-12-06: forward_saving/backward_saved added, for the compiled training op only (run() unchanged).
_SDPA = {**dict.fromkeys(("20cd2aa7960935e1", "f5e69bedc2bb69b0", "4374dd162bd70809",
                          "5c67b698f603b478", "b5570c9b38c9fe8d"),
                         "support probe moved out; flag lock (same backend, same call)"),
         **dict.fromkeys(("b0fe6f7eb44a0b05", "0171c356b7f09c6e", "1b969969a98961bf",
                          "e0b32c8214eaeffd", "4fb7c3059213c828"),
                         "forward_saving/backward_saved added (compiled op only; run() unchanged)")}
# triton_flash / triton_local (one list for both). forward_saving/backward_saved: two methods only the compiled
# op's backward calls (kernels/triton_flash/saved.py); the D<=64 16-bit default backward config: serves untuned
# calls only, a row's stored config parses and runs as before; FastKernel (kernels/triton_launch.py, now hashed
# too): the same kernels with the same arguments, launched by the compiled kernel's launcher after the first
# call; two host-side trims of the launch (an integer ceil for triton.cdiv, memoised integer classes): the rows
# the H200 re-tuned on 2026-12-06 were timed with the same kernels and arguments.
_FLASH = {**dict.fromkeys(("c5e7f5b6c556eeba", "b4741aae0dd8c689"),
                          "forward_saving/backward_saved added (compiled backward only)"),
          **dict.fromkeys(("afeda8c13b233cbf", "b2d8ac1b6e2aa73d"),
                          "default backward config for D<=64 changed (untuned calls only)"),
          **dict.fromkeys(("42c622b524deff6f", "7bfe9d1bb30e31e8"),
                          "launched through FastKernel (same kernels and arguments)"),
          **dict.fromkeys(("e79dd8b43c056ecd", "52bc71fd4da7c522"),
                          "launch host path trimmed (same kernels and arguments)")}
# 2026-12-07, V_T (docs/wip/flash-vt.patch, landed): descriptor loads over the keys-contiguous V copy that FP8 K/V and
# TF32 dots take, and that copy padded to 16-byte rows. Launches without that copy compile to the same code as before
# (sm_90 PTX identical but for debug line numbers, Triton 3.6, ptx_of.py --dump: bf16 LOADS 0/1/2, causal, window,
# fp16 D96, float32 without TF32, and the four training kernels); FP8 and TF32 launches changed (every LOADS: the
# padded copy's stride is now 16-divisible). So every earlier source's rows stay valid for keys without FP8 K/V or
# TF32, and those of FP8/TF32 keys await a re-tune.
_VT = "then V_T descriptor loads over the FP8/TF32 V copy (other launches compile to the same code)"


def _no_v_copy(key: Any) -> bool:
    """Keys whose launches take no keys-contiguous V copy: neither FP8 K/V nor TF32 dots."""
    return getattr(key, "kv_dtype", None) is None and not getattr(key, "tf32", False)


def _before_vt(declared: Mapping[str, str]) -> Dict[str, Scoped]:
    return {h: Scoped(f"{why}; {_VT}", "keys without FP8 K/V or TF32", _no_v_copy) for h, why in declared.items()}


# triton_decode: none. The decode loop changed on 2026-12-07 (whole tiles unmasked, the tail masked: fp8-decode-vkeys);
# its rows were re-tuned under the new source or await a re-tune (tests/test_shipped_cache.py).

# gluon_flash, 2026-12-08: training (fwd_bwd keys: this forward, then triton_flash's backward; kernels/gluon_flash/
# train.py, with triton_flash's launch and backward modules now hashed too) and scales <= 0 rewritten as triton_flash
# does (q negated or zeroed): a fwd key at a positive scale launches the same kernel with the same arguments, and the
# earlier source had no fwd_bwd rows (it refused them).
_GLUON_TRAIN = "training added (fwd_bwd keys only); scales <= 0 rewritten (positive scales launch as before)"

_EQUIVALENCES: Dict[str, Equivalence] = {
    # name: Equivalence(current source hash, {earlier hash: why}) — each also lists its hash before the move
    "sdpa_default": Equivalence("55d2d8def95afbe1", {**_SDPA, "e2807e9b3d82ea6c": _MOVED}),
    "sdpa_flash": Equivalence("a53a104176df3766", {**_SDPA, "ac8d5444bc4f4bda": _MOVED}),
    "sdpa_efficient": Equivalence("e0551784f134c568", {**_SDPA, "966030b1256d7acb": _MOVED}),
    "sdpa_cudnn": Equivalence("43451f119d550bc0", {**_SDPA, "035ba5b3a8212806": _MOVED}),
    "sdpa_math": Equivalence("63b5ab3df0948f2b", {**_SDPA, "4285be604c6aefcb": _MOVED}),
    "triton_flash": Equivalence("04f5407cdd8d01fe", {}, _before_vt(
        {**_FLASH, "f524eec7a31e0deb": _MOVED, "ad177d481d1fb791": "the source before V_T"})),
    "triton_local": Equivalence("9a75ae4d615435d9", {}, _before_vt(
        {**_FLASH, "34daebb9c42beb0e": _MOVED, "2f4456623c373929": "the source before V_T"})),
    "gluon_flash": Equivalence("e02b85176ca3a949", {"60d57a6b83b5bcd1": _GLUON_TRAIN}),
    # flex: runs_in_compiled_op added (where the variant is offered, not how it runs)
    "flex": Equivalence("c14ac88bdc76c1fc", {
        "909236a6a6585044": "runs_in_compiled_op added (which calls it serves, not how)", "e0729adbd186ee2c": _MOVED}),
}


def earlier(name: str) -> Mapping[str, str]:
    """The earlier source hashes declared for variant ``name`` (empty when none), each with why (and, for a
    scoped one, for which keys)."""
    e = _EQUIVALENCES.get(name)
    if e is None:
        return MappingProxyType({})
    return MappingProxyType({**e.earlier, **{h: f"{s.why} — only for {s.scope}" for h, s in e.scoped.items()}})


def accepts(name: str, current_hash: str, stored_hash: str, key: Optional[Any] = None) -> bool:
    """Whether a row of variant ``name`` written under ``stored_hash`` for ``key`` (its ``TuneKey``) measured the
    variant whose source hash is now ``current_hash``: the same hash, or one declared for exactly this current
    source — for a scoped declaration, only when ``key`` is given and within its scope.

    >>> accepts("v", "aaaa", "aaaa"), accepts("no such variant", "aaaa", "bbbb")
    (True, False)
    """
    if stored_hash == current_hash:
        return True
    e = _EQUIVALENCES.get(name)
    if e is None or e.current != current_hash:
        return False
    if stored_hash in e.earlier:
        return True
    s = e.scoped.get(stored_hash)
    return s is not None and key is not None and bool(s.holds(key))


def declared() -> Mapping[str, Equivalence]:
    """Every declaration, by variant name (for doctor-style listings and tests)."""
    return MappingProxyType(dict(_EQUIVALENCES))
