"""CPU smoke test of benchmarks/bench_generate.py: the tiny configuration runs end to end in a subprocess
(resident generate cases, one fresh-process case, the eager serving loop, the new-length host cost) and
writes the JSON layout the GPU run will write."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from helpers import bench_module, doctest_results

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_generate.py"
IMPLS = ("sdpa", "attntune")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _no_error(where: str, rec: dict) -> None:
    assert "error" not in rec, f"{where}: {rec['error']}"


def test_bench_generate_smoke(tmp_path):
    out = tmp_path / "generate.json"
    env = dict(os.environ, ATTNTUNE_SYSTEM_CACHE="", ATTNTUNE_CACHE=str(tmp_path / "cache.db"),
               PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)  # a plain CPU run, as a user would start it
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--protocol", "both", "--fresh-models", "llama",
           "--out", str(out)]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    doc = json.loads(out.read_text())

    for key in ("environment", "args", "cases", "fresh", "serving", "new_length", "summary"):
        assert key in doc, key
    assert doc["environment"]["torch"]
    assert doc["args"]["new_tokens"] == 4 and doc["args"]["repeats"] == 1

    cases = doc["cases"]
    assert {(c["model"], c["cache"]) for c in cases} == {(m, c) for m in ("llama", "mistral")
                                                         for c in ("dynamic", "static")}
    for c in cases:
        where = f"{c['model']}/{c['cache']}"
        assert set(c["impls"]) == set(IMPLS), where
        for impl in IMPLS:
            r = c["impls"][impl]
            _no_error(f"{where}/{impl}", r)
            assert len(r["runs_s"]) == 1 and _finite(r["tok_s"]) and r["tok_s"] > 0, (where, impl, r)
            assert _finite(r["median_s"]) and r["min_s"] <= r["median_s"] <= r["max_s"]
            # the run's host meter: CPU and wall time, context switches (no GPU clocks on the CPU)
            (m,) = r["meter"]
            assert m["wall_s"] > 0 and m["cpu_s"] > 0 and m["vcsw"] >= 0 and m["ivcsw"] >= 0
            assert "sm_mhz" not in m and "gpu_util" not in m
            # the host probe before and after the run: a fixed piece of Python work, in µs
            assert len(m["probe_us"]) == 2 and all(_finite(x) and x > 0 for x in m["probe_us"])
        assert _finite(c["ratio"]) and c["ratio"] > 0, where
        # 4 new tokens: 3 gaps between the per-token stamps, a median step per run
        assert all(_finite(c["impls"][i]["step_us_median"]) for i in IMPLS), where
        assert _finite(c["step_ratio"]) and c["step_ratio"] > 0, where
        assert 0.0 <= c["tokens_equal_frac"] <= 1.0, where
        assert c["batch"] == 2 and c["prompt"] == 12 and c["new_tokens"] == 4

    (fresh,) = doc["fresh"]
    assert fresh["model"] == "llama" and set(fresh["impls"]) == set(IMPLS)
    for impl in IMPLS:
        r = fresh["impls"][impl]
        _no_error(f"fresh/{impl}", r)
        assert _finite(r["tok_s"]) and _finite(r["long_prefill_s"]) and len(r["runs_s"]) == 1
        assert len(r["meter"]) == 1 and r["meter"][0]["cpu_s"] > 0
    assert _finite(fresh["ratio"]) and 0.0 <= fresh["tokens_equal_frac"] <= 1.0
    # the CPUs each process ran on (auto pinning leaves a small machine unpinned: children see the parent's)
    assert doc["cpu"]["cpus"] and all(fresh["impls"][i]["cpu"]["cpus"] == doc["cpu"]["cpus"] for i in IMPLS)

    eager = doc["serving"]["eager"]
    for name in ("sdpa", "attntune_causal", "attntune_noncausal"):
        _no_error(f"serving/{name}", eager[name])
        assert _finite(eager[name]["us_per_step"]) and eager[name]["us_per_step"] > 0
    assert "graph" not in doc["serving"]  # no CUDA graphs on the CPU
    for name in IMPLS:
        nl = doc["new_length"][name]
        _no_error(f"new_length/{name}", nl)
        assert _finite(nl["extra_us_median"]) and _finite(nl["extra_us_p90"])

    s = doc["summary"]
    for key in ("geomean_vs_sdpa", "min_vs_sdpa", "swa_prompt4096_vs_sdpa", "static_vs_sdpa",
                "serving_loop_causal_vs_sdpa", "serving_loop_graph_vs_sdpa", "new_length_extra_us"):
        assert key in s, key
    for key in ("geomean_vs_sdpa", "min_vs_sdpa", "static_vs_sdpa", "serving_loop_causal_vs_sdpa",
                "serving_loop_noncausal_vs_sdpa", "new_length_extra_us", "fresh_vs_sdpa",
                "step_geomean_vs_sdpa", "step_min_vs_sdpa", "first_run_geomean_vs_sdpa",
                "best_geomean_vs_sdpa", "best_min_vs_sdpa", "pair_ratio_min"):
        assert _finite(s[key]), (key, s[key])
    assert s["swa_prompt4096_vs_sdpa"] is None  # no 4096-token prompts in the smoke run
    assert s["serving_loop_graph_vs_sdpa"] is None
    assert s["failed_impl_runs"] == 0

    lines = p.stdout.strip().splitlines()
    assert any(ln.split()[:3] == ["model", "cache", "B"] for ln in lines[-8:]), p.stdout[-2000:]


def test_bench_generate_compiled_cases(tmp_path):
    """The compiled static cases run each model:B:P given (on a CPU transformers does not compile: this
    checks the wiring and the JSON), and a malformed list is refused naming the option."""
    out = tmp_path / "generate.json"
    env = dict(os.environ, ATTNTUNE_SYSTEM_CACHE="", ATTNTUNE_CACHE=str(tmp_path / "cache.db"))
    env.pop("TRITON_INTERPRET", None)
    base = [sys.executable, str(SCRIPT), "--smoke", "--models=", "--protocol", "resident", "--no-serving",
            "--no-new-length", "--compiled-static", "--out", str(out)]
    p = subprocess.run(base + ["--compiled-cases", "llama:2:12, mistral:1:10"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["cases"] == []
    got = [(c["model"], c["batch"], c["prompt"]) for c in doc["compiled"]]
    assert got == [("llama", 2, 12), ("mistral", 1, 10)]
    for c in doc["compiled"]:
        assert c["compiled"] and c["cache"] == "static" and c["worked"] == {i: True for i in IMPLS}, c
    assert doc["compiled_static"] == doc["compiled"][0]
    s = doc["summary"]
    assert _finite(s["compiled_geomean_vs_sdpa"]) and _finite(s["compiled_min_vs_sdpa"])
    assert s["compiled_static_vs_sdpa"] == doc["compiled"][0]["ratio"]
    bad = subprocess.run(base + ["--compiled-cases", "llama:2"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert bad.returncode != 0 and "--compiled-cases" in bad.stderr, bad.stderr[-2000:]


def test_spread_fields_pair_best_and_noise():
    _spread_fields = bench_module("bench_generate")._spread_fields
    per = {"sdpa": {"runs_s": [1.0, 1.3, 1.1]}, "attntune": {"runs_s": [0.8, 1.0, 1.2]}}
    f = _spread_fields(per)
    assert [round(x, 6) for x in f["pair_ratios"]] == [1.25, 1.3, round(1.1 / 1.2, 6)]
    assert f["ratio_best"] == 1.0 / 0.8
    assert {k: round(v, 6) for k, v in f["same_impl_spread"].items()} == {"sdpa": 0.3, "attntune": 0.5}
    assert _spread_fields({"sdpa": {"runs_s": [1.0]}})["ratio_best"] is None


def test_parse_cpus_pins_only_where_asked_and_available():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_generate", SCRIPT)
    bg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bg)
    n = bg.AUTO_PIN_CPUS
    assert bg.parse_cpus("auto", range(2)) is None  # a 2-core CI machine stays unpinned
    assert bg.parse_cpus("auto", range(16)) == list(range(n))
    assert bg.parse_cpus("none", range(16)) is None
    assert bg.parse_cpus("2-4,9", range(16)) == [2, 3, 4, 9]
    with pytest.raises(SystemExit, match="not available"):
        bg.parse_cpus("3,40", range(16))
    with pytest.raises(SystemExit, match="--cpus"):
        bg.parse_cpus("fast", range(16))


def test_run_meter_samples_a_clock_thread_and_reports_min_median_max(monkeypatch):
    """With NVML present the meter samples the SM clock on a thread while the run lasts."""
    import threading
    import types

    bench_generate = bench_module("bench_generate")
    clocks = iter([1980, 1200, 1755, 1980, 990] + [1500] * 1000)
    fake = types.SimpleNamespace(NVML_CLOCK_SM=1, nvmlInit=lambda: None,
                                 nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
                                 nvmlDeviceGetClockInfo=lambda h, kind: next(clocks),
                                 nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(
                                     gpu=next(utils), memory=0),
                                 nvmlDeviceGetPowerUsage=lambda h: next(power),
                                 NVML_TEMPERATURE_GPU=0,
                                 nvmlDeviceGetTemperature=lambda h, kind: next(temps),
                                 nvmlDeviceGetCurrentClocksEventReasons=lambda h: next(reasons))
    temps = iter([61, 83, 70] + [75] * 1000)
    reasons = iter([0x1, 0x4, 0x1] + [0x20] * 1000)  # idle, power cap, idle, then thermal
    utils = iter([40, 97, 12] + [55] * 1000)
    power = iter([650_400, 120_000, 300_000] + [400_000] * 1000)  # mW
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(bench_generate, "_NVML", {})  # NVML handles are kept per process
    import torch

    meter = bench_generate.RunMeter(torch.device("cuda", 0), period=0.001)
    done, t_end = threading.Event(), time.monotonic() + 30
    with meter:
        while len(meter.samples) < 5 and time.monotonic() < t_end:
            done.wait(0.001)
    lo, mid, hi = meter.result["sm_mhz"]
    assert lo <= mid <= hi and lo in (990, 1200, 1500) and hi == 1980
    ulo, umid, uhi = meter.result["gpu_util"]
    assert ulo <= umid <= uhi and uhi == 97 and ulo in (12, 40, 55)
    plo, pmid, phi = meter.result["power_w"]
    assert plo <= pmid <= phi and phi == 650 and plo in (120, 300, 400)
    tlo, tmid, thi = meter.result["temp_c"]
    assert tlo <= tmid <= thi and thi == 83 and tlo in (61, 70, 75)
    # the reasons of every sample, idle left out (samples between kernels are idle)
    assert meter.result["clock_reasons"] in (["sw_power_cap"], ["sw_power_cap", "sw_thermal"])
    assert meter.result["wall_s"] > 0


def test_run_meter_reads_clock_reasons_through_the_older_nvml_name(monkeypatch):
    import threading
    import types

    bench_generate = bench_module("bench_generate")
    fake = types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0, nvmlInit=lambda: None,
                                 nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
                                 nvmlDeviceGetClockInfo=lambda h, kind: 1755,
                                 nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=90, memory=0),
                                 nvmlDeviceGetPowerUsage=lambda h: 500_000,
                                 nvmlDeviceGetTemperature=lambda h, kind: 80,
                                 nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x8)  # no "...EventReasons"
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(bench_generate, "_NVML", {})
    import torch

    meter = bench_generate.RunMeter(torch.device("cuda", 0), period=0.001)
    done, t_end = threading.Event(), time.monotonic() + 30
    with meter:
        while len(meter.temp) < 2 and time.monotonic() < t_end:
            done.wait(0.001)
    assert meter.result["clock_reasons"] == ["hw_slowdown"] and meter.result["temp_c"] == [80, 80, 80]
    res = doctest_results(bench_generate.clock_reasons)
    assert res and all(failed == 0 for _, failed in res) and sum(n for n, _ in res) == 1


def test_slow_run_attribution_compares_slow_and_fast_runs_and_skips_first_runs():
    bench_generate = bench_module("bench_generate")

    def meter(probe, util, steal):
        return {"wall_s": 1.0, "cpu_s": 1.0, "probe_us": [probe, probe], "gpu_util": [util, util, util],
                "steal": steal}

    cases = [
        # first runs (index 0) are left out whatever their speed: SDPA's pays cuDNN's graph builds
        {"impls": {"sdpa": {"step_us": [60000, 7000, 13000], "meter": [meter(900, 5, 0), meter(300, 40, 1),
                                                                         meter(600, 20, 7)]},
                   "attntune": {"step_us": [13000, 12900, 7100], "meter": [meter(600, 20, 0),
                                                                           meter(620, 21, 5),
                                                                           meter(310, 41, 0)]}}},
        # too few runs, or runs without a meter: not counted
        {"impls": {"sdpa": {"step_us": [7000], "meter": [meter(300, 40, 0)]},
                   "attntune": {"step_us": [7000, 9000]}}},
    ]
    a = bench_generate.slow_run_attribution(cases)
    assert a["slow"]["runs"] == 2 and a["fast"]["runs"] == 2
    assert a["slow"]["probe_us_median"] == 610 and a["fast"]["probe_us_median"] == 305
    assert math.isclose(a["probe_slow_over_fast"], 2.0)
    assert a["slow"]["gpu_util_median"] == 20.5 and a["slow"]["steal_ticks"] == 12
    assert a["fast"]["steal_ticks"] == 1


def test_bench_generate_fp8static_case_is_reported_apart(tmp_path):
    """``--caches fp8static``: attntune generates through its FP8 KV cache, SDPA through HF's static cache;
    the case runs for both and its ratio goes to ``fp8static_vs_sdpa``, never into the like-for-like ones."""
    out = tmp_path / "generate.json"
    env = dict(os.environ, ATTNTUNE_SYSTEM_CACHE="", ATTNTUNE_CACHE=str(tmp_path / "cache.db"),
               PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--protocol", "resident", "--models", "llama",
           "--caches", "static,fp8static", "--no-serving", "--no-new-length", "--no-prefill-split",
           "--compiled-static", "--out", str(out)]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    doc = json.loads(out.read_text())
    by_cache = {c["cache"]: c for c in doc["cases"]}
    assert set(by_cache) == {"static", "fp8static"}
    for c in by_cache.values():
        for impl in IMPLS:
            _no_error(f"{c['cache']}/{impl}", c["impls"][impl])
    s = doc["summary"]
    assert s["fp8static_vs_sdpa"] == pytest.approx(by_cache["fp8static"]["ratio"])
    assert s["static_vs_sdpa"] == pytest.approx(by_cache["static"]["ratio"])
    assert s["geomean_vs_sdpa"] == pytest.approx(by_cache["static"]["ratio"])  # the fp8 case stays apart
    # --compiled-static: each compiled case also runs the FP8 cache, reported apart as well
    comp = {c["cache"]: c for c in doc["compiled"]}
    assert set(comp) == {"static", "fp8static"} and doc["compiled_static"]["cache"] == "static"
    for c in comp.values():
        assert "error" not in c, c.get("error")


def test_each_compiled_case_starts_from_an_empty_dynamo_cache(monkeypatch):
    """A compiled case resets dynamo before its first generate: earlier cases' graphs share the recompile
    limit of transformers' forward wrapper, and past it a case silently ran uncompiled (H100, 2026-12-05:
    the 4th compiled case of a run measured 0.30x SDPA, 1.26x when run first). An eager case keeps the
    cache (it compiles nothing and must not throw away a compiled neighbour's graphs)."""
    import types

    import torch

    bg = bench_module("bench_generate")
    events = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))

    def fake_generate(model, ids, mask, n, cache, compile_ok=False, clock=None):
        events.append(("generate", model, compile_ok))
        return torch.zeros(ids.shape[0], ids.shape[1] + n, dtype=torch.long)

    monkeypatch.setattr(bg, "generate", fake_generate)
    args = types.SimpleNamespace(new_tokens=3, warmup_tokens=2, repeats=1, prefill_split=False)
    models = {"sdpa": "m_sdpa", "attntune": "m_att"}
    for compile_ok in (True, False):
        events.clear()
        rec = bg.run_case(models, "llama", "static", 2, 5, args, torch.device("cpu"), 32, compile_ok=compile_ok)
        assert rec["compiled"] is compile_ok
        gens = [e for e in events if e != "reset"]
        assert gens and all(e[2] is compile_ok for e in gens)
        if compile_ok:
            assert events[0] == "reset" and events.count("reset") == 1, events
        else:
            assert "reset" not in events, events


def test_a_compiled_case_where_one_side_compiled_nothing_stays_out_of_the_ratios():
    """The H100 run's 4th compiled case: SDPA compiled a graph, attntune none (dynamo at its recompile
    limit), 0.30x — a compiled model against an eager one. It is named in ``compiled_lopsided_cases`` and kept
    out of the compiled ratios; cases where neither side compiled (a CPU) or both did stay in."""
    bg = bench_module("bench_generate")

    def case(model, ratio, graphs):
        return {"model": model, "batch": 8, "prompt": 512, "cache": "static", "ratio": ratio, "compiled": True,
                "impls": {i: {"dynamo_graphs_compiled": g} for i, g in zip(IMPLS, graphs)}}

    good, bad, cpu = case("llama", 1.8, (1, 1)), case("mistral", 0.3, (1, 0)), case("llama", 1.1, (0, 0))
    doc = {"cases": [], "compiled": [bad, good, cpu], "compiled_static": bad}
    s = bg.summarize(doc)
    assert s["compiled_lopsided_cases"] == ["mistral:8:512:static"]
    assert s["compiled_min_vs_sdpa"] == 1.1 and abs(s["compiled_geomean_vs_sdpa"] - (1.8 * 1.1) ** 0.5) < 1e-12
    assert s["compiled_static_vs_sdpa"] is None
    assert bg.summarize({"cases": [], "compiled": [good], "compiled_static": good})["compiled_static_vs_sdpa"] == 1.8
