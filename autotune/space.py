"""The conditional search space of one key: which variant, then that variant's own parameters.

Optuna parameter names: ``variant`` (categorical over the candidate names), then ``<variant>.<param>``
for each of that variant's parameters (categorical over its declared domain). Names are namespaced so
two variants with a ``BLOCK_M`` never share a distribution, and a variant's parameters only appear in
trials of that variant (define-by-run).

Candidates come from :func:`attntune.kernels.registry.candidates` — every registered variant whose
``supports`` is empty (approximate ones only when the problem allows approximation); nothing here knows
any variant by name.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from attntune.device import software_fingerprint
from attntune.key import config_key
from attntune.kernels import registry
from attntune.kernels.base import Config, Space, Variant
from attntune.problem import AttentionProblem

VARIANT_PARAM = "variant"
_NO_AUTO = object()


def config_id(variant: str, config: Config) -> str:
    """A canonical string for one (variant, config): what "tried already" compares."""
    return variant + config_key(config)


@dataclass(frozen=True)
class Candidate:
    variant: Variant
    space: Space

    @property
    def name(self) -> str:
        return self.variant.name


#: Knob pairs that :meth:`SearchSpace.moves` also steps together (same direction): a tile size and the warps
#: that process it.
COUPLED: Tuple[Tuple[str, str], ...] = (("BLOCK_N", "num_warps"), ("BLOCK_M", "num_warps"))


#: The knob that sets how many query rows one program of a forward owns (the flash family's ``BLOCK_M``: its grid
#: is ceil(Sq / BLOCK_M) x B x Hq programs), for :meth:`SearchSpace.occupancy_seeds`.
ROW_TILE = "BLOCK_M"


#: Knobs whose value here means "auto" — resolved per call from the shape and the device (the decode op's
#: ``num_splits`` and ``num_stages``: 0). :meth:`SearchSpace.moves` makes that value adjacent to every
#: concrete value of the knob: in declaration order "auto" sits next to 1 only, while what it resolves to
#: may be any value (on the H200 the decode key B8 KV1024 D64's budgeted winner had auto splits, resolved to
#: 4, against the reference's 8 splits: 3.5 % regret, ``regret_h200.json``; 8 was not one move away).
AUTO_KNOBS: Dict[str, Any] = {"num_splits": 0, "num_stages": 0}


class SearchSpace:
    """Built once per key from the registry. ``excluded`` lists candidates dropped because their
    ``space()`` raised (name, reason) — recorded as failed trials by the sweep."""

    def __init__(self, problem: AttentionProblem):
        self.problem = problem
        self.candidates: List[Candidate] = []
        self.excluded: List[Tuple[str, str]] = []
        for v in registry.candidates(problem):
            try:
                sp = v.space(problem)
                sp.first()  # a space without any valid config cannot run at all
            except Exception as e:  # noqa: BLE001 — a buggy variant must not stop the key
                self.excluded.append((v.name, f"space() failed: {type(e).__name__}: {e}"))
                continue
            self.candidates.append(Candidate(v, sp))
        self._by_name: Dict[str, Candidate] = {c.name: c for c in self.candidates}

    @property
    def names(self) -> List[str]:
        return [c.name for c in self.candidates]

    def get(self, name: str) -> Optional[Candidate]:
        return self._by_name.get(name)

    # ---- optuna encoding ----------------------------------------------------------------------------
    def to_params(self, variant: str, config: Config) -> Dict[str, Any]:
        """The optuna params dict of one configuration (for ``study.enqueue_trial``)."""
        out: Dict[str, Any] = {VARIANT_PARAM: variant}
        out.update({f"{variant}.{k}": v for k, v in config.items()})
        return out

    def from_params(self, params: Dict[str, Any]) -> Tuple[str, Config]:
        """Inverse of :meth:`to_params` (for stored trials)."""
        name = params[VARIANT_PARAM]
        prefix = name + "."
        return name, {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}

    def suggest(self, trial) -> Tuple[str, Config]:
        """Define-by-run sampling inside an optuna trial: the variant, then its parameters. Enqueued
        trials get their fixed values back from the same calls."""
        name = trial.suggest_categorical(VARIANT_PARAM, self.names)
        cand = self._by_name[name]
        cfg = {
            p.name: trial.suggest_categorical(f"{name}.{p.name}", list(p.choices)) for p in cand.space.params
        }
        return name, cfg

    # ---- enumeration --------------------------------------------------------------------------------
    def grid_size(self, limit: int) -> Optional[int]:
        """Number of valid configurations over all candidates, or None when it exceeds ``limit``
        (spaces are enumerated only up to the limit, so a huge space costs nothing)."""
        n = 0
        for c in self.candidates:
            for _ in c.space.grid():
                n += 1
                if n > limit:
                    return None
        return n

    def fixed_count(self) -> int:
        """How many candidates have exactly one valid config (the SDPA backends, eager, flex): the
        sweep measures each once, on top of its trial budget, so that budget goes to the tunable
        variants' configs (H200, ``--trials 8``: the fixed variants' defaults took 3-6 of a decode key's
        8 trials and left ``triton_decode`` 2-5 configs of its ~100)."""
        return sum(1 for c in self.candidates if next(itertools.islice(c.space.grid(), 1, 2), None) is None)

    def grid(self) -> Iterator[Tuple[str, Config]]:
        """Every valid configuration: candidates in registry order, each in declaration order."""
        for c in self.candidates:
            for cfg in c.space.grid():
                yield c.name, cfg

    def defaults(self) -> List[Tuple[str, Config]]:
        """Each candidate's ``space.first()`` (its default config): tried before any sampling."""
        return [(c.name, c.space.first()) for c in self.candidates]

    def occupancy_seeds(self, units: Optional[int]) -> List[Tuple[str, Config]]:
        """Configs to try right after the defaults on a forward key whose default row tile gives the device
        fewer programs than it has ``units`` (SMs / CUs): each such candidate's default with :data:`ROW_TILE`
        one step down together with ``num_warps`` (the coupled move of :meth:`moves`), else ``ROW_TILE`` alone,
        where valid and it makes more programs. None for other modes, without ``units``, or where the default
        fills the device.

        Why: on the chunked-prefill key B1 H32 S512x4096 D128 a 128-row tile makes 128 programs for 132 SMs;
        the exhaustive best on both the H100 and the H200 was the default with 64 rows and 4 warps
        (64/64/4/3), two moves from the budgeted winner (128/128/8/3) with the moves between them slower:
        2.6 % and 2.2 % regret, the largest of either card's regret file (``regret_h100.json``,
        ``regret_h200.json``)."""
        p = self.problem
        if not units or p.mode != "fwd":
            return []

        def row_blocks(cfg: Config) -> int:
            return -(-p.seqlen_q // cfg[ROW_TILE])

        out: List[Tuple[str, Config]] = []
        for c in self.candidates:
            d = c.space.first()
            if ROW_TILE not in d or row_blocks(d) * p.batch * p.heads_q >= units:
                continue
            # only a smaller tile that makes more programs (a decode row, Sq = 1, is one program at any tile)
            down = [m for m in self.moves(c.name, d) if row_blocks(m) > row_blocks(d)]
            # the coupled move first (fewer rows and fewer warps), else fewer rows alone
            down.sort(key=lambda m: m.get("num_warps", 0) >= d.get("num_warps", 0))
            if down:
                out.append((c.name, down[0]))
        return out

    def moves(self, variant: str, config: Config) -> List[Config]:
        """The valid one-step neighbours of ``config``: one knob moved to an adjacent value of its
        declared domain (domains are declared in order: block sizes, warps, stages and splits ascend),
        every other knob kept; then the *coupled* steps of :data:`COUPLED` — a tile knob and ``num_warps``
        one step up together, or down together. What the sweep's local refinement tries around the
        incumbent.

        Why coupled steps: a tile's best warp count grows with the tile, so from a balanced config both
        single steps (a bigger tile with too few warps, more warps on the same tile) can be slower while the
        two together are faster — a local optimum of single steps that is not one of the kernel. On the
        H200 the B1 KV4096 D64 decode key's budgeted winner (BLOCK_N 64, 2 warps) was such a point against
        the reference's BLOCK_N 256 with 4 warps (8.3 % regret, ``regret_h200_2026-12-04_refine.json``).

        An "auto" value (:data:`AUTO_KNOBS`) is adjacent to every concrete value of its knob, and each of
        those to it. A value outside its domain (an old row's) has no neighbours along that knob."""
        cand = self._by_name.get(variant)
        if cand is None:
            return []
        out = []
        index = {}
        for p in cand.space.params:
            try:
                index[p.name] = (p, list(p.choices).index(config.get(p.name)))
            except ValueError:
                continue
        steps = [((name,), d) for name in index for d in (-1, 1)]
        steps += [(pair, d) for pair in COUPLED if all(n in index for n in pair) for d in (-1, 1)]
        for names, d in steps:
            cfg = dict(config)
            for name in names:
                p, i = index[name]
                if not 0 <= i + d < len(p.choices):
                    break
                cfg[name] = p.choices[i + d]
            else:
                if not cand.space.validate(cfg):
                    out.append(cfg)
        for name, (p, i) in index.items():
            auto = AUTO_KNOBS.get(name, _NO_AUTO)
            if auto not in p.choices:
                continue
            targets = [c for c in p.choices if c != auto] if p.choices[i] == auto else [auto]
            for value in targets:
                cfg = dict(config, **{name: value})
                if cfg not in out and not cand.space.validate(cfg):
                    out.append(cfg)
        return out

    def siblings(self, variant: str, config: Config) -> List[Tuple[str, Config]]:
        """``config`` on the other tunable candidates that declare the same knobs and accept it (e.g.
        ``triton_flash`` and ``triton_local``: one kernel family, two schedules), in registry order: a
        one-step move along the variant axis, part of the neighbourhood the sweep's ``refine`` phase
        climbs (on the H200 the exhaustive best of a window key was ``triton_local`` two steps — variant
        and ``BLOCK_N`` — from the budgeted ``triton_flash`` winner,
        ``benchmarks/results/regret_h200_2026-12-04_window.json``)."""
        cand = self._by_name.get(variant)
        if cand is None:
            return []
        names = [p.name for p in cand.space.params]
        out = []
        for c in self.candidates:
            if c.name == variant or [p.name for p in c.space.params] != names or not names:
                continue
            if not c.space.validate(config):
                out.append((c.name, dict(config)))
        return out

    def validate(self, variant: str, config: Config) -> List[str]:
        cand = self._by_name.get(variant)
        if cand is None:
            return [f"{variant} is not a candidate for this key"]
        return cand.space.validate(config)

    def signature(self) -> str:
        """Hash of what the stored trials of a study depend on: candidate names, their source hashes and
        parameter domains, and the software versions. A study whose signature differs was measured on
        other code and is started afresh."""
        sw = software_fingerprint("", self.problem.device_type).model_dump_json()
        parts = [sw]
        for c in self.candidates:
            dom = [(p.name, [repr(x) for x in p.choices]) for p in c.space.params]
            parts.append(json.dumps([c.name, c.variant.source_hash(), dom]))
        return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]
