"""Tuning one key: an optuna study over (variant, config), every trial gated then timed.

Order of trials (each measured at most once per study, whatever the sampler proposes):

1. warm start: the winners of the nearest tuned keys of the same family (:meth:`TuneKey.family`,
   nearest by :meth:`TuneKey.distance`), where valid for this key;
2. every candidate's default config (``space.first()``), then, on a forward key whose default row tile
   leaves some of the GPU's SMs without a program, that default with fewer rows and warps
   (:meth:`SearchSpace.occupancy_seeds`: the exhaustive best of both cards' chunked-prefill key, two moves
   from the budgeted winner);
3. *grid* — when all valid configs of all candidates fit in the trial budget, the rest of them in
   declaration order (enqueued one by one: optuna's GridSampler cannot express a conditional space);
   otherwise *TPE* (seeded per key, multivariate with grouped conditional parameters) until the budget
   of measured trials is spent. A config TPE proposes again is not re-measured; the next trial then
   tries a random untried config instead (so a small space is not wasted on repeats).
4. *local refinement* — the last ``LOCAL_SHARE`` of a sampled budget goes to one-step moves of the
   incumbent (the fastest tunable config so far; :meth:`SearchSpace.moves`: one knob to an adjacent
   value of its domain, or a tile knob and ``num_warps`` one step together), in seeded random order,
   re-centred whenever a move wins. With a budget of a few
   trials over a space of hundreds TPE samples too thinly to refine what the warm start found: the
   budgeted winner of an H200 decode key re-timed 7 % slower than the best of a larger sample
   (``benchmarks/results/regret_h200_2026-12-03b_13keys.json``), with the better configs a few knobs
   away; with this step it was 0.5 % (``regret_h200.json``).

5. *refine* (``SweepOptions.refine`` > 0; ``tune`` passes :data:`runner.DEFAULT_REFINE`, 12): after the
   budget, a hill climb — one-step moves of the incumbent and its config on sibling variants
   (:meth:`SearchSpace.siblings`), re-centred whenever a move wins — until every neighbour of the incumbent is measured (a local optimum: stored as
   such) or ``refine`` extra trials are spent. On the H200 the exhaustive best of both prefill window keys
   was one or two such steps from the 8-trial winner (14 % faster;
   ``benchmarks/results/regret_h200_2026-12-04_window.json``), which the budget tail's 2-3 random moves
   missed. Measured on the H200 with 12 (``regret_h200_2026-12-04_refine.json``): both window keys 0.0-0.1 %
   regret, at 2-3x their tuning time (20-31 s a key instead of 11-12 s).

Each trial: validity (an invalid combination is pruned without running), the correctness gate
(:mod:`gate`), a cheap first timing (pruned when more than ``PRUNE_RATIO``× the best so far), the full
timing (:mod:`timing`). Any exception — Triton compile errors, ``OutOfResources``, CUDA OOM, a crashing
variant — is a failed trial with the reason, never a crash of the tuner. Trials record their outcome in
optuna user attributes (``status``, ``reason``, ``max_error``, ``measured``), so a resumed run counts
the measured ones against the budget and never repeats them.

The budget (``--trials``) counts the configs of the tunable variants (Triton kernels); each fixed variant
(one config: the SDPA backends, eager, flex) is measured once on top of it (:meth:`SearchSpace.fixed_count`).

Shapes are runtime arguments of every kernel: one compiled Triton kernel serves all keys of a
(dtype, head_dim, constexpr config) — the tuner passes shapes as tensors and never forces a recompile.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import random
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict

from attntune.autotune import gate
from attntune.autotune.confirm import CONFIRM_TOP, CPU_ROUNDS, GPU_ROUNDS, Candidate, busy_share, confirm
from attntune.cache.retry import retry_locked
from attntune.autotune.space import SearchSpace, config_id
from attntune.autotune.study import open_study
from attntune.autotune.timing import PRUNE_RATIO, Timer, TimingOptions, graph_timed, make_call
from attntune.cache.models import WinnerRecord, judge, utcnow
from attntune.cache.store import CacheStore
from attntune.device import device_fingerprint, software_fingerprint
from attntune.kernels import registry
from attntune.key import TuneKey, config_key

#: torch's own SDPA backend choice: what a user gets without attntune; every record carries its time.
BASELINE = "sdpa_default"

#: share of a sampled (not gridded) trial budget spent on one-step moves of the incumbent (module doc)
LOCAL_SHARE = 1 / 3

Event = Callable[[Dict[str, Any]], None]


class FatalDeviceError(RuntimeError):
    """The CUDA context is unusable (illegal address, device assert): this process cannot go on."""


@dataclass
class SweepOptions:
    """Budgets and switches of one tuning run. ``trials``: measured trials per key. ``deadline``:
    ``time.time()`` after which no new trial starts. ``partial_ok``: a key cut short by the deadline
    still gets a winner from what was measured (online tuning); otherwise it is left for a resume."""

    trials: int = 12
    deadline: Optional[float] = None
    force: bool = False
    seed: int = 0
    timing: TimingOptions = field(default_factory=TimingOptions)
    partial_ok: bool = False
    neighbours: int = 2
    #: extra trials for the hill climb after the budget (module doc, step 5); 0 = off
    refine: int = 0

    def time_up(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline


class KeyResult(BaseModel):
    """What happened to one key. ``status``: tuned | skipped (a valid winner existed) | no-winner
    (every candidate failed) | unfinished (deadline/interrupt; resumable) | done-elsewhere (another
    worker finished it) | error (the tuner itself failed on it)."""

    model_config = ConfigDict(frozen=True)

    key: TuneKey
    status: str
    record: Optional[WinnerRecord] = None
    trials: int = 0
    failed: int = 0
    reason: Optional[str] = None
    seconds: float = 0.0

    @property
    def key_id(self) -> str:
        return self.key.key_id


@dataclass
class Outcome:
    """One trial's verdict. ``status``: ok | wrong | failed | pruned; ``measured``: it ran the variant
    (counts against the budget; pruned-as-invalid and duplicates do not)."""

    status: str
    reason: Optional[str] = None
    median_ms: Optional[float] = None
    cheap_ms: Optional[float] = None
    max_error: Optional[float] = None
    rel_error: Optional[float] = None
    measured: bool = True


def key_seed(key_id: str, seed: int) -> int:
    return (int(key_id[:8], 16) ^ seed) & 0x7FFFFFFF


def _device_for(problem) -> torch.device:
    if problem.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def parallel_units(device: torch.device) -> Optional[int]:
    """The device's SMs / CUs (GPUs; None elsewhere or unknown): what :meth:`SearchSpace.occupancy_seeds`
    compares a forward's program count with."""
    if device.type != "cuda":
        return None
    try:
        return device_fingerprint(device).units
    except Exception:  # noqa: BLE001 — only costs the seeds
        return None


def _free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def neighbour_configs(
    key: TuneKey, space: SearchSpace, stores: Sequence[CacheStore], n: int
) -> List[Tuple[str, dict]]:
    """Winners of the ``n`` nearest other keys of ``key``'s family that are valid for this key's space,
    nearest first. Rows that do not judge valid are ignored."""
    found: List[Tuple[float, str, dict]] = []
    fam = key.family()
    for st in stores:
        try:
            rows = retry_locked(st.raw_winners)
        except Exception:  # noqa: BLE001 — an unreadable layer only costs the warm start
            continue
        for raw in rows:
            try:
                other = TuneKey.model_validate_json(raw["key_json"])
            except Exception:  # noqa: BLE001
                continue
            if other.family() != fam or other.key_id == key.key_id:
                continue
            verdict = judge(raw, "neighbour", registry)
            if verdict.status != "valid" or verdict.record is None:
                continue
            rec = verdict.record
            if space.validate(rec.variant, rec.config):
                continue
            found.append((key.distance(other), rec.variant, rec.config))
    found.sort(key=lambda t: t[0])
    out, seen = [], set()
    for _, v, cfg in found:
        cid = config_id(v, cfg)
        if cid not in seen:
            seen.add(cid)
            out.append((v, cfg))
        if len(out) >= n:
            break
    return out


class KeyTuner:
    """Tunes one key into ``store``. Created per key by the runner (which holds the key's claim)."""

    def __init__(
        self,
        key: TuneKey,
        store: CacheStore,
        storage,
        options: SweepOptions,
        warm_stores: Sequence[CacheStore] = (),
        on_event: Optional[Event] = None,
        force_upsert: bool = False,
        lost: Optional[Callable[[], bool]] = None,
    ):
        self.key = key
        self.problem = key.representative()
        self.store = store
        self.storage = storage
        self.opt = options
        self.warm_stores = list(warm_stores) or [store]
        self.emit = on_event or (lambda ev: None)
        # Replace the stored row unconditionally only when it is invalid (stale/rejected): ``--force``
        # re-tunes a valid row, but a slower result never replaces it (the upsert keeps the faster).
        self.force_upsert = force_upsert
        self.lost = lost or (lambda: False)
        self.device = _device_for(self.problem)
        self.best_ms = math.inf
        self.best_variant: Optional[str] = None
        self._dirty = False
        #: the largest contention of the sweep's CPU measurements (timing.Timer.contention; None: unknown)
        self._contention: Optional[float] = None

    # ---- the study --------------------------------------------------------------------------------
    def run(self) -> KeyResult:
        """Tune the key; returns its result (upserting the winner and the trial summaries when done).
        Raises KeyboardInterrupt (after marking the running trial failed) and FatalDeviceError. A float32
        CUDA key is measured under the numerics it is keyed by (:func:`gate.key_numerics`)."""
        with gate.key_numerics(self.problem):
            return self._run()

    def _run(self) -> KeyResult:
        t0 = time.time()
        space = SearchSpace(self.problem)
        if not space.candidates:
            reasons = "; ".join(
                f"{v.name}: {', '.join(r)}" for v, r in registry.explain_candidates(self.problem) if r
            )
            return KeyResult(key=self.key, status="no-winner", reason=f"no candidate variant ({reasons})")
        seed = key_seed(self.key.key_id, self.opt.seed)
        # the trial budget is for the tunable variants' configs; each fixed variant (one config) is
        # measured once on top of it (SearchSpace.fixed_count)
        budget = max(1, self.opt.trials) + space.fixed_count()
        grid_n = space.grid_size(budget)
        with warnings.catch_warnings():  # multivariate/group are "experimental" in optuna: say it once here
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, n_startup_trials=max(4, budget // 3)
            )
        study = open_study(
            self.storage, self.key.key_id, space.signature(), sampler, self.key.short(), fresh=self.opt.force
        )
        trials = study.get_trials(deepcopy=False)
        measured = [t for t in trials if t.user_attrs.get("measured")]
        tried = {config_id(*space.from_params(t.params)) for t in measured}
        for t in trials:
            if t.state == TrialState.COMPLETE and t.value is not None and t.value < self.best_ms:
                self.best_ms, self.best_variant = t.value, t.params.get("variant")
        queue: deque = deque()
        for name, cfg in (
            neighbour_configs(self.key, space, self.warm_stores, self.opt.neighbours)
            + space.defaults()
            + space.occupancy_seeds(parallel_units(self.device))
            + (list(space.grid()) if grid_n is not None else [])
        ):
            if config_id(name, cfg) not in tried:
                queue.append((name, cfg))
        n_measured = len(measured)
        # the tail of a sampled budget refines the incumbent (module doc, step 4)
        local_n = int(max(1, self.opt.trials) * LOCAL_SHARE)
        rng = random.Random(seed)
        inputs = None
        unfinished = None
        inputs_error = None
        try:
            for name, why in space.excluded:
                self._record_unmeasurable(study, name, why, trials)
            extra = max(0, self.opt.refine) if grid_n is None else 0
            attempts, cap = 0, (budget + extra) * 4 + len(queue) + 8
            while n_measured < budget + extra and attempts < cap:
                # Trials enqueued but never started (an interrupted run) go first: ask() pops them.
                waiting = bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
                while queue and config_id(*queue[0]) in tried:
                    queue.popleft()
                if grid_n is not None and not queue and not waiting:
                    break  # grid exhausted: every valid config measured
                if self.opt.time_up():
                    unfinished = "time limit reached"
                    break
                if self.lost():
                    unfinished = "claim lost to another worker"
                    break
                attempts += 1
                if not queue and not waiting and grid_n is None and n_measured >= budget - local_n:
                    climbing = n_measured >= budget  # the refine phase: siblings too, none left = done
                    move = self._local_move(study, space, tried, rng, siblings=climbing)
                    if move is not None:
                        queue.append(move)
                    elif climbing:
                        break  # a local optimum: every neighbour of the incumbent is measured
                if queue and not waiting:
                    name, cfg = queue.popleft()
                    retry_locked(study.enqueue_trial, space.to_params(name, cfg))
                if inputs is None:
                    try:
                        inputs = gate.prepare(self.problem, self.device, seed)
                    except Exception as e:  # noqa: BLE001 — e.g. OOM building the reference
                        _free_device_memory(self.device)
                        inputs_error = gate.classify_exception(e)
                        break
                outcome, name, cfg = self._trial(study, space, inputs, tried)
                if outcome.measured:
                    n_measured += 1
                elif outcome.reason and outcome.reason.startswith("duplicate") and grid_n is None:
                    untried = [
                        nc for nc in itertools.islice(space.grid(), 4096) if config_id(*nc) not in tried
                    ]
                    if untried:
                        queue.append(rng.choice(untried))
                self.emit(
                    {
                        "type": "trial",
                        "key_id": self.key.key_id,
                        "key": self.key.short(),
                        "n": n_measured,
                        "budget": budget + extra if grid_n is None else min(budget, grid_n),
                        "variant": name,
                        "status": outcome.status,
                        "best_ms": self.best_ms,
                        "best_variant": self.best_variant,
                    }
                )
        finally:
            spent = time.time() - t0  # cumulative over the runs that worked on this study
            try:
                spent += float(study.user_attrs.get("tuning_seconds", 0.0))
                retry_locked(study.set_user_attr, "tuning_seconds", spent)
            except Exception:  # noqa: BLE001 — bookkeeping only
                pass
        if inputs_error is not None:
            return KeyResult(
                key=self.key,
                status="error",
                reason=f"inputs/reference: {inputs_error}",
                trials=n_measured,
                seconds=time.time() - t0,
            )
        if unfinished and not self.opt.partial_ok:
            return KeyResult(
                key=self.key,
                status="unfinished",
                reason=unfinished,
                trials=n_measured,
                seconds=time.time() - t0,
            )
        return self._conclude(study, space, inputs, spent, t0, unfinished)

    def _local_move(self, study: optuna.Study, space: SearchSpace, tried: set,
                    rng: random.Random, siblings: bool = False) -> Optional[Tuple[str, dict]]:
        """An untried one-step move (:meth:`SearchSpace.moves`) of the fastest measured config of a
        tunable variant, chosen at random (seeded) — with ``siblings``, its config on a sibling variant
        first (:meth:`SearchSpace.siblings`); None when it has no untried valid move (TPE then
        proposes the trial, or the refine phase ends)."""
        best = None
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.value is None or not t.params or (best is not None and t.value >= best.value):
                continue
            name, cfg = space.from_params(t.params)
            if cfg and space.get(name) is not None:  # a tunable variant (fixed ones have no knobs)
                best = t
        if best is None:
            return None
        name, cfg = space.from_params(best.params)
        if siblings:
            for sib in space.siblings(name, cfg):
                if config_id(*sib) not in tried:
                    return sib
        moves = [m for m in space.moves(name, cfg) if config_id(name, m) not in tried]
        return (name, rng.choice(moves)) if moves else None

    def _record_unmeasurable(
        self, study: optuna.Study, name: str, why: str, trials: List[FrozenTrial]
    ) -> None:
        # A candidate whose space() raised still shows up in the study and the trial table, as failed
        # (once per study: a resumed run finds the earlier record).
        # Added as a finished trial (not ask/tell): ask() would pop a config enqueued by an earlier run.
        if any(t.user_attrs.get("variant") == name and not t.params for t in trials):
            return
        attrs = {"variant": name, "config": "{}", "status": "failed", "reason": why, "measured": False}
        retry_locked(study.add_trial, optuna.trial.create_trial(state=TrialState.FAIL, user_attrs=attrs))

    def _trial(self, study: optuna.Study, space: SearchSpace, inputs, tried: set):
        trial = retry_locked(study.ask)
        name, cfg = "?", {}
        try:
            name, cfg = space.suggest(trial)
            outcome = self._evaluate(space, name, cfg, inputs, tried)
        except KeyboardInterrupt:
            self._tell(study, trial, Outcome("failed", "interrupted", measured=False), name, cfg)
            raise
        except FatalDeviceError as e:
            self._tell(study, trial, Outcome("failed", str(e)), name, cfg)
            raise
        except Exception as e:  # noqa: BLE001 — e.g. an unsuggestable param: a failed trial, not a crash
            outcome = Outcome("failed", gate.classify_exception(e), measured=False)
        self._tell(study, trial, outcome, name, cfg)
        if outcome.measured:
            tried.add(config_id(name, cfg))
        if outcome.status == "ok" and outcome.median_ms is not None and outcome.median_ms < self.best_ms:
            self.best_ms, self.best_variant = outcome.median_ms, name
        return outcome, name, cfg

    def _tell(self, study: optuna.Study, trial, outcome: Outcome, name: str, cfg: dict) -> None:
        attrs = {
            "variant": name,
            "config": config_key(cfg),
            "status": outcome.status,
            "reason": outcome.reason,
            "max_error": outcome.max_error,
            "rel_error": outcome.rel_error,
            "cheap_ms": outcome.cheap_ms,
            "measured": outcome.measured,
        }
        for k, v in attrs.items():
            retry_locked(trial.set_user_attr, k, v)
        if outcome.status == "ok":
            retry_locked(study.tell, trial, outcome.median_ms)
        elif outcome.status == "pruned":
            if outcome.cheap_ms is not None:
                # The sampler ranks pruned trials by their last reported value: the cheap measurement.
                retry_locked(trial.report, outcome.cheap_ms, 0)
            retry_locked(study.tell, trial, state=TrialState.PRUNED)
        else:
            retry_locked(study.tell, trial, state=TrialState.FAIL)

    # ---- one trial ----------------------------------------------------------------------------------
    def _evaluate(self, space: SearchSpace, name: str, cfg: dict, inputs, tried: set) -> Outcome:
        bad = space.validate(name, cfg)
        if bad:
            return Outcome("pruned", "invalid config: " + "; ".join(bad), measured=False)
        if config_id(name, cfg) in tried:
            return Outcome("pruned", "duplicate of a measured config", measured=False)
        variant = space.get(name).variant
        if self._dirty:  # the previous trial failed (e.g. CUDA OOM): return its memory to the device
            self._dirty = False
            _free_device_memory(self.device)
        try:
            g = gate.check(variant, cfg, inputs)
        except Exception as e:  # noqa: BLE001
            return self._failure(e)
        if not g.ok:
            return Outcome(g.status, g.reason, max_error=g.max_error, rel_error=g.rel_error)
        fn, grads = make_call(variant, cfg, inputs, grads=self.problem.mode == "fwd_bwd")
        timer = Timer(self.device, self.opt.timing, graphs=graph_timed(self.problem))
        cheap = None
        try:
            # Nothing to compare against before the first success; and the baseline's full time goes
            # into every record anyway, so stopping it early would save nothing.
            if math.isfinite(self.best_ms) and name != BASELINE:
                cheap = timer.cheap(fn, grads)
            if cheap is not None and cheap > PRUNE_RATIO * self.best_ms:
                why = (
                    f"early stop: first measurement {cheap:.4g} ms > {PRUNE_RATIO}x the best so far "
                    f"({self.best_ms:.4g} ms, {self.best_variant})"
                )
                return Outcome(
                    "pruned",
                    why + (f"; {g.reason}" if g.reason else ""),
                    cheap_ms=cheap,
                    max_error=g.max_error,
                    rel_error=g.rel_error,
                )
            ms = timer.full(fn, grads)
        except Exception as e:  # noqa: BLE001
            return self._failure(e)
        finally:
            if timer.contention is not None:
                self._contention = max(self._contention or 0.0, timer.contention)
        if not (ms > 0 and math.isfinite(ms)):
            return Outcome("failed", f"timing returned {ms!r} ms")
        return Outcome(
            "ok", g.reason, median_ms=ms, cheap_ms=cheap, max_error=g.max_error, rel_error=g.rel_error
        )

    def _failure(self, e: Exception) -> Outcome:
        reason = gate.classify_exception(e)
        if self.device.type == "cuda":
            if gate.cuda_context_lost(e):
                raise FatalDeviceError(f"CUDA context lost: {reason}") from e
            # Free the failed call's memory before the next trial — not here: the traceback still holds it.
            self._dirty = True
        return Outcome("failed", reason)

    # ---- the result ---------------------------------------------------------------------------------
    def _conclude(
        self,
        study: optuna.Study,
        space: SearchSpace,
        inputs,
        spent: float,
        t0: float,
        unfinished: Optional[str],
    ) -> KeyResult:
        trials = study.get_trials(deepcopy=False)
        summaries = [_summary(t) for t in trials if t.state != TrialState.WAITING]
        measured = [t for t in trials if t.user_attrs.get("measured")]
        n_failed = sum(1 for t in measured if t.user_attrs.get("status") in ("wrong", "failed"))
        ok = sorted((t for t in trials if t.state == TrialState.COMPLETE and t.value), key=lambda t: t.value)
        retry_locked(self.store.add_trials, self.key.key_id, summaries)
        if not ok:
            why = "every candidate failed the gate or crashed" if measured else "nothing measured"
            return KeyResult(
                key=self.key,
                status="unfinished" if unfinished else "no-winner",
                reason=unfinished or why,
                trials=len(measured),
                failed=n_failed,
                seconds=time.time() - t0,
            )
        best = ok[0]
        bname, bcfg = space.from_params(best.params)
        ms, spread, base_ms, busy = float(best.value), None, None, self._contention
        confirmed = self._confirm(ok, space, inputs)
        if confirmed is not None:
            winner, timed, busy = confirmed
            bname, bcfg, ms, spread = winner.name, winner.config, winner.ms, winner.noise
            best = next((t for t in ok if space.from_params(t.params) == (bname, bcfg)), best)
            base_ms = next((c.ms for c in timed if c.baseline), None)
        runner, runner_ms = self._runner_up(trials, ok, bname)
        rname, rcfg = space.from_params(runner.params) if runner is not None else (None, None)
        if confirmed is not None:  # the runner-up's confirmed time, where it was re-timed too
            runner_ms = next((c.ms for c in timed if (c.name, c.config) == (rname, rcfg)), runner_ms)
        if base_ms is None:
            base_ms = self._baseline_ms(ok, space, inputs)
        p = self.problem
        variant = space.get(bname).variant
        tflops, tbps = p.rates(ms)
        rec = WinnerRecord(
            key=self.key,
            variant=bname,
            config=bcfg,
            median_ms=ms,
            tflops=tflops,
            tbps=tbps,
            runner_up=rname,
            runner_up_config=rcfg,
            runner_up_ms=runner_ms,
            sdpa_default_ms=base_ms,
            max_error=best.user_attrs.get("max_error"),
            rel_error=best.user_attrs.get("rel_error"),
            spread=spread,
            busy=busy,
            fingerprint=software_fingerprint(variant.source_hash(), p.device_type),
            trials=len(measured),
            tuning_seconds=round(spent, 3),
            created_at=utcnow(),
        )
        retry_locked(self.store.upsert_winner, rec, force=self.force_upsert)
        return KeyResult(
            key=self.key,
            status="tuned",
            record=rec,
            trials=len(measured),
            failed=n_failed,
            reason=unfinished,
            seconds=time.time() - t0,
        )

    def _confirm(self, ok: List[FrozenTrial], space: SearchSpace, inputs):
        """``(winner, timed candidates, busy)`` of the confirmation round (:mod:`attntune.autotune.confirm`;
        busy: the contention behind the winner's and the baseline's figures, ``WinnerRecord.busy``):
        the best :data:`CONFIRM_TOP` distinct configs of the sweep and the baseline (when it runs this key
        and passes the gate) re-timed side by side. None when it cannot run (no inputs, nothing timed):
        the sweep's own best then stands."""
        seen, cands = set(), []
        for t in ok:
            name, cfg = space.from_params(t.params)
            cid = config_id(name, cfg)
            if cid in seen:
                continue
            seen.add(cid)
            cands.append((name, cfg, name == BASELINE))
            if len(cands) == CONFIRM_TOP:
                break
        try:
            if inputs is None:
                inputs = gate.prepare(self.problem, self.device, key_seed(self.key.key_id, self.opt.seed))
            if not any(b for _, _, b in cands):
                cfg = baseline_config(self.problem, inputs)
                if cfg is not None:
                    cands.append((BASELINE, cfg, True))
            grads = self.problem.mode == "fwd_bwd"
            timed = []
            for name, cfg, is_base in cands:
                cand = space.get(name)
                fn, g = make_call(cand.variant if cand is not None else registry.get(name), cfg, inputs,
                                  grads=grads)
                timed.append(Candidate(name, cfg, fn, g, baseline=is_base))
            timer = Timer(self.device, self.opt.timing, graphs=graph_timed(self.problem))
            cpu = self.device.type == "cpu"
            winner = confirm(timed, timer.round, CPU_ROUNDS if cpu else GPU_ROUNDS, robust_min=cpu,
                             contention=lambda: timer.last_contention)
        except Exception:  # noqa: BLE001 — the sweep's ranking still stands
            if self.device.type == "cuda":
                _free_device_memory(self.device)
            return None
        if winner is None:
            return None
        timed = [c for c in timed if c.rounds]
        return winner, timed, busy_share(timed, winner, known=timer.contention is not None)

    @staticmethod
    def _runner_up(trials: List[FrozenTrial], ok: List[FrozenTrial], winner: str):
        """(trial, ms) of the runner-up: the best completed trial of another variant; else the best
        early-stopped trial of another variant (ms = its first, cheap measurement); else the next best
        config of the winner's variant; else (None, None)."""
        other = [t for t in ok[1:] if t.params.get("variant") != winner]
        if other:
            return other[0], float(other[0].value)
        stopped = sorted(
            (
                t
                for t in trials
                if t.state == TrialState.PRUNED
                and t.user_attrs.get("cheap_ms")
                and t.params.get("variant") not in (None, winner)
            ),
            key=lambda t: t.user_attrs["cheap_ms"],
        )
        if stopped:
            return stopped[0], float(stopped[0].user_attrs["cheap_ms"])
        if len(ok) > 1:
            return ok[1], float(ok[1].value)
        return None, None

    def _baseline_ms(self, ok: List[FrozenTrial], space: SearchSpace, inputs) -> Optional[float]:
        """torch SDPA default on the same inputs: from its trial when it completed, else measured now
        (it may have been pruned early or not sampled). None when it cannot run this key."""
        for t in ok:
            if t.params.get("variant") == BASELINE:
                return float(t.value)
        if not registry.exists(BASELINE) or registry.reasons(registry.get(BASELINE), self.problem):
            return None  # cannot run this key: no inputs to build
        try:
            if inputs is None:
                inputs = gate.prepare(self.problem, self.device, key_seed(self.key.key_id, self.opt.seed))
            cfg = baseline_config(self.problem, inputs)
            if cfg is None:
                return None
            fn, grads = make_call(registry.get(BASELINE), cfg, inputs, grads=self.problem.mode == "fwd_bwd")
            return Timer(self.device, self.opt.timing, graphs=graph_timed(self.problem)).full(fn, grads)
        except Exception:  # noqa: BLE001 — the record then simply has no baseline
            if self.device.type == "cuda":
                _free_device_memory(self.device)
            return None


def baseline_config(problem, inputs) -> Optional[Dict[str, Any]]:
    """The config of :data:`BASELINE` (torch SDPA's own choice) for ``problem`` when it is registered,
    runs the problem and passes the gate on ``inputs``; else None."""
    if not registry.exists(BASELINE):
        return None
    base = registry.get(BASELINE)
    if registry.reasons(base, problem):
        return None
    cfg = base.space(problem).first()
    return cfg if gate.check(base, cfg, inputs).ok else None


def _summary(t: FrozenTrial) -> Dict[str, Any]:
    """The per-trial row of the cache's ``trials`` table (what ``attntune explain`` shows)."""
    ua = t.user_attrs
    try:
        cfg = json.loads(ua.get("config") or "{}")
    except ValueError:
        cfg = {}
    status = ua.get("status")
    if status is None:  # left RUNNING by an interrupted run, failed on resume
        status, reason = "failed", "interrupted"
    else:
        reason = ua.get("reason")
    return {
        "variant": ua.get("variant") or t.params.get("variant", "?"),
        "config": cfg,
        "status": status,
        "reason": reason,
        "median_ms": t.value if status == "ok" else ua.get("cheap_ms"),
        "max_error": ua.get("max_error"),
    }
