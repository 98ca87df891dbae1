"""Probe (GPU): the host seconds a graph-timed (decode) config costs the tuner, with the timer's kept captures
against a capture per measurement, and whether the two agree on the times.

The tuner times decode keys under CUDA graphs (:mod:`attntune.autotune.timing`). Until 2026-12-07 every
measurement captured two graphs (the call, and a flush-only graph to subtract); a config's cheap and full
timing made four captures, each emptying the allocator's cache (``torch.cuda.graph``) and reallocating the
64 MB flush buffer. The timer now keeps its captures (``kept``); ``fresh`` drops them before each measurement,
which restores the old count. On an H100, decode configs cost 0.17-0.24 s each in a reference search
(regret_h100_2026-12-06d_share_first8.json) against 0.026 s for a dense prefill config.

For each decode key of regret's ``families16`` set (up to ``--keys``): the first ``--configs`` gate-passing
configs of its reference list, each measured as the tuner does (a new timer, cheap then full) in both modes,
alternately config by config (a drift reaches both). Per key and mode: median seconds per config; per config
the ratio of the two modes' full times (agreement: ~1.0 within the timer's noise).

Usage: python benchmarks/probe_graph_timer.py --out $OUT/probe_graph_timer.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402
from regret import KEY_SETS, reference_configs  # noqa: E402

from attntune.autotune import gate, timing  # noqa: E402
from attntune.autotune.timing import Timer, TimingOptions, graph_timed, make_call  # noqa: E402
from attntune.kernels import registry  # noqa: E402

MODES = ("kept", "fresh")


def measure(problem, variant, cfg, inp, mode: str) -> dict:
    """One config as the sweep measures it (a new timer; cheap, then full): seconds and ms."""
    fn, grads = make_call(variant, cfg, inp, grads=False)
    t0 = time.perf_counter()
    timer = Timer(inp.device, TimingOptions(), graphs=True)
    if mode == "fresh":
        timing._FLUSH_GRAPHS.clear()
    cheap = timer.cheap(fn, grads)
    if mode == "fresh":
        timer._graphs.clear()
        timing._FLUSH_GRAPHS.clear()
    full = timer.full(fn, grads)
    torch.cuda.synchronize()
    return {"s": time.perf_counter() - t0, "cheap_ms": cheap, "full_ms": full}


def summarize(rows: list) -> dict:
    """Per mode the median seconds a config, the seconds saved a config, and the agreement of the full times.

    >>> rows = [{"kept": {"s": 0.05, "full_ms": 0.010}, "fresh": {"s": 0.2, "full_ms": 0.0102}},
    ...         {"kept": {"s": 0.07, "full_ms": 0.020}, "fresh": {"s": 0.3, "full_ms": 0.0196}}]
    >>> s = summarize(rows)
    >>> s["s_per_config"], s["saved_s_per_config"]
    ({'kept': 0.06, 'fresh': 0.25}, 0.19)
    >>> s["full_ratio_kept_over_fresh"]
    {'median': 1.0004, 'min': 0.980392, 'max': 1.020408}
    """
    per = {m: round(statistics.median(r[m]["s"] for r in rows), 4) for m in MODES}
    ratios = [r["kept"]["full_ms"] / r["fresh"]["full_ms"] for r in rows]
    return {
        "configs": len(rows),
        "s_per_config": per,
        "saved_s_per_config": round(per["fresh"] - per["kept"], 4),
        "full_ratio_kept_over_fresh": {"median": round(statistics.median(ratios), 6),
                                       "min": round(min(ratios), 6), "max": round(max(ratios), 6)},
    }


def probe_key(problem, n_configs: int, deadline: float) -> dict:
    """Both modes over the first ``n_configs`` gate-passing configs of ``problem``'s reference list."""
    device = torch.device("cuda")
    inp = gate.prepare(problem, device, seed=7)
    configs, _ = reference_configs(problem, max_configs=n_configs, keep=[], seed=0)
    rows = []
    for name, cfg in configs:
        if len(rows) >= n_configs or time.time() > deadline:
            break
        variant = registry.get(name)
        try:
            if not gate.check(variant, cfg, inp).ok:
                continue
        except Exception:  # noqa: BLE001 — a config that does not run is not this probe's subject
            continue
        row = {"variant": name, "config": cfg}
        order = MODES if len(rows) % 2 == 0 else MODES[::-1]  # alternate which mode goes first
        for mode in order:
            row[mode] = measure(problem, variant, cfg, inp, mode)
        rows.append(row)
    return {"problem": problem.model_dump(mode="json"), "rows": rows, "summary": summarize(rows) if rows else None}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=3, help="decode keys of families16 to probe")
    ap.add_argument("--configs", type=int, default=10, help="configs per key")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds for the whole probe")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    doc = {"env": environment(), "args": vars(args), "keys": []}
    if not torch.cuda.is_available():
        doc["skipped"] = "needs a CUDA GPU (graph timing)"
    else:
        deadline = time.time() + args.time_limit
        keys = [p for _, p in KEY_SETS["families16"] if graph_timed(p)][: args.keys]
        for p in keys:
            if time.time() > deadline:
                break
            doc["keys"].append(probe_key(p, args.configs, deadline))
            rows = [r for k in doc["keys"] for r in k["rows"]]
            doc["summary"] = summarize(rows) if rows else None
            Path(args.out).write_text(json.dumps(doc, indent=1))
            print(json.dumps(doc["keys"][-1]["summary"]), flush=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
