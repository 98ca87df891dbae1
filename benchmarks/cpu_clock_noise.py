"""Which CPU timing statistic survives a busy machine? (the choice behind attntune.autotune.confirm)

Times one torch SDPA call on the CPU with four statistics, each repeated ``--repeats`` times, on a quiet
machine, with ``--load`` busy-looping Python processes beside it (as ``make demo`` on a 2-core laptop with
a browser open), and with another torch process running ``--torch-threads`` intra-op threads of matrix
products beside it (another model or test suite on the same cores):

* ``plain_median``: the median of 50 calls (the tuner's old full measurement);
* ``min_of_round_medians``: 5 rounds of 10 calls, the smallest round median (the confirmation's CPU rule);
* ``median_of_round_medians``: the same rounds, their median;
* ``timer``: the tuner's measurement (``Timer.full``: the median of the calls during which no thread of
  this process waited for a CPU, from Linux's run-queue delay, attntune.autotune.cpuwait); with it,
  ``contended_share``: how many of its measurements found too few undisturbed calls (and said so).

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

    from attntune.autotune.timing import Timer

    timer = Timer(torch.device("cpu"))
    out = {"plain_median": [], "min_of_round_medians": [], "median_of_round_medians": [], "timer": []}
    flags = []
    for _ in range(repeats):
        out["plain_median"].append(statistics.median(call_ms() for _ in range(50)))
        rounds = [statistics.median(call_ms() for _ in range(10)) for _ in range(5)]
        out["min_of_round_medians"].append(min(rounds))
        out["median_of_round_medians"].append(statistics.median(rounds))
        out["timer"].append(timer.full(fn, []))
        flags.append(bool(timer.last_contention))
    doc = {k: {"mean_ms": statistics.mean(v), "cv": statistics.pstdev(v) / statistics.mean(v), "min_ms": min(v),
               "max_ms": max(v), "values_ms": v} for k, v in out.items()}
    doc["timer"]["contended_share"] = sum(flags) / repeats
    doc["timer"]["contended"] = flags
    doc["timer"]["run_queue_known"] = timer.contention is not None
    return doc


def _matmuls(stop, threads: int) -> None:
    torch.set_num_threads(threads)
    a = torch.randn(800, 800)
    while not stop.is_set():
        a @ a


def _under(load, fn, repeats: int) -> dict:
    """``_measure`` while ``load`` (a list of (target, args)) runs in other processes."""
    ctx = mp.get_context("spawn")  # a forked child of a process that ran OpenMP threads may hang in them
    stop = ctx.Event()
    procs = [ctx.Process(target=t, args=(stop, *a), daemon=True) for t, a in load]
    for p in procs:
        p.start()
    time.sleep(2.0)  # spawned children import torch first
    try:
        return _measure(fn, repeats)
    finally:
        stop.set()
        for p in procs:
            p.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/cpu_clock_noise.json")
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--load", type=int, default=2, help="busy processes during the loaded measurement")
    ap.add_argument("--torch-threads", type=int, default=2,
                    help="intra-op threads of the torch process beside the torch-loaded measurement")
    ap.add_argument("--seq", type=int, default=256, help="sequence length of the timed SDPA call")
    args = ap.parse_args()
    from env import environment  # benchmarks/env.py

    q = torch.randn(2, 4, args.seq, 64)

    def fn():
        F.scaled_dot_product_attention(q, q, q)

    for _ in range(5):
        fn()
    doc = {"benchmark": "cpu_clock_noise", "environment": environment(), "threads": torch.get_num_threads(),
           "call": f"F.scaled_dot_product_attention, q=k=v [2, 4, {args.seq}, 64] float32",
           "quiet": _measure(fn, args.repeats)}
    doc["loaded"] = _under([(_spin, ())] * args.load, fn, args.repeats)
    doc["load_processes"] = args.load
    doc["torch_loaded"] = _under([(_matmuls, (args.torch_threads,))], fn, args.repeats)
    doc["torch_load_threads"] = args.torch_threads
    # Wrong and not said: a figure more than 25 % above the quiet figure of its statistic that nothing
    # flagged (the timer flags its contended measurements; the plain statistics flag nothing).
    for cond in ("quiet", "loaded", "torch_loaded"):
        for k, v in doc[cond].items():
            ref = doc["quiet"][k]["min_ms"]
            flagged = v.get("contended", [False] * len(v["values_ms"]))
            v["wrong_unflagged"] = sum(1 for x, f in zip(v["values_ms"], flagged) if x > 1.25 * ref and not f)
    doc["summary"] = {cond: {k: v["wrong_unflagged"] for k, v in doc[cond].items()}
                      for cond in ("loaded", "torch_loaded")}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for cond in ("quiet", "loaded", "torch_loaded"):
        for k, v in doc[cond].items():
            extra = f"  wrong+unflagged {v['wrong_unflagged']}/{len(v['values_ms'])}"
            extra += f"  contended {v['contended_share']:.2f}" if k == "timer" else ""
            print(f"{cond:12s} {k:24s} mean {v['mean_ms']:.3f} ms  cv {v['cv'] * 100:6.1f} %  "
                  f"range {v['min_ms']:.3f}-{v['max_ms']:.3f}{extra}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
