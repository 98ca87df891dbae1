"""CPU smoke test of benchmarks/regret.py: tune a CPU key into a cache, then run the regret script on the
CPU key set with that cache's fidelity check, in a subprocess, and check the JSON layout the GPU run
will write (rows with regrets and the reference's counts, fidelity rows, the summary)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bench_module, doctest_results

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "regret.py"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_regret_smoke(tmp_path):
    env = dict(os.environ, ATTNTUNE_SYSTEM_CACHE="", ATTNTUNE_CACHE=str(tmp_path / "user.db"), PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    cache = tmp_path / "tuned.db"
    tune = [sys.executable, "-m", "attntune", "tune", "--shape", "b=2,hq=4,hkv=4,sq=128,d=64,dtype=float32",
            "--cache", str(cache), "--storage", "memory", "--trials", "3"]
    p = subprocess.run(tune, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = tmp_path / "regret.json"
    cmd = [sys.executable, str(SCRIPT), "--keys", "cpu2", "--trials", "3", "--max-configs", "2",
           "--fidelity", str(cache), "--time-limit", "200", "--out", str(out),
           "--compile-workers", "1"]  # the compile-ahead path (nothing on a CPU key compiles: no task is sent)
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["environment"]["torch"]
    assert len(doc["rows"]) == 2
    for r in doc["rows"]:
        assert "error" not in r, r
        assert r["family"] == "dense_prefill" and r["regret"] >= -1 and _finite(r["regret"])
        assert r["budget_winner"][0] and r["reference_winner"][0] and _finite(r["budget_tuned_ms"])
        # every candidate's grid size and how much of it the reference measured
        assert r["reference"] and all(v["listed"] >= 1 and v["grid"] >= 1 for v in r["reference"].values())
        assert r["reference_full"] >= 1 and r["reference_unmeasured"] == 0
        assert r["precompile"]["complete"] and r["precompile"]["tasks"] == 0, r["precompile"]
    (f,) = doc["fidelity"]  # the one key tuned above
    assert f["variant"] and _finite(f["stored_ms"]) and _finite(f["now_ms"]) and _finite(f["error_frac"])
    if f.get("companion"):  # re-timed beside the baseline it was compared with, or its runner-up
        assert _finite(f["companion_now_ms"]) and _finite(f["relative_error"])
        assert _finite(doc["summary"]["max_relative_fidelity_error"])
    s = doc["summary"]
    assert s["keys"] == 2 and s["families"] == ["dense_prefill"] and s["fidelity_rows"] == 1
    assert s["reference_measured_share"] == 1.0 and s["cut_short_keys"] == 0
    assert doc["compile_ahead"]["workers"] == 1 and doc["compile_ahead"]["disabled"] is None
    # the geomean clips each regret at 0 and fidelity errors are absolute; a max regret may be negative
    # (the budgeted winner re-timed faster than the reference's)
    for k in ("geomean_regret", "max_fidelity_error"):
        assert _finite(s[k]) and s[k] >= 0, k
    assert _finite(s["max_regret"]) and s["max_regret"] > -1


def _regret_module():
    return bench_module("regret")


def test_reference_order_puts_the_budget_winner_first_and_interleaves_variants(monkeypatch):
    """A reference search cut short by its time share must still have measured the budgeted winner (first
    of all) and every variant's default, and a random part of every variant's sample (not one variant's whole grid)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton_decode is a candidate on the CPU only interpreted
    regret = _regret_module()
    p = regret._p(2, 8, 2, 16, 300, 32, dtype="float32", device="cpu", causal=True, window=(64, 0))
    plain, _ = regret.reference_configs(p, 6, [], seed=3)
    kept = [c for c in plain if c[0] == "triton_flash"][-1]  # a sampled (not default) config
    order, info = regret.reference_configs(p, 6, [kept], seed=5)
    names = list(info)
    multi = [n for n in names if info[n]["grid"] > 6]
    assert {"triton_flash", "triton_local", "triton_decode"} <= set(multi)
    assert all(info[n]["listed"] <= 6 + 2 for n in multi)
    n_first = len(names) + 1  # every variant's default, plus the kept config (not a default: see below)
    head = order[:n_first]
    # the budgeted winner before every default: slow defaults (eager, SDPA math) must not spend the share
    assert order[0] == kept and head.count(kept) == 1 and {n for n, _ in head} == set(names)
    assert sum(n == "triton_flash" for n, _ in head) == 2
    sampled = [n for n, _ in order[n_first:]]
    for r in range(3):  # round-robin: each round takes one config of every multi-config variant
        assert sorted(sampled[r * len(multi):(r + 1) * len(multi)]) == sorted(multi)
    import time

    ref = regret.reference_search(p, regret.default_device(), order, 1.5, deadline=time.time() - 1)
    assert ref["best"] is None and ref["cut_short"] == len(order)


def test_fidelity_retimes_a_row_beside_its_baseline(tmp_path):
    """A stored winner that is not the baseline is re-timed round by round beside the SDPA-default
    baseline: its relative error is the winner/baseline ratio now over the stored ratio."""
    import torch

    from attntune.cache import CacheStore, WinnerRecord, utcnow
    from attntune.device import device_fingerprint, software_fingerprint
    from attntune.kernels import registry
    from attntune.key import TuneKey

    regret = _regret_module()
    p = regret._p(2, 4, 4, 64, 64, 32, dtype="float32", device="cpu", causal=True)
    key = TuneKey.from_problem(p, device_fingerprint("cpu"))
    rec = WinnerRecord(key=key, variant="sdpa_math", config={}, median_ms=0.5, runner_up="sdpa_default",
                       runner_up_ms=0.25, sdpa_default_ms=0.25,
                       fingerprint=software_fingerprint(registry.get("sdpa_math").source_hash(), "cpu"),
                       created_at=utcnow())
    path = tmp_path / "c.db"
    st = CacheStore(str(path))
    assert st.upsert_winner(rec)
    st.dispose()
    import time

    (row,) = regret.fidelity(str(path), torch.device("cpu"), time.time() + 120, rounds=2)
    assert row["variant"] == "sdpa_math" and row["baseline_stored_ms"] == 0.25
    want = (row["now_ms"] / row["baseline_now_ms"]) / 2.0 - 1
    assert abs(row["relative_error"] - want) < 1e-9 and row["baseline_now_ms"] > 0
    assert row["companion"] == "sdpa_default" and row["companion_stored_ms"] == 0.25


def test_fidelity_retimes_a_baseline_winner_beside_its_runner_up(tmp_path):
    """A row whose winner is the baseline itself is re-timed beside its stored runner-up (a ratio check
    for every row that has one); a row with neither gets the absolute error alone."""
    import time

    import torch

    from attntune.cache import CacheStore, WinnerRecord, utcnow
    from attntune.device import device_fingerprint, software_fingerprint
    from attntune.kernels import registry
    from attntune.key import TuneKey

    regret = _regret_module()
    st = CacheStore(str(tmp_path / "c.db"))
    for sq, runner_up in ((64, "sdpa_math"), (48, None)):
        p = regret._p(2, 4, 4, sq, sq, 32, dtype="float32", device="cpu", causal=True)
        key = TuneKey.from_problem(p, device_fingerprint("cpu"))
        rec = WinnerRecord(key=key, variant="sdpa_default", config={}, median_ms=0.25, runner_up=runner_up,
                           runner_up_ms=1.0 if runner_up else None, sdpa_default_ms=0.25,
                           fingerprint=software_fingerprint(registry.get("sdpa_default").source_hash(), "cpu"),
                           created_at=utcnow())
        assert st.upsert_winner(rec)
    st.dispose()
    rows = {r["key"]: r for r in regret.fidelity(str(tmp_path / "c.db"), torch.device("cpu"), time.time() + 120,
                                                 rounds=2)}
    assert len(rows) == 2
    with_ru = next(r for r in rows.values() if "S64x64" in r["key"])
    alone = next(r for r in rows.values() if "S48x48" in r["key"])
    assert with_ru["companion"] == "sdpa_math" and with_ru["companion_stored_ms"] == 1.0
    want = (with_ru["now_ms"] / with_ru["companion_now_ms"]) / 0.25 - 1
    assert abs(with_ru["relative_error"] - want) < 1e-9 and "baseline_now_ms" not in with_ru
    assert "companion" not in alone and "relative_error" not in alone and _finite(alone["error_frac"])


def test_families_filter_keeps_only_the_named_families(tmp_path):
    regret = _regret_module()
    out = tmp_path / "r.json"
    regret.main(["--keys", "cpu2", "--families", "training", "--time-limit", "30", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["rows"] == [] and doc["summary"]["keys"] == 0


def test_merge_takes_each_key_from_the_last_run_that_has_it(tmp_path):
    """A family re-run replaces its keys' rows; the keys a resumed run (``--first-key``) adds join the rows
    of the run it continues instead of replacing that run's rows of the same families. A later row without a
    regret (a key the re-run did not reach the reference of) keeps the earlier figure."""
    regret = _regret_module()
    env = {"torch": "x"}
    a = {"environment": env, "args": {"keys": "families16"}, "fidelity": [{"error_frac": 0.02}],
         "rows": [{"family": "decode", "key_id": "d1", "regret": 0.5},
                  {"family": "decode", "key_id": "d2", "regret": 0.1},
                  {"family": "training", "key_id": "t1", "regret": 0.04}]}
    b = {"environment": env, "args": {"families": "decode"}, "fidelity": [],
         "rows": [{"family": "decode", "key_id": "d1", "regret": 0.0}]}
    c = {"environment": env, "args": {"first_key": 3}, "fidelity": [],
         "rows": [{"family": "decode", "key_id": "d3", "regret": 0.01},
                  {"family": "training", "key_id": "t1", "error": "no reference config ran"},
                  {"family": "fp32", "key_id": "f1", "error": "time limit"}]}
    paths = [tmp_path / n for n in ("a.json", "b.json", "c.json")]
    for pth, d in zip(paths, (a, b, c)):
        pth.write_text(json.dumps(d))
    out = tmp_path / "m.json"
    regret.main(["--merge", *map(str, paths), "--out", str(out)])
    doc = json.loads(out.read_text())
    assert sorted(r["regret"] for r in doc["rows"] if "regret" in r) == [0.0, 0.01, 0.04, 0.1]
    s = doc["summary"]
    assert s["keys"] == 4 and s["max_regret"] == 0.1 and s["max_fidelity_error"] == 0.02
    assert {r["key_id"]: r.get("error") for r in doc["rows"]}["f1"] == "time limit"  # no earlier row: kept
    assert [m["families"] for m in doc["merged_from"]] == [["decode", "training"], ["decode"], ["decode", "fp32"]]
    assert [m["fidelity"] for m in doc["merged_from"]] == [True, False, False]


def test_a_failing_key_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    """A key whose tune or search raises (an H100 run went out of memory on its ninth key and ended, losing
    the keys after it) gets the error in its row; the next key still runs. ``--first-key`` skips keys."""
    regret = _regret_module()
    calls = []
    real = regret.tune

    def tune(problems, **kw):
        calls.append(problems[0])
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (injected)")
        return real(problems, **kw)

    monkeypatch.setattr(regret, "tune", tune)
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", "")
    monkeypatch.setenv("ATTNTUNE_CACHE", str(tmp_path / "user.db"))
    out = tmp_path / "r.json"
    regret.main(["--keys", "cpu2", "--trials", "2", "--max-configs", "1", "--time-limit", "120", "--out", str(out),
                 "--compile-workers", "0"])
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and "out of memory (injected)" in rows[0]["error"], rows[0]
    assert "error" not in rows[1] and _finite(rows[1]["regret"]), rows[1]
    calls.clear()
    regret.main(["--keys", "cpu2", "--first-key", "1", "--trials", "2", "--max-configs", "1", "--time-limit",
                 "120", "--out", str(out), "--compile-workers", "0"])
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 and len(calls) == 1 and calls[0].causal  # cpu2's second key is the causal one
    with pytest.raises(SystemExit):
        regret.main(["--keys", "cpu2", "--first-key", "-1", "--out", str(out)])


def test_regret_time_shares_and_family_order():
    """The examples in interleave_families' and reference_share's docstrings (the keys still to come keep
    their tune time; families interleave), plus a family set cut after any prefix still covers them all."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("regret_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for fn in (mod.interleave_families, mod.reference_share, mod.keys_that_fit, mod.worth_tuning, mod._measured_share,
               mod._phase_totals, mod._throttled):
        results = doctest_results(fn)
        assert results and all(n > 0 and failed == 0 for n, failed in results), fn.__name__
    fams = [f for f, _ in mod.interleave_families(mod.KEY_SETS["families16"])]
    n = len(set(fams))
    assert sorted(set(fams[:n])) == sorted(set(fams)), fams  # the first len(families) keys cover every family


def test_unknown_key_set_is_refused_before_any_timing(tmp_path):
    """A quoting slip (``--keys ''`` passed through an env var arrives as the two quote characters) used to
    crash only after the fidelity run had spent its GPU time; now argparse refuses it naming --keys."""
    out = tmp_path / "regret.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--keys", "''", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--keys" in r.stderr and "unknown key set" in r.stderr, r.stderr
    assert not out.exists()


def test_every_timing_path_runs_under_the_keys_numerics(tmp_path, monkeypatch):
    """A TF32 key (float32 with TF32 dots) must be re-timed, searched and compared under TF32, as the tuner
    measured it: fidelity, the reference search and the re-time all enter ``gate.key_numerics`` with the
    key's problem (CPU: recorded with a stand-in, since a TF32 problem exists on CUDA only)."""
    import contextlib
    import time

    import torch

    from attntune.autotune import gate
    from attntune.cache import CacheStore, WinnerRecord, utcnow
    from attntune.device import device_fingerprint, software_fingerprint
    from attntune.kernels import registry
    from attntune.key import TuneKey

    regret = _regret_module()
    entered, inside = [], []
    real_prepare = gate.prepare

    @contextlib.contextmanager
    def recording(problem):
        entered.append(problem)
        inside.append(True)
        try:
            yield
        finally:
            inside.pop()

    def prepare(problem, device, seed):
        assert inside, "inputs prepared outside the key's numerics"
        return real_prepare(problem, device, seed)

    monkeypatch.setattr(gate, "key_numerics", recording)
    monkeypatch.setattr(gate, "prepare", prepare)
    p = regret._p(2, 4, 4, 64, 64, 32, dtype="float32", device="cpu", causal=True)
    key = TuneKey.from_problem(p, device_fingerprint("cpu"))
    rec = WinnerRecord(key=key, variant="sdpa_math", config={}, median_ms=0.5, sdpa_default_ms=0.25,
                       fingerprint=software_fingerprint(registry.get("sdpa_math").source_hash(), "cpu"),
                       created_at=utcnow())
    st = CacheStore(str(tmp_path / "c.db"))
    assert st.upsert_winner(rec)
    st.dispose()
    (row,) = regret.fidelity(str(tmp_path / "c.db"), torch.device("cpu"), time.time() + 120, rounds=1)
    assert "error" not in row and entered[-1] == key.representative()
    t0 = time.time()
    ref = regret.reference_search(p, torch.device("cpu"), [("sdpa_math", {})], 1.5, time.time() + 120)
    assert ref["best"] == ("sdpa_math", {}) and entered[-1] == p
    # where the search's time went: every phase ran once, and the phases add up to no more than the wall time
    phase = ref["phase_s"]
    assert set(phase) == {"prepare", "gate", "bind", "cheap", "full"} and all(v >= 0 for v in phase.values())
    assert phase["full"] > 0 and phase["gate"] > 0
    assert sum(phase.values()) <= time.time() - t0 + 0.01
    ta, tb = regret.retime(p, ("sdpa_math", {}), ("sdpa_default", {}), torch.device("cpu"), rounds=1)
    assert ta > 0 and tb > 0 and entered[-1] == p and len(entered) == 3


def test_fidelity_summary_sets_throttled_rows_apart():
    """Rows timed while the SM clock sat more than THROTTLE_FRAC below the highest clock seen are counted
    apart; max_fidelity_error stays over every row, max_fidelity_error_full_clock over the others."""
    regret = _regret_module()
    fid = [{"error_frac": 0.056, "sm_mhz": [1785, 1830, 1980]},   # throttled while timed
           {"error_frac": -0.02, "sm_mhz": [1980, 1980, 1980]},
           {"error_frac": 0.01, "sm_mhz": [1965, 1980, 1980]},    # within 3 % of the top: full clock
           {"error_frac": 0.03}]                                  # no NVML: not classified
    s = regret.summarize([], fid)
    assert s["max_fidelity_error"] == 0.056 and s["fidelity_rows"] == 4
    assert s["fidelity_rows_throttled"] == 1 and s["max_fidelity_error_full_clock"] == 0.02
    none = regret.summarize([], [{"error_frac": 0.01}])
    assert none["fidelity_rows_throttled"] is None and none["max_fidelity_error_full_clock"] is None


def _fidelity_cache(tmp_path, problems) -> str:
    """A cache of ``sdpa_math`` rows (0.5 ms, baseline 0.25 ms) for the CPU keys of ``problems``, whose
    representative problems keep the problems' query lengths (the tests tell rows apart by them)."""
    from attntune.cache import CacheStore, WinnerRecord, utcnow
    from attntune.device import device_fingerprint, software_fingerprint
    from attntune.kernels import registry
    from attntune.key import TuneKey

    path = str(tmp_path / "c.db")
    st = CacheStore(path)
    for p in problems:
        key = TuneKey.from_problem(p, device_fingerprint("cpu"))
        assert key.representative().seqlen_q == p.seqlen_q
        rec = WinnerRecord(key=key, variant="sdpa_math", config={}, median_ms=0.5, sdpa_default_ms=0.25,
                           fingerprint=software_fingerprint(registry.get("sdpa_math").source_hash(), "cpu"),
                           created_at=utcnow())
        assert st.upsert_winner(rec)
    st.dispose()
    return path


def test_fidelity_retimes_a_row_timed_on_a_throttled_card(tmp_path, monkeypatch):
    """A row whose SM clock samples say the card throttled while it was re-timed is re-timed again (at most
    RETIME_THROTTLED times); the throttled attempts stay in the row, the last one's figures count, and a row
    timed at full clock is timed once. The decision reads the clock alone."""
    import time

    import torch


    regret = _regret_module()
    clocks = {}  # key length -> the clock samples its successive attempts see

    class Meter:
        def __init__(self, sq):
            self.sq = sq

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.result = {"sm_mhz": clocks[self.sq].pop(0)}

    seen = []
    real_row = regret._fidelity_row

    def row_of(row, rec, problem, device, rounds):
        seen.append(problem.seqlen_q)
        monkeypatch.setattr(regret, "_meter", lambda device, period: Meter(problem.seqlen_q))
        real_row(row, rec, problem, device, rounds)

    monkeypatch.setattr(regret, "_fidelity_row", row_of)
    monkeypatch.setattr(regret, "COOL_S", 0.0)
    full, low = [1980, 1980, 1980], [1785, 1830, 1980]
    clocks.update({64: [full], 48: [low, full], 32: [low, low, low, full]})
    db = _fidelity_cache(tmp_path, [regret._p(2, 4, 4, sq, sq, 32, dtype="float32", device="cpu", causal=True)
                                    for sq in clocks])
    rows = regret.fidelity(db, torch.device("cpu"), time.time() + 120, rounds=1)
    by = {int(r["key"].split("S")[1].split("x")[0]): r for r in rows}
    assert sorted(seen) == sorted([64, 48, 48] + [32] * (1 + regret.RETIME_THROTTLED))
    assert "throttled_attempts" not in by[64] and by[64]["sm_mhz"] == full
    (a,) = by[48]["throttled_attempts"]
    assert a["sm_mhz"] == low and a["now_ms"] > 0 and "relative_error" in a
    assert by[48]["sm_mhz"] == full and by[48]["now_ms"] > 0
    # never throttle-free within the retries: the last (throttled) attempt counts and says so
    assert len(by[32]["throttled_attempts"]) == regret.RETIME_THROTTLED and by[32]["sm_mhz"] == low
    s = regret.summarize([], rows)
    assert s["fidelity_rows_retimed_after_throttle"] == 2 and s["fidelity_rows_throttled"] == 1
    assert s["max_fidelity_error_full_clock"] == max(abs(by[k]["error_frac"]) for k in (64, 48))


def test_fidelity_retimes_a_row_throttled_from_its_first_sample(tmp_path, monkeypatch):
    """The first row timed sees only a throttled clock (1785-1800 MHz), so by itself it looks like full clock;
    the next row runs at 1980. After the pass the first row is judged again against the pass's highest clock
    and re-timed once (whichever key the cache lists first)."""
    import time

    import torch


    regret = _regret_module()
    low, full = [1785, 1790, 1800], [1980, 1980, 1980]
    seen = []

    class Meter:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.result = {"sm_mhz": low if len(seen) == 1 else full}

    real_row = regret._fidelity_row

    def row_of(row, rec, problem, device, rounds):
        seen.append(problem.seqlen_q)
        real_row(row, rec, problem, device, rounds)

    monkeypatch.setattr(regret, "_meter", lambda device, period: Meter())
    monkeypatch.setattr(regret, "_fidelity_row", row_of)
    monkeypatch.setattr(regret, "COOL_S", 0.0)
    db = _fidelity_cache(tmp_path, [regret._p(1, 2, 2, sq, sq, 16, dtype="float32", device="cpu")
                                    for sq in (48, 24)])
    rows = regret.fidelity(db, torch.device("cpu"), time.time() + 120, rounds=1)
    assert len(seen) == 3 and seen[0] == seen[2] != seen[1]
    by = {int(r["key"].split("S")[1].split("x")[0]): r for r in rows}
    first, second = by[seen[0]], by[seen[1]]
    (a,) = first["throttled_attempts"]
    assert a["sm_mhz"] == low and first["sm_mhz"] == full and first["now_ms"] > 0
    assert "throttled_attempts" not in second
    s = regret.summarize([], rows)
    assert s["fidelity_rows_retimed_after_throttle"] == 1 and s["fidelity_rows_throttled"] == 0


def test_a_call_too_short_for_every_key_gives_the_keys_it_tunes_a_reference():
    """Replay of the H100 run of 2026-12-07 (280 s, 9 keys, budgeted tunes of 14-46 s): the equal shares then
    reserved tune time for keys that could not fit and left 4 tuned keys 0 s of reference. Now every key but
    the last one tuned gets at least MIN_REFERENCE_S, and a key that no longer fits is not tuned."""
    regret = _regret_module()
    tunes = [31.8, 14.2, 13.6, 13.8, 29.2, 46.4, 41.4, 18.3, 19.4]
    t, seen, shares, skipped = 0.0, [], [], 0
    for i, tune_s in enumerate(tunes):
        if not regret.worth_tuning(270.0 - t, seen):
            skipped += 1
            continue
        t += tune_s
        seen.append(tune_s)
        share = regret.reference_share(max(0.0, 270.0 - t), len(tunes) - i, sum(seen) / len(seen))
        shares.append(share)
        t += share + regret.RETIME_RESERVE_S
    assert len(shares) >= 6 and skipped >= 1
    assert all(s >= regret.MIN_REFERENCE_S for s in shares[:-1]), shares
