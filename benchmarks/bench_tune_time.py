"""Benchmark: where ``attntune tune``'s time goes — the same keys tuned with every compile cache cold, then
again with them warm, each trial's duration read back from the optuna storage.

Three fresh ``attntune tune`` processes over the same keys and seed:

1. **cold**: fresh Triton and inductor cache directories (every Triton kernel and FlexAttention's inductor
   graph compiles from scratch, as on a new machine);
2. **warm**: the same directories again (every compile is a cache hit), a fresh attntune cache and storage;
3. **profiled** (``--profile``): the warm run again under cProfile; the functions with the most cumulative
   time are kept (host-side cost of a trial once nothing compiles).

Per run: wall seconds, each key's tuning seconds and winner, and per study (one per key) the seconds spent
inside trials by variant (count, sum, max) against the study's span — so that *cold - warm* is the compile
cost and *warm* is what measuring and the tuner itself cost. A short warm-up tune first fills the operating
system's file caches (Python, torch, ptxas) so that the cold run does not pay for them either.

Usage (GPU): python benchmarks/bench_tune_time.py --out $OUT/tune_time.json [--trials 8] [--shapes ...]
(--smoke: one tiny CPU key, to check the script.)
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

# window prefill D128, window training D64 (Mistral-style), decode with kv_lens, dense causal D64
SHAPES = [
    "b=2,hq=32,hkv=8,sq=4096,d=128,causal=1,window=1024:0",
    "b=1,hq=32,hkv=8,sq=4096,d=64,causal=1,window=1023:0,mode=fwd_bwd",
    "b=8,hq=32,hkv=8,sq=1,skv=4096,d=128,kv_lens=1",
    "b=4,hq=16,sq=2048,d=64,causal=1",
]
SMOKE = ["b=1,hq=2,sq=33,d=16,causal=1"]


def trial_times(storage_url: str) -> dict:
    """Per optuna study of ``storage_url``: span, seconds inside trials, and per variant [count, sum, max]."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = {}
    for s in optuna.get_all_study_summaries(storage_url):
        study = optuna.load_study(study_name=s.study_name, storage=storage_url)
        ts = sorted((t for t in study.get_trials(deepcopy=False) if t.datetime_start and t.datetime_complete),
                    key=lambda t: t.datetime_start)
        by: dict = {}
        for t in ts:
            by.setdefault(t.user_attrs.get("variant", "?"), []).append(t.duration.total_seconds())
        span = (ts[-1].datetime_complete - ts[0].datetime_start).total_seconds() if ts else 0.0
        out[s.study_name] = {"trials": len(ts), "span_s": round(span, 2),
                             "in_trials_s": round(sum(sum(x) for x in by.values()), 2),
                             "by_variant": {v: [len(x), round(sum(x), 2), round(max(x), 2)] for v, x in by.items()}}
    return out


def run_tune(shapes, trials: int, device: str, timeout: float, dirs: Path, tag: str, profile: bool = False) -> dict:
    """One fresh ``attntune tune`` process over ``shapes`` with Triton/inductor caches under ``dirs``."""
    work = Path(tempfile.mkdtemp(prefix=f"tt_{tag}_"))
    env = dict(os.environ, TRITON_CACHE_DIR=str(dirs / "triton"), TORCHINDUCTOR_CACHE_DIR=str(dirs / "inductor"),
               ATTNTUNE_SYSTEM_CACHE="")
    cache, storage = str(work / "c.db"), f"sqlite:///{work / 'optuna.db'}"
    prof = work / "tune.prof"
    head = [sys.executable] + (["-m", "cProfile", "-o", str(prof)] if profile else [])
    cmd = head + ["-m", "attntune", "tune", "--cache", cache, "--storage", storage, "--device", device,
                  "--trials", str(trials)]
    for s in shapes:
        cmd += ["--shape", s]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    show = subprocess.run([sys.executable, "-m", "attntune", "show", "--cache", cache, "--no-system", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    rows = json.loads(show.stdout) if show.returncode == 0 and show.stdout.strip() else []
    run = {"run": tag, "rc": proc.returncode, "wall_s": round(wall, 2),
           "tail": proc.stdout[-1200:] + proc.stderr[-600:], "keys": [_row(r.get("record") or {}) for r in rows]}
    try:
        run["studies"] = trial_times(storage)
    except Exception as exc:  # a run that wrote no study still reports its wall time
        run["studies_error"] = repr(exc)
    if profile and prof.exists():
        run["profile_top"] = _profile_top(prof)
    return run


def _profile_top(path: Path, n: int = 40) -> list:
    """The ``n`` functions with the most cumulative seconds: [cumulative, own, calls, 'file:line(name)']."""
    st = pstats.Stats(str(path))
    rows = []
    for (file, line, name), (_cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append([round(ct, 3), round(tt, 3), nc, f"{Path(file).name}:{line}({name})"])
    rows.sort(key=lambda r: -r[0])
    return rows[:n]


def _row(rec: dict) -> dict:
    k = rec.get("key") or {}
    key = ",".join(f"{f}={k.get(f)}" for f in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim",
                                                "causal", "window", "kv_lens", "mode", "dtype"))
    return {"key": key, "variant": rec.get("variant"), "config": rec.get("config"), "ms": rec.get("median_ms"),
            "tuning_s": rec.get("tuning_seconds"), "trials": rec.get("trials")}


def summarize(runs: list) -> dict:
    by = {r["run"]: r for r in runs}
    out = {tag: by[tag]["wall_s"] for tag in by}
    cold, warm = by.get("cold"), by.get("warm")
    if cold and warm:
        out["compile_share"] = round(1 - warm["wall_s"] / cold["wall_s"], 3) if cold["wall_s"] else None
        for tag in ("cold", "warm"):
            st = (by[tag].get("studies") or {}).values()
            n, inside = sum(s["trials"] for s in st), sum(s["in_trials_s"] for s in st)
            out[f"{tag}_trials"] = n
            out[f"{tag}_s_per_trial"] = round(inside / n, 3) if n else None
            out[f"{tag}_outside_trials_s"] = round(by[tag]["wall_s"] - inside, 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/tune_time.json")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--shapes", nargs="+", help="--shape specs (default: four keys of four families)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per tune process")
    ap.add_argument("--profile", action="store_true", help="a third, cProfiled warm run")
    ap.add_argument("--smoke", action="store_true", help="one tiny CPU key (checks the script only)")
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    shapes = args.shapes or (SMOKE if args.smoke else SHAPES)
    doc = {"benchmark": "bench_tune_time", "environment": environment(), "args": vars(args), "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        doc["warmup_wall_s"] = run_tune(shapes[:1], 1, device, args.timeout, Path(scratch) / "w", "fs")["wall_s"]
        dirs = Path(scratch) / "caches"
        for tag in ("cold", "warm") + (("profiled",) if args.profile else ()):
            doc["runs"].append(run_tune(shapes, args.trials, device, args.timeout, dirs, tag, tag == "profiled"))
            doc["summary"] = summarize(doc["runs"])
            out.write_text(json.dumps(doc, indent=1))
            print(json.dumps({k: v for k, v in doc["runs"][-1].items() if k not in ("tail", "profile_top")}),
                  flush=True)
    print(json.dumps(doc["summary"]))
    return 0 if all(r["rc"] == 0 for r in doc["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
