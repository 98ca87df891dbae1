"""Regret of the budgeted tuner against an exhaustive grid, per key.

For each key: (1) tune with the shipped budget (``--trials``), (2) tune again with a budget larger than
the key's whole valid grid (every config of every candidate variant is enumerated; only configs whose
first measurement is already >1.5x the best are stopped early), then (3) re-time both winners side by
side, interleaved, with the tuner's own timer. regret = t(budgeted winner) / t(exhaustive winner) - 1.

Usage: python benchmarks/regret.py --out regret.json [--trials 12] [--keys decode10] [--time-limit S]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

from attntune.autotune import gate  # noqa: E402
from attntune.autotune.runner import tune  # noqa: E402
from attntune.autotune.timing import Timer, TimingOptions, graph_timed, make_call  # noqa: E402
from attntune.device import default_device  # noqa: E402
from attntune.kernels import registry  # noqa: E402
from attntune.problem import AttentionProblem  # noqa: E402


def _p(b, hq, hkv, sq, skv, d, **kw):
    return AttentionProblem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_kv=skv, head_dim=d,
                            head_dim_v=d, dtype="bfloat16", device_type="cuda", **kw)


KEY_SETS = {
    # Decode keys of the default and decode suites (D=128, bf16): all share compiled kernels, which is
    # what makes an exhaustive grid affordable in a short GPU lease.
    "decode10": [_p(b, 32, hkv, 1, s, 128, kv_lens=True) for b, s, hkv in (
        (1, 1024, 8), (1, 4096, 8), (1, 8192, 8), (1, 32768, 8), (4, 8192, 8), (8, 8192, 8),
        (16, 2048, 8), (32, 8192, 8), (64, 4096, 8), (16, 2048, 32))],
    # CPU smoke test of this script (SDPA CPU backends only).
    "cpu2": [_p(2, 4, 4, 128, 128, 64).model_copy(update={"dtype": "float32", "device_type": "cpu"}),
             _p(2, 4, 4, 128, 128, 64, causal=True).model_copy(update={"dtype": "float32", "device_type": "cpu"})],
    "window4": [_p(4, 16, 16, 8192, 8192, 64, causal=True, window=(512, 0)),
                _p(2, 32, 8, 4096, 4096, 128, causal=True, window=(1024, 0)),
                _p(1, 32, 8, 16384, 16384, 128, causal=True, window=(1024, 0)),
                _p(16, 16, 16, 2048, 2048, 64, causal=True)],
}


def retime(problem, a, b, device, rounds=5):
    """Median ms of two (variant, config) winners, timed alternately on the same inputs."""
    inp = gate.prepare(problem, device, seed=123)
    timer = Timer(device, TimingOptions(), graphs=graph_timed(problem))
    calls = []
    for name, cfg in (a, b):
        v = registry.get(name)
        assert gate.check(v, cfg, inp).ok
        calls.append(make_call(v, cfg, inp, grads=problem.mode == "fwd_bwd"))
    ts = ([], [])
    for _ in range(rounds):
        for i, (fn, grads) in enumerate(calls):
            ts[i].append(timer.full(fn, grads))
    return statistics.median(ts[0]), statistics.median(ts[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/regret_h200.json")
    ap.add_argument("--trials", type=int, default=12, help="the budget under test")
    ap.add_argument("--keys", default="decode10", help=",".join(KEY_SETS))
    ap.add_argument("--time-limit", type=float, default=None, help="wall seconds for the exhaustive pass")
    args = ap.parse_args()
    device = default_device()
    problems = [p for ks in args.keys.split(",") for p in KEY_SETS[ks]]
    tmp = Path(tempfile.mkdtemp())
    t0 = time.time()
    budget = {r.key_id: r for r in tune(problems, cache=str(tmp / "budget.db"), storage="memory",
                                        trials=args.trials, seed=1)}
    t_budget = time.time() - t0
    t0 = time.time()
    full = {r.key_id: r for r in tune(problems, cache=str(tmp / "full.db"), storage="memory", trials=100000,
                                      seed=2, time_limit=args.time_limit)}
    t_full = time.time() - t0
    rows = []
    for p in problems:
        from attntune.device import device_fingerprint
        from attntune.key import TuneKey

        kid = TuneKey.from_problem(p, device_fingerprint(device)).key_id
        b, f = budget.get(kid), full.get(kid)
        row = {"key": p.short(), "key_id": kid}
        if b is None or f is None:
            row["error"] = "not tuned in the time limit" if f is None else "budgeted tune found no winner"
            rows.append(row)
            continue
        row.update(budget_winner=[b.variant, b.config], budget_trials=b.trials, exhaustive_winner=[f.variant, f.config],
                   exhaustive_trials=f.trials)
        if (b.variant, b.config) == (f.variant, f.config):
            row.update(regret=0.0, same_choice=True, budget_ms=b.median_ms, exhaustive_ms=f.median_ms)
        else:
            tb, tf = retime(p, (b.variant, b.config), (f.variant, f.config), device)
            row.update(regret=tb / tf - 1, same_choice=False, budget_ms=tb, exhaustive_ms=tf)
        rows.append(row)
        print(json.dumps(row), flush=True)
    regrets = [r["regret"] for r in rows if "regret" in r]
    geo = math.exp(sum(math.log(1 + max(x, 0.0)) for x in regrets) / len(regrets)) - 1 if regrets else None
    doc = {"benchmark": "regret", "environment": environment(), "trials_budget": args.trials,
           "budget_pass_s": t_budget, "exhaustive_pass_s": t_full, "rows": rows,
           "summary": {"keys": len(regrets), "geomean_regret": geo, "max_regret": max(regrets, default=None),
                       "same_choice": sum(r.get("same_choice", False) for r in rows)}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["summary"], indent=1), f"budget pass {t_budget:.0f}s, exhaustive pass {t_full:.0f}s")


if __name__ == "__main__":
    main()
