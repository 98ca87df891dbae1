"""Sliding-window training calls (forward + backward) through ``attntune.attention``, one variant pinned at a
time (``ATTNTUNE_POLICY=fixed:NAME``), untuned — what the heuristic's first choice for an untuned
local-training key costs against its alternatives (GPU machine).

Shapes are model-like (an HF Mistral-style layer, Mistral-7B's window 4096, gpt-oss's window 128) or
bench_flash's cases; variants ``triton_local`` (the base of the ratios: > 1 means ours faster),
``triton_flash``, ``gluon_flash`` (the Hopper forward with ``triton_flash``'s backward; sm_90 only) and ``flex``,
alternating round by round so a drifting clock moves all alike. Two CUDA-event
timings per variant, medians over ``--reps`` rounds: ``ms`` — the mean of ``--inner`` fwd+bwd calls issued
back to back (the host runs ahead, as in a model's training step: device time shows); ``ms_single`` — one
call alone after a sync (its host launch path on the clock too, as in a host-bound step). The heuristic's own
pick (``ATTNTUNE_POLICY=heuristic``) is reported by name beside.

Usage: python benchmarks/bench_window_train.py --out window_train.json [--shapes NAME,...] [--reps 15]
       [--inner 8]        (--smoke: a tiny float32 shape on the CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import bench_target, environment  # noqa: E402

import attntune  # noqa: E402

# name: (B, Hq, Hkv, S, D, left window)    — window (left, 0) with causal: key j in [i - left, i]
SHAPES = {
    "hf-mistral-S4096-D64-W1024": (1, 32, 8, 4096, 64, 1023),
    "hf-mistral-B4-S4096-D64-W1024": (4, 32, 8, 4096, 64, 1023),
    "mistral7b-S8192-D128-W4096": (1, 32, 8, 8192, 128, 4095),
    "gptoss-S4096-D64-W128": (2, 64, 8, 4096, 64, 127),
    "bench-S16384-D128-W1024": (1, 32, 32, 16384, 128, 1024),
    "bench-S2048-D128-W512": (2, 16, 16, 2048, 128, 512),
    "small-S1024-D64-W256": (8, 16, 16, 1024, 64, 255),
}
SMOKE = {"smoke-S40-D16-W7": (1, 2, 1, 40, 16, 7)}  # --smoke: the CPU (Triton interpreter), float32
VARIANTS = ("triton_local", "triton_flash", "gluon_flash", "flex")


def _step(q, k, v, do, left):
    out = attntune.attention(q, k, v, causal=True, window=(left, 0))
    out.backward(do)


def _policy(value: str) -> None:
    os.environ["ATTNTUNE_POLICY"] = value
    attntune.reset()


def _timed_ms(fn, device) -> float:
    if device == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def run_shape(name, spec, reps: int, device: str = "cuda", dtype=torch.bfloat16, inner: int = 8) -> dict:
    B, Hq, Hkv, S, D, left = spec
    g = torch.Generator(device=device).manual_seed(0)
    mk = (lambda h: torch.randn(B, h, S, D, device=device, dtype=dtype, generator=g))
    q, k, v = (t.requires_grad_() for t in (mk(Hq), mk(Hkv), mk(Hkv)))
    do = mk(Hq)
    rec = {"shape": {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "window": [left, 0]}, "ms": {}, "errors": {}}
    _policy("heuristic")
    rec["heuristic_plan"] = attntune.explain(q, k, v, causal=True, window=(left, 0)).variant  # grad on: fwd_bwd
    times = {n: [] for n in VARIANTS}
    live = list(VARIANTS)
    for n in VARIANTS:  # warm-up (compiles) and a failure check per variant
        _policy(f"fixed:{n}")
        try:
            for _ in range(2):
                _step(q, k, v, do, left)
            plans = attntune.stats()["plans"]
            got = {p["variant"] for p in plans}
            if n not in got:
                raise RuntimeError(f"the plan ran {sorted(got)}, not {n}")
        except Exception as e:  # noqa: BLE001
            rec["errors"][n] = f"{type(e).__name__}: {str(e)[:200]}"
            live.remove(n)
    single = {n: [] for n in VARIANTS}

    def burst():
        for _ in range(inner):
            _step(q, k, v, do, left)

    for _ in range(reps):
        for n in live:
            _policy(f"fixed:{n}")
            _step(q, k, v, do, left)  # the plan re-resolves after reset: untimed
            # back to back (the host runs ahead, as in a model's step: device time shows) and one call alone
            # after a sync (the host's launch path is on the clock too, as in a host-bound step)
            times[n].append(_timed_ms(burst, device) / inner)
            single[n].append(_timed_ms(lambda: _step(q, k, v, do, left), device))
            q.grad = k.grad = v.grad = None
    rec["ms"] = {n: statistics.median(t) for n, t in times.items() if t}
    rec["ms_single"] = {n: statistics.median(t) for n, t in single.items() if t}
    rec["spread"] = {n: (max(t) - min(t)) / statistics.median(t) for n, t in times.items() if t}
    base, base1 = rec["ms"].get("triton_local"), rec["ms_single"].get("triton_local")
    rec["vs_triton_local"] = {n: t / base for n, t in rec["ms"].items()} if base else {}
    rec["single_vs_triton_local"] = {n: t / base1 for n, t in rec["ms_single"].items()} if base1 else {}
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="window_train.json")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--inner", type=int, default=8, help="calls per back-to-back timing")
    ap.add_argument("--smoke", action="store_true", help="a tiny float32 shape on the CPU (Triton interpreter)")
    args = ap.parse_args(argv)
    target = bench_target(args.smoke, SHAPES, SMOKE, "bench_window_train")
    if target is None:
        return 2
    shapes, device, dtype = target
    doc = {"benchmark": "bench_window_train", "environment": environment(), "args": vars(args), "cases": {}}
    for name in (list(shapes) if args.smoke else args.shapes.split(",")):
        try:
            doc["cases"][name] = run_shape(name, shapes[name], args.reps, device, dtype, args.inner)
        except torch.cuda.OutOfMemoryError as e:
            doc["cases"][name] = {"error": f"OutOfMemoryError: {str(e)[:120]}"}
            torch.cuda.empty_cache()
        c = doc["cases"][name]
        keys = ("heuristic_plan", "ms", "vs_triton_local", "single_vs_triton_local", "errors")
        print(json.dumps({name: {k: c.get(k) for k in keys}}), flush=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
