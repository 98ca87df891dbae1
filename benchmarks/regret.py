"""Regret of the budgeted tuner against a reference search, and fidelity of a cache's stored times.

**Regret**, per key: (1) tune with the shipped budget (``--trials``) exactly as ``attntune tune`` does;
(2) a *reference* search that does not use the tuner's sampler: every candidate variant's valid grid is
measured config by config — the whole grid where it has at most ``--max-configs`` configs, otherwise a
seeded uniform sample of ``--max-configs`` of them plus the variant's default and the budgeted winner's
config (so the reference is never worse than the tuner by construction of the sample alone). A config
whose first, cheap measurement is above ``--prune`` x the best so far is not measured fully (the
tuner's own early stop). (3) The budgeted winner and the reference winner are re-timed side by side,
interleaved, with the tuner's timer: regret = t(budgeted) / t(reference) - 1 (0 when they are the same
config). Where the grid was sampled, the regret is against the best *sampled* config: a lower bound of
the regret against the full grid. Keys run with their families interleaved, and every key's reference
search gets an equal share of the time left (``--time-limit``) after the budgeted tunes still to come
(estimated by the mean so far), so every family is reached within one call — of the keys still to come,
those that fit (a tune and ``MIN_REFERENCE_S`` of reference each): when the call is too short for all of them,
the first ones get real searches and a key that no longer fits is not tuned at all (``time limit``; resume it
with ``--first-key``), instead of every key tuned and none left a reference; the configs are measured
budgeted winner and defaults first, then every variant's sample round-robin in random order, so a search
that runs out of its share has measured an unbiased part of each variant's sample
(``reference_unmeasured`` says how many were left; its regret is again a lower bound). Each row says how
many configs of how large a grid were measured.

**Compiling ahead** (``--compile-workers``, on by default on a GPU): after a key's budgeted tune, the
reference's listed configs of the variants that compile are compiled in parallel worker processes
(``benchmarks/precompile.py``; the workers finish before anything is timed), in measuring order and for at
most ``PRECOMPILE_SHARE`` of the key's reference share (the share pays for it), so the search finds them
in the on-disk caches. Compiling one by one in the timing process, a 9-minute call measured only 2-11 of a
key's ~55 listed configs (H100, 2026-12-06). Compiled before the tune and out of its own share, the
compile-ahead starved the reference searches instead (the reserve for the tunes still to come counted
it). Compiling ahead changes no choice: every measurement is still taken in this process; it only lets
the reference search reach more of its list. Each row's ``precompile`` has the counts.

**Fidelity** (``--fidelity CACHE``): every valid winner row of ``CACHE`` for this device is re-timed in
this process (a fresh one, unlike the tuner's) on the key's representative problem with the tuner's
timer: error = t(now) / t(stored) - 1; and, timed beside it round by round, a *companion*: the
SDPA-default baseline the row was compared with, or for a row whose winner is that baseline its stored
runner-up: relative error = the winner's ratio to the companion now over the stored one, - 1 (a drift of
the whole device moves both times and leaves the ratio). A row whose SM clock samples show the card
throttled while it ran is re-timed after a short idle pause (``RETIME_THROTTLED`` times at most; the decision
reads the clock, never the error): its throttled attempts stay in the row (``throttled_attempts``), its last
attempt's figures count, and the summary says how many rows were re-timed so. "Throttled" is against the
highest clock seen so far, and once more after the pass against the pass's highest clock (a first row that
ran throttled throughout looked like full clock when it was timed).

Usage (H200, one call of at most 9 minutes)::

    python benchmarks/regret.py --keys families16 --fidelity cache.db --time-limit 480 \
        --out benchmarks/results/regret_h200.json
    python benchmarks/regret.py --keys cpu2 --fidelity /tmp/cpu.db --out /tmp/regret.json   # CPU smoke

Runs made at different times (e.g. a family re-run after a fix, or the keys a run did not reach, run
with ``--first-key N``) combine with ``--merge A.json B.json --out C.json``: a later file's rows replace
the earlier files' rows of the same keys; fidelity comes from the last file that has any; ``merged_from``
names each file with its arguments and the families of the rows taken from it.

The JSON is rewritten after every key (a timeout still leaves the keys done); its ``summary`` holds
``keys``, ``families``, ``geomean_regret``, ``max_regret``, ``max_fidelity_error``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402
from precompile import Precompiler, compiled_tasks, default_workers  # noqa: E402

import torch  # noqa: E402

from attntune.autotune import gate  # noqa: E402
from attntune.autotune.runner import DEFAULT_REFINE, tune  # noqa: E402
from attntune.autotune.space import SearchSpace, config_id  # noqa: E402
from attntune.autotune.sweep import BASELINE, baseline_config, key_seed  # noqa: E402
from attntune.autotune.timing import Timer, TimingOptions, graph_timed, make_call  # noqa: E402
from attntune.cache.layered import LayeredCache, open_store  # noqa: E402
from attntune.device import default_device, device_fingerprint  # noqa: E402
from attntune.key import TuneKey  # noqa: E402
from attntune.kernels import registry  # noqa: E402
from attntune.problem import AttentionProblem  # noqa: E402


#: seconds kept per key for re-timing the two winners side by side after its reference search
RETIME_RESERVE_S = 3.0
# Of a key's reference share, the most that compiling its configs ahead may take. Measured on an H100
# (2026-12-06, regret_h100_2026-12-06c_compile_ahead.json): 12 workers compile ~0.1 s a config of wall,
# measuring a compiled config takes 0.25-0.5 s (first load, gate, cheap and full timing), so the search
# can measure about what a third of its share compiles.
PRECOMPILE_SHARE = 0.3
#: the least reference search (s) a tuned key is given: a key's budgeted tune is only worth its seconds with a
#: reference to compare (an H100 run of 280 s over 9 keys, 2026-12-07, tuned 4 keys for 14-46 s each whose
#: equal shares came to 0 s: "no reference config ran"); the H100 measured 2-18 configs in 3-12 s a key
MIN_REFERENCE_S = 8.0


def _p(b, hq, hkv, sq, skv, d, dtype="bfloat16", device="cuda", **kw):
    return AttentionProblem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_kv=skv, head_dim=d,
                            head_dim_v=d, dtype=dtype, device_type=device, **kw)


#: (family, problem). Families: what the issue's regret target spans.
KEY_SETS: Dict[str, List[Tuple[str, AttentionProblem]]] = {
    "families16": [
        ("decode_kv_lens", _p(1, 32, 8, 1, 4096, 128, kv_lens=True)),
        ("decode_kv_lens", _p(8, 32, 8, 1, 8192, 128, kv_lens=True)),
        ("decode_kv_lens", _p(32, 32, 8, 1, 8192, 128, kv_lens=True)),
        ("decode", _p(1, 32, 8, 1, 4096, 64)),
        ("decode", _p(8, 32, 8, 1, 1024, 64)),
        ("decode_window", _p(2, 32, 8, 1, 16384, 128, kv_lens=True, window=(1024, -1))),
        ("dense_prefill", _p(4, 32, 32, 1024, 1024, 128, causal=True)),
        ("dense_prefill", _p(2, 32, 8, 2048, 2048, 64)),
        ("dense_prefill", _p(2, 16, 16, 4096, 4096, 80, causal=True)),
        ("chunked_prefill", _p(1, 32, 8, 512, 4096, 128, causal=True)),
        ("sliding_window", _p(2, 32, 8, 4096, 4096, 128, causal=True, window=(1024, 0))),
        ("sliding_window", _p(4, 16, 16, 8192, 8192, 64, causal=True, window=(512, 0))),
        ("training", _p(4, 16, 16, 1024, 1024, 64, causal=True, mode="fwd_bwd")),
        ("training", _p(2, 16, 16, 2048, 2048, 128, causal=True, window=(512, 0), mode="fwd_bwd")),
        ("fp32", _p(2, 16, 16, 1024, 1024, 64, dtype="float32", causal=True)),
        ("fp32", _p(4, 32, 8, 1, 2048, 64, dtype="float32", kv_lens=True)),
    ],
    # float32 with TF32 dots (the default suite's fp32 keys are of this kind since 2026-12-04)
    "tf32": [
        ("fp32_tf32", _p(4, 16, 16, 4096, 4096, 128, dtype="float32", causal=True, tf32=True)),
        ("fp32_tf32", _p(8, 16, 16, 2048, 2048, 64, dtype="float32", causal=True, tf32=True, mode="fwd_bwd")),
    ],
    # CPU smoke test of this script (the SDPA CPU backends and eager).
    "cpu2": [("dense_prefill", _p(2, 4, 4, 128, 128, 64, dtype="float32", device="cpu")),
             ("dense_prefill", _p(2, 4, 4, 128, 128, 64, dtype="float32", device="cpu", causal=True))],
}


def reference_configs(problem: AttentionProblem, max_configs: int, keep: List[Tuple[str, dict]],
                      seed: int) -> Tuple[List[Tuple[str, dict]], Dict[str, dict]]:
    """The reference search's (variant, config) list, in measuring order, and per variant
    ``{"grid": n, "listed": m}``.

    A grid of at most ``max_configs`` valid configs is taken whole; a larger one is sampled (seeded,
    uniform without replacement over the enumerated grid) to ``max_configs``, plus the variant's default
    and any config of ``keep`` (the budgeted winner). Order: the kept configs first of all, then every
    variant's default, then the variants' sampled configs round-robin in the sample's random order — so a
    search cut short by its time share has measured the budgeted winner and an unbiased part of every
    variant's sample, not the whole grid of the first variants only. (With the defaults first, an H100
    decode key's 4 s share went to eager's and SDPA-math's defaults before the budgeted winner was
    measured, and its "regret" against SDPA-efficient read -94 %.)"""
    space = SearchSpace(problem)
    rng = random.Random(seed)
    kept, first, rest, info = [], [], [], {}
    for cand in space.candidates:
        grid = list(cand.space.grid())
        pick = grid if len(grid) <= max_configs else rng.sample(grid, max_configs)
        rng.shuffle(pick)
        mine = [c for n, c in keep if n == cand.name and not cand.space.validate(c)]
        seen, chosen = set(), []
        for cfg in mine + [cand.space.first()] + pick:
            cid = config_id(cand.name, cfg)
            if cid not in seen:
                seen.add(cid)
                chosen.append((cand.name, cfg))
        n_mine = len({config_id(cand.name, c) for c in mine})
        n_first = len({config_id(cand.name, c) for c in mine + [cand.space.first()]})
        kept.extend(chosen[:n_mine])
        first.extend(chosen[n_mine:n_first])
        rest.append(chosen[n_first:])
        info[cand.name] = {"grid": len(grid), "listed": len(chosen)}
    order = kept + first
    for i in range(max((len(r) for r in rest), default=0)):
        order.extend(r[i] for r in rest if i < len(r))
    return order, info


def interleave_families(keys: List[Tuple[str, AttentionProblem]]) -> List[Tuple[str, AttentionProblem]]:
    """``keys`` reordered round-robin over their families (each family's keys in their order; families in
    order of first appearance): a run cut short by the time limit still has a figure for every family.

    >>> [f for f, _ in interleave_families([("a", 1), ("a", 2), ("b", 3), ("c", 4), ("c", 5)])]
    ['a', 'b', 'c', 'a', 'c']
    """
    by: Dict[str, list] = {}
    for fam, p in keys:
        by.setdefault(fam, []).append((fam, p))
    out, queues = [], list(by.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def keys_that_fit(left_s: float, keys_left: int, tune_s: float) -> int:
    """Of the ``keys_left`` keys (the current one first, its budgeted tune done), how many can still get
    their reference search of at least ``MIN_REFERENCE_S`` and a retime, each key after the current one also
    a budgeted tune of ``tune_s``: at least 1 (the current key), at most ``keys_left``.

    >>> keys_that_fit(100.0, 4, 10.0)   # 11 s for this key, then 21 s a key: all 4 fit
    4
    >>> keys_that_fit(60.0, 9, 30.0)    # this key and one more
    2
    >>> keys_that_fit(5.0, 9, 30.0)     # the current key is always counted
    1
    """
    per_key = tune_s + MIN_REFERENCE_S + RETIME_RESERVE_S
    more = int(max(0.0, left_s - MIN_REFERENCE_S - RETIME_RESERVE_S) // per_key)
    return max(1, min(keys_left, 1 + more))


def reference_share(left_s: float, keys_left: int, tune_s: float) -> float:
    """Seconds of reference search for the current key (whose budgeted tune is done): an equal share of
    the time left after the budgeted tunes of the keys still to come that fit (:func:`keys_that_fit`;
    ``tune_s`` each, the mean so far) and the retimes. Without that reserve the first keys' grids took the
    time of the last keys' tunes, and the last families got no figure; reserving for keys that cannot fit
    anyway left the first keys none (0 s shares while each key still paid its tune).

    >>> reference_share(100.0, 1, 10.0)      # the last key: everything but its retime
    97.0
    >>> reference_share(100.0, 4, 10.0)      # 100 - 3 x 10 - 4 x 3 = 58, over 4 keys
    14.5
    >>> reference_share(20.0, 4, 10.0)       # no other key fits: this one gets what is left
    17.0
    >>> reference_share(240.0, 9, 32.0)      # 6 keys fit: (240 - 5 x 32 - 6 x 3) / 6
    10.333333333333334
    """
    k = keys_that_fit(left_s, keys_left, tune_s)
    return max(0.0, left_s - tune_s * (k - 1) - RETIME_RESERVE_S * k) / k


def worth_tuning(left_s: float, tune_s: List[float]) -> bool:
    """Whether a key's budgeted tune should start with ``left_s`` seconds left: always for the first key
    (no tune measured yet), else when the mean tune so far plus ``MIN_REFERENCE_S`` and a retime fit.

    >>> worth_tuning(5.0, []), worth_tuning(45.0, [30.0]), worth_tuning(40.0, [20.0, 40.0])
    (True, True, False)
    """
    return not tune_s or left_s >= statistics.mean(tune_s) + MIN_REFERENCE_S + RETIME_RESERVE_S


def reference_search(problem, device, configs, prune: float, deadline: float) -> dict:
    """Measure ``configs`` in order (gate, cheap timing, full timing unless pruned) until ``deadline``:
    the best one, counts, and ``cut_short`` (configs left unmeasured). Under the key's numerics (a TF32
    key with TF32 dots), as the tuner measures it."""
    with gate.key_numerics(problem):
        return _reference_search(problem, device, configs, prune, deadline)


def _reference_search(problem, device, configs, prune: float, deadline: float) -> dict:
    # phase_s: where the search's seconds went (inputs and reference, gate incl. first load and any compile
    # the compile-ahead missed, binding, cheap and full timing): what limits the configs measured per key.
    phase = dict.fromkeys(("prepare", "gate", "bind", "cheap", "full"), 0.0)
    t = time.time()
    inp = gate.prepare(problem, device, seed=7)
    timer = Timer(device, TimingOptions(), graphs=graph_timed(problem))
    phase["prepare"] = time.time() - t
    best_ms, best, n_full, n_pruned, n_failed = math.inf, None, 0, 0, 0

    def result(cut_short: int) -> dict:
        return {"best": best, "best_ms": best_ms, "full": n_full, "pruned": n_pruned, "failed": n_failed,
                "cut_short": cut_short, "phase_s": {k: round(v, 3) for k, v in phase.items()}}

    for i, (name, cfg) in enumerate(configs):
        if time.time() > deadline:
            return result(len(configs) - i)
        t = time.time()
        step = "gate"
        try:
            variant = registry.get(name)
            if not gate.check(variant, cfg, inp).ok:
                n_failed += 1
                continue
            t, step = _lap(phase, step, t), "bind"
            fn, grads = make_call(variant, cfg, inp, grads=problem.mode == "fwd_bwd")
            t, step = _lap(phase, step, t), "cheap"
            if timer.cheap(fn, grads) > prune * best_ms:
                n_pruned += 1
                continue
            t, step = _lap(phase, step, t), "full"
            ms = timer.full(fn, grads)
            n_full += 1
            if ms < best_ms:
                best_ms, best = ms, (name, cfg)
        except Exception:  # noqa: BLE001 — a config that does not compile or run is a failed trial
            n_failed += 1
        finally:
            _lap(phase, step, t)
    return result(0)


def _lap(phase: dict, step: str, t: float) -> float:
    """Add the seconds since ``t`` to ``phase[step]``; the time now."""
    now = time.time()
    phase[step] += now - t
    return now


def retime(problem, a, b, device, rounds=5):
    """Median ms of two (variant, config) winners, timed alternately on the same inputs (under the key's
    numerics)."""
    with gate.key_numerics(problem):
        return _retime(problem, a, b, device, rounds)


def _retime(problem, a, b, device, rounds):
    inp = gate.prepare(problem, device, seed=123)
    timer = Timer(device, TimingOptions(), graphs=graph_timed(problem))
    calls = []
    for name, cfg in (a, b):
        v = registry.get(name)
        assert gate.check(v, cfg, inp).ok
        calls.append(make_call(v, cfg, inp, grads=problem.mode == "fwd_bwd"))
    ta, tb = interleaved(timer, calls, rounds)
    return statistics.median(ta), statistics.median(tb)


def interleaved(timer: Timer, calls, rounds: int) -> List[List[float]]:
    """Full timings (ms) of each ``(fn, grads)`` of ``calls``, round by round in turn (a drift of the
    device then reaches them all alike)."""
    ts: List[List[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for j, (fn, grads) in enumerate(calls):
            ts[j].append(timer.full(fn, grads))
    return ts


def fidelity(cache: str, device, deadline: float, rounds: int = 3, precompiler=None) -> List[dict]:
    """Re-time every valid winner row of ``cache`` for ``device`` (see the module docstring), and beside
    it, interleaved round by round on the same inputs, the SDPA-default baseline the row was compared
    with when it was stored (``sdpa_default_ms``): ``relative_error`` = (winner / baseline now) /
    (winner / baseline stored) - 1 tells a drift of the whole device (clocks, temperature: both move, the
    ratio holds) from one of the winner's own (the ratio moves). With ``precompiler``, every row's winner
    and runner-up are compiled ahead in parallel (half the time to ``deadline`` at most)."""
    fp = device_fingerprint(device)
    store = open_store(cache, readonly=True, label="fidelity")
    if store is None:
        raise SystemExit(f"--fidelity: cannot open {cache}")
    layers = LayeredCache([("fidelity", store)])
    rows = []
    recs = [rec for rec in layers.valid_records() if rec.key.device == fp]
    if precompiler is not None:
        tasks = [t for rec in recs for t in _row_tasks(rec)]
        pre = precompiler.compile(tasks, time.time() + (deadline - time.time()) / 2)
        print(json.dumps({"fidelity_precompile": pre}), flush=True)
    top = 0  # the highest SM clock any row has seen (MHz)
    timed = []  # (row, rec) of the rows re-timed, for the second look below
    for rec in recs:
        row = {"key": rec.key.short(), "key_id": rec.key_id, "variant": rec.variant, "config": rec.config,
               "stored_ms": rec.median_ms, "stored_spread": rec.spread, "baseline_stored_ms": rec.sdpa_default_ms}
        if time.time() > deadline:
            row["error"] = "time limit"
            rows.append(row)
            continue
        try:
            problem = rec.key.representative()
            with gate.key_numerics(problem):  # a TF32 row is re-timed with TF32 dots, as it was tuned
                top = _fidelity_row_at_full_clock(row, rec, problem, device, rounds, top, deadline)
            timed.append((row, rec))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    # a row timed throttled from its first clock sample to its last raised ``top`` only to its own clock, so
    # it passed as full clock then: judged again against the highest clock of the whole pass
    for row, rec in timed:
        if len(row.get("throttled_attempts", [])) >= RETIME_THROTTLED or not _throttled(row, top):
            continue
        if time.time() + COOL_S > deadline:
            break
        problem = rec.key.representative()
        try:
            with gate.key_numerics(problem):
                top = _retime_while_throttled(row, rec, problem, device, rounds, top, deadline)
        except Exception as e:  # noqa: BLE001  (the row keeps its earlier attempt's figures)
            row["retime_error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(row), flush=True)
    return rows


def _row_tasks(rec) -> list:
    """Compile-ahead tasks of a cache row: its winner and stored runner-up (what :func:`companion` may time
    beside it) on the key's representative problem; none for a row whose problem cannot be built (its
    fidelity row then says why)."""
    configs = [(rec.variant, rec.config)]
    if rec.runner_up and registry.exists(rec.runner_up):
        configs.append((rec.runner_up, rec.runner_up_config or {}))
    try:
        return compiled_tasks(rec.key.representative(), configs)
    except Exception:  # noqa: BLE001
        return []


#: a fidelity row re-timed while the card throttled (:func:`_throttled`) is re-timed again after ``COOL_S``
#: seconds idle, at most ``RETIME_THROTTLED`` times: a stored time is a full-clock time, so a re-time at a lower
#: clock measures the card's state (the 5.6 % row of 2026-12-04 ran at 1785-1830 MHz against 1980)
RETIME_THROTTLED = 2
COOL_S = 2.0
#: what one attempt of a fidelity row measured (kept in ``throttled_attempts`` when it is re-timed)
_ATTEMPT_KEYS = ("now_ms", "error_frac", "sm_mhz", "power_w", "temp_c", "clock_reasons", "companion_now_ms",
                 "relative_error", "baseline_now_ms")


def _fidelity_row_at_full_clock(row: dict, rec, problem, device, rounds: int, top: float,
                                deadline: float) -> float:
    """:func:`_fidelity_row`, re-timed while the SM clock samples say the card throttled during it (the
    decision reads the clock alone, never the error, and every earlier attempt stays in the row's
    ``throttled_attempts``; the row's figures are its last attempt's). Returns the highest clock seen."""
    _fidelity_row(row, rec, problem, device, rounds)
    return _retime_while_throttled(row, rec, problem, device, rounds, max([top, *row.get("sm_mhz", [])]),
                                   deadline)


def _retime_while_throttled(row: dict, rec, problem, device, rounds: int, top: float, deadline: float) -> float:
    """Re-time the already timed ``row`` while it counts as throttled against ``top`` (at most
    ``RETIME_THROTTLED`` attempts over the row's life, each after ``COOL_S`` idle). Returns the highest clock
    seen."""
    while len(row.get("throttled_attempts", [])) < RETIME_THROTTLED:
        if not _throttled(row, top) or time.time() + COOL_S > deadline:
            break
        row.setdefault("throttled_attempts", []).append({k: row.pop(k) for k in _ATTEMPT_KEYS if k in row})
        time.sleep(COOL_S)
        _fidelity_row(row, rec, problem, device, rounds)
        top = max([top, *row.get("sm_mhz", [])])
    return top


def _throttled(row: dict, top: float) -> bool:
    """Whether ``row`` was timed on a throttled card: its lowest SM clock sample more than ``THROTTLE_FRAC``
    below ``top`` (False without clock samples).

    >>> _throttled({"sm_mhz": [1785, 1900, 1980]}, 1980), _throttled({"sm_mhz": [1965, 1980, 1980]}, 1980)
    (True, False)
    >>> _throttled({}, 1980)
    False
    """
    mhz = row.get("sm_mhz")
    return bool(mhz) and min(mhz) < (1 - THROTTLE_FRAC) * top


def _fidelity_row(row: dict, rec, problem, device, rounds: int) -> None:
    """Fill ``row`` with the re-timed winner of ``rec`` and its companion (see :func:`fidelity`)."""
    inp = gate.prepare(problem, device, key_seed(rec.key_id, 0))
    grads = problem.mode == "fwd_bwd"
    calls = [make_call(registry.get(rec.variant), rec.config, inp, grads=grads)]
    # the companion timed beside it: the baseline; for a baseline winner (timed against itself
    # it would say nothing) the stored runner-up, so that every row with one has a ratio check
    comp = companion(rec, problem, inp)
    if comp is not None:
        calls.append(make_call(registry.get(comp[0]), comp[1], inp, grads=grads))
    timer = Timer(device, TimingOptions(), graphs=graph_timed(problem))
    for fn, grads in calls:
        timer.cheap(fn, grads)  # warm-up (compiles)
    meter = _meter(device, period=0.02)
    with meter:
        ts = interleaved(timer, calls, rounds)
    # the card's state while timing (SM clock, power): tells a throttled card from a slower kernel
    row.update({k: meter.result[k] for k in ("sm_mhz", "power_w", "temp_c", "clock_reasons") if k in meter.result})
    # the estimator the tuner stores (autotune.confirm): the median of rounds on a GPU, their
    # minimum on a CPU (robust to preemption)
    est = [min(t) if device.type == "cpu" else statistics.median(t) for t in ts]
    row.update(now_ms=est[0], error_frac=est[0] / rec.median_ms - 1)
    if len(est) == 2:
        row.update(companion=comp[0], companion_stored_ms=comp[2], companion_now_ms=est[1],
                   relative_error=(est[0] / est[1]) / (rec.median_ms / comp[2]) - 1)
        if comp[0] == BASELINE:
            row["baseline_now_ms"] = est[1]


def _meter(device, period: float):
    """``bench_generate.RunMeter`` (NVML SM clock and power sampled by a thread; nothing recorded without
    NVML or on a CPU)."""
    from bench_generate import RunMeter

    return RunMeter(device, period=period)


def companion(rec, problem, inputs):
    """``(variant, config, stored ms)`` to re-time beside ``rec``'s winner, or None: the SDPA-default
    baseline it was compared with when stored, or — when the winner is that baseline — the stored
    runner-up (another variant measured in the same tuning run)."""
    if rec.variant != BASELINE:
        cfg = baseline_config(problem, inputs) if rec.sdpa_default_ms else None
        return None if cfg is None else (BASELINE, cfg, rec.sdpa_default_ms)
    if rec.runner_up and rec.runner_up_ms and rec.runner_up != BASELINE and registry.exists(rec.runner_up):
        return rec.runner_up, rec.runner_up_config or {}, rec.runner_up_ms
    return None


def summarize(rows: List[dict], fid: List[dict]) -> dict:
    regrets = [r["regret"] for r in rows if "regret" in r]
    geo = math.exp(sum(math.log(1 + max(x, 0.0)) for x in regrets) / len(regrets)) - 1 if regrets else None
    errs = [abs(r["error_frac"]) for r in fid if "error_frac" in r]
    rel = [abs(r["relative_error"]) for r in fid if "relative_error" in r]
    return {"keys": len(regrets), "families": sorted({r["family"] for r in rows if "regret" in r}),
            "geomean_regret": geo, "max_regret": max(regrets, default=None),
            "same_choice": sum(r.get("same_choice", False) for r in rows),
            "sampled_keys": sum(r.get("sampled", False) for r in rows),
            # keys whose reference search ran out of its time share: their regret is against the best of
            # the configs it measured (a lower bound, like a sampled grid's)
            "cut_short_keys": sum(bool(r.get("reference_unmeasured")) for r in rows if "regret" in r),
            # of the configs the reference searches listed, the share they measured (timed, pruned after
            # the cheap timing, or failed the gate): how close the reference came to its whole list
            "reference_measured_share": _measured_share([r for r in rows if "regret" in r]),
            "reference_phase_s": _phase_totals(rows),
            "fidelity_rows": len(errs), "max_fidelity_error": max(errs, default=None),
            "median_fidelity_error": statistics.median(errs) if errs else None,
            # against the baseline re-timed beside each row (see fidelity())
            "max_relative_fidelity_error": max(rel, default=None),
            "median_relative_fidelity_error": statistics.median(rel) if rel else None,
            **_clock_split(fid)}


def _measured_share(rows: List[dict]):
    """Σ measured / Σ listed over ``rows``' reference searches (None without rows).

    >>> _measured_share([{"reference_full": 3, "reference_pruned": 1, "reference_failed": 0,
    ...                   "reference_unmeasured": 4}, {"reference_full": 2}])
    0.6
    """
    done = sum(r.get(k, 0) for r in rows for k in ("reference_full", "reference_pruned", "reference_failed"))
    listed = done + sum(r.get("reference_unmeasured", 0) for r in rows)
    return done / listed if listed else None


def _phase_totals(rows: List[dict]) -> Optional[dict]:
    """Seconds per reference-search phase, summed over ``rows`` (None when no row has them).

    >>> _phase_totals([{"reference_phase_s": {"gate": 1.0, "full": 2.0}}, {}, {"reference_phase_s": {"gate": 0.5}}])
    {'gate': 1.5, 'full': 2.0}
    """
    tot: dict = {}
    for r in rows:
        for k, v in r.get("reference_phase_s", {}).items():
            tot[k] = round(tot.get(k, 0.0) + v, 3)
    return tot or None


#: a fidelity row counts as timed on a throttled card when its lowest SM clock sample sat this far below the
#: highest clock any row saw (the H200 holds 1980 MHz; the 5.6 % row of 2026-12-04 ran at 1785-1830)
THROTTLE_FRAC = 0.03


def _clock_split(fid: List[dict]) -> dict:
    """Fidelity apart for rows timed at the card's full clock and rows timed while it throttled (the meter's
    SM clock samples, ``sm_mhz``): a stored time is a full-clock time, so a row re-timed throttled measures
    the card's state as much as the row. Both are reported; ``max_fidelity_error`` stays over every row."""
    # rows re-timed because an attempt ran throttled (see RETIME_THROTTLED); their last attempt counts
    retimed = {"fidelity_rows_retimed_after_throttle": sum(bool(r.get("throttled_attempts")) for r in fid)}
    timed = [r for r in fid if r.get("sm_mhz") and "error_frac" in r]
    if not timed:
        return {"fidelity_rows_throttled": None, "max_fidelity_error_full_clock": None, **retimed}
    top = max(max(r["sm_mhz"]) for r in fid if r.get("sm_mhz"))
    full = [abs(r["error_frac"]) for r in timed if not _throttled(r, top)]
    return {"fidelity_rows_throttled": len(timed) - len(full),
            "max_fidelity_error_full_clock": max(full, default=None), **retimed}


def merge(paths: List[str]) -> dict:
    """One document from several runs (see the module doc): rows by key, later files winning — except that a
    row without a regret (cut short, failed) never replaces one with a regret: a re-run that did not reach a
    key's reference keeps the key's earlier figure."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    by_key: Dict[str, Tuple[int, dict]] = {}
    for i, d in enumerate(docs):
        for r in d["rows"]:
            k = r.get("key_id") or f'{r["family"]}:{r.get("key")}'
            if "regret" in r or "regret" not in by_key.get(k, (0, {}))[1]:
                by_key[k] = (i, r)
    rows = [r for _, r in by_key.values()]
    fid = next((d["fidelity"] for d in reversed(docs) if d.get("fidelity")), [])
    return {"benchmark": "regret", "environment": docs[-1]["environment"],
            "merged_from": [{"file": Path(p).name, "args": d.get("args"), "elapsed_s": d.get("elapsed_s"),
                             "families": sorted({r["family"] for j, r in by_key.values() if j == i}),
                             "fidelity": bool(d.get("fidelity")) and d["fidelity"] is fid,
                             # a merged file merged again keeps where its own parts came from
                             **({"parts": d["merged_from"]} if d.get("merged_from") else {})}
                            for i, (p, d) in enumerate(zip(paths, docs))],
            "rows": rows, "fidelity": fid, "summary": summarize(rows, fid)}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/regret_h200.json")
    ap.add_argument("--trials", type=int, default=8, help="the budget under test (the shipped cache's)")
    ap.add_argument("--refine", type=int, default=DEFAULT_REFINE,
                    help="the tuner's hill-climb trials after the budget (attntune tune --refine; its default); 0: off")
    ap.add_argument("--keys", default="families16", help=",".join(KEY_SETS) + " (empty: fidelity only)")
    ap.add_argument("--first-key", type=int, default=0,
                    help="start at this key of the (interleaved) key list: the keys a run cut short did not reach")
    ap.add_argument("--families", default="", help="only these families of the key sets (comma list; empty: all)")
    ap.add_argument("--max-configs", type=int, default=48, help="reference configs per variant (sampled above)")
    ap.add_argument("--prune", type=float, default=1.5, help="skip full timing above this x the best so far")
    ap.add_argument("--time-limit", type=float, default=480.0, help="wall seconds for everything")
    ap.add_argument("--fidelity", metavar="CACHE", help="re-time the valid rows of this cache (first)")
    ap.add_argument("--fidelity-share", type=float, default=0.3, help="share of the time limit for fidelity")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="combine these runs into --out (no timing)")
    ap.add_argument("--compile-workers", type=int, default=None,
                    help="processes compiling each key's reference configs ahead (benchmarks/precompile.py); "
                         "default: the cores less two on a GPU, 0 (off) on a CPU")
    args = ap.parse_args(argv)
    if args.merge:
        doc = merge(args.merge)
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
        print(json.dumps(doc["summary"], indent=1, default=str))
        return
    unknown = [ks for ks in args.keys.split(",") if ks and ks not in KEY_SETS]
    if unknown:  # before any timing: a typo must not cost a GPU call its fidelity run first
        ap.error(f"--keys: unknown key set(s) {unknown}; known: {sorted(KEY_SETS)} (empty: fidelity only, "
                 "e.g. --keys=)")
    if args.first_key < 0:
        ap.error(f"--first-key: {args.first_key} (0 is the first key)")
    if args.compile_workers is not None and args.compile_workers < 0:
        ap.error(f"--compile-workers: {args.compile_workers} (0 turns compiling ahead off)")
    device = default_device()
    t_start = time.time()  # the time limit counts the workers' start too
    workers = args.compile_workers if args.compile_workers is not None else (
        default_workers() if device.type == "cuda" else 0)
    with Precompiler(device, workers).start() if workers > 0 else contextlib.nullcontext() as pre:
        _run(args, device, pre, t_start)


def _key(args, device, pre, p, kid, row, tmp, tune_s, deadline, keys_left) -> None:
    """One key's budgeted tune, compile-ahead, reference search and retime, into ``row`` (its ``error``
    says why a key has no regret)."""
    t1 = time.time()
    recs = tune([p], cache=str(tmp / f"{kid}.db"), storage="memory", trials=args.trials, seed=1,
                refine=args.refine)
    row["budget_s"] = time.time() - t1
    tune_s.append(row["budget_s"])  # what each key still to come needs before its reference search
    if not recs:
        row["error"] = "budgeted tune found no winner"
        return
    b = recs[0]
    configs, info = reference_configs(p, args.max_configs, [(b.variant, b.config)], key_seed(kid, 2))
    t0 = time.time()
    share = reference_share(deadline - t0, keys_left, statistics.mean(tune_s))
    if pre is not None:
        # The key's reference share pays for its compile-ahead too: PRECOMPILE_SHARE of it at most, the
        # configs in measuring order, so the ones compiled are the ones the search reaches first.
        row["precompile"] = pre.compile(compiled_tasks(p, configs), t0 + PRECOMPILE_SHARE * share)
    ref = reference_search(p, device, configs, args.prune, t0 + share)
    # budget_tuned_ms: what the tuner stored for its winner (budget_ms is re-timed beside the reference)
    row.update(budget_winner=[b.variant, b.config], budget_trials=b.trials, budget_tuned_ms=b.median_ms,
               reference=info,
               sampled=any(v["listed"] < v["grid"] for v in info.values()), reference_s=time.time() - t0,
               reference_full=ref["full"], reference_pruned=ref["pruned"], reference_failed=ref["failed"],
               reference_unmeasured=ref["cut_short"], reference_phase_s=ref["phase_s"])
    if ref["best"] is None:
        row["error"] = "no reference config ran" + (" within the key's time share" if ref["cut_short"] else "")
    elif (b.variant, b.config) == ref["best"]:
        row.update(regret=0.0, same_choice=True, reference_winner=list(ref["best"]), budget_ms=b.median_ms,
                   reference_ms=ref["best_ms"])
    else:
        tb, tr = retime(p, (b.variant, b.config), ref["best"], device)
        row.update(regret=tb / tr - 1, same_choice=False, reference_winner=list(ref["best"]), budget_ms=tb,
                   reference_ms=tr)


def _run(args, device, pre, t_start: float) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "regret", "environment": environment(), "args": vars(args), "rows": [], "fidelity": [],
           "compile_ahead": None if pre is None else {"workers": pre.workers, "disabled": pre.disabled,
                                                      "start_s": time.time() - t_start}}

    def save():
        doc["summary"] = summarize(doc["rows"], doc["fidelity"])
        doc["elapsed_s"] = time.time() - t_start
        out.write_text(json.dumps(doc, indent=1, default=str))

    if args.fidelity:
        doc["fidelity"] = fidelity(args.fidelity, device, t_start + args.fidelity_share * args.time_limit,
                                   precompiler=pre)
        save()
    deadline = t_start + args.time_limit
    tmp = Path(tempfile.mkdtemp())
    only = {f for f in args.families.split(",") if f}
    keys = interleave_families(
        [fp for ks in args.keys.split(",") if ks for fp in KEY_SETS[ks] if not only or fp[0] in only]
    )[args.first_key:]
    tune_s: List[float] = []  # the budgeted tunes so far: what the keys still to come will need
    for i, (family, p) in enumerate(keys):
        kid = TuneKey.from_problem(p, device_fingerprint(device)).key_id
        row = {"family": family, "key": p.short(), "key_id": kid}
        if time.time() > deadline or not worth_tuning(deadline - time.time(), tune_s):
            row["error"] = "time limit"
            doc["rows"].append(row)
            continue
        try:
            _key(args, device, pre, p, kid, row, tmp, tune_s, deadline, len(keys) - i)
        except Exception as e:  # noqa: BLE001 — one key's failure (e.g. out of memory) must not end the run
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            if device.type == "cuda":
                torch.cuda.empty_cache()
        doc["rows"].append(row)
        save()
        print(json.dumps({k: v for k, v in row.items() if k != "reference"}), flush=True)
    save()
    print(json.dumps(doc["summary"], indent=1), f"in {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
