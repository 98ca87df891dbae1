"""Which CPU timing statistic survives a busy machine? (the choice behind attntune.autotune.confirm)

Times one torch SDPA call on the CPU with three statistics, each repeated ``--repeats`` times, on a quiet
machine and with ``--load`` busy-looping processes beside it (as ``make demo`` on a 2-core laptop with a
browser open):

* ``plain_median``: the median of 50 calls (the tuner's old full measurement);
* ``min_of_round_medians``: 5 rounds of 10 calls, the smallest round median (the confirmation's CPU rule);
* ``median_of_round_medians``: the same rounds, their median.

A statistic is good when its repeats agree (small coefficient of variation) and stay near the quiet
figure. Writes JSON with the environment.

    python benchmarks/cpu_clock_noise.py --out benchmarks/results/cpu_clock_noise.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time

import torch
import torch.nn.functional as F


def _spin(stop) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def _measure(fn, repeats: int) -> dict:
    def call_ms() -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    out = {"plain_median": [], "min_of_round_medians": [], "median_of_round_medians": []}
    for _ in range(repeats):
        out["plain_median"].append(statistics.median(call_ms() for _ in range(50)))
        rounds = [statistics.median(call_ms() for _ in range(10)) for _ in range(5)]
        out["min_of_round_medians"].append(min(rounds))
        out["median_of_round_medians"].append(statistics.median(rounds))
    return {k: {"mean_ms": statistics.mean(v), "cv": statistics.pstdev(v) / statistics.mean(v), "min_ms": min(v),
                "max_ms": max(v), "values_ms": v} for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/cpu_clock_noise.json")
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--load", type=int, default=2, help="busy processes during the loaded measurement")
    args = ap.parse_args()
    from env import environment  # benchmarks/env.py

    q = torch.randn(2, 4, 256, 64)

    def fn():
        F.scaled_dot_product_attention(q, q, q)

    for _ in range(5):
        fn()
    doc = {"benchmark": "cpu_clock_noise", "environment": environment(), "threads": torch.get_num_threads(),
           "quiet": _measure(fn, args.repeats)}
    stop = mp.Event()
    procs = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.load)]
    for p in procs:
        p.start()
    try:
        doc["loaded"] = _measure(fn, args.repeats)
    finally:
        stop.set()
        for p in procs:
            p.join()
    doc["load_processes"] = args.load
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for cond in ("quiet", "loaded"):
        for k, v in doc[cond].items():
            print(f"{cond:6s} {k:24s} mean {v['mean_ms']:.3f} ms  cv {v['cv'] * 100:6.1f} %  "
                  f"range {v['min_ms']:.3f}-{v['max_ms']:.3f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
