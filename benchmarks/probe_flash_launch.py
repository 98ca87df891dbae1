"""Probe: the host cost of the flash op's launches, Triton's own launch path against ``FastKernel``'s
(the compiled kernel's launcher called directly), side by side in one run (GPU machine).

For each shape and each call path — ``fwd`` (an inference forward through ``flash_attention``), ``fwd_bwd``
(forward + backward through ``flash_attention``: four launches) and ``attention_fwd_bwd`` (the same through
``attntune.attention`` with the variant pinned, ``ATTNTUNE_POLICY=fixed:NAME``: dispatch included) — and
for both launch paths (``direct``: FastKernel on, ``triton``: every launch through ``kernel[grid](...)``),
alternating round by round, medians over ``--reps`` rounds of:

* ``host_us``: host time per call of ``--inner`` calls issued back to back (perf_counter, no sync inside);
* ``single_ms``: one call alone after a sync, CUDA events (its host launch path on the clock, as in a
  host-bound step);
* ``b2b_ms``: the ``--inner`` calls back to back, CUDA events, per call (device time shows when the device
  is the bottleneck).

SDPA's flash backend on the same shape (dense/causal only: SDPA has no window without a mask) is timed
beside for context. Usage: python benchmarks/probe_flash_launch.py --out probe.json [--reps 15]
[--inner 10] [--shapes NAME,...]        (--smoke: a tiny float32 shape on the CPU, Triton interpreter)
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

# name: (B, Hq, Hkv, S, D, causal, left window or None, variant pinned for attntune.attention)
SHAPES = {
    "causal-S256-D64-H8": (1, 8, 8, 256, 64, True, None, "triton_flash"),
    "causal-S1024-D64-GQA": (2, 32, 8, 1024, 64, True, None, "triton_flash"),
    "window-S2048-D128-W512": (2, 16, 16, 2048, 128, True, 512, "triton_local"),
    "hf-mistral-S4096-D64-W1024": (1, 32, 8, 4096, 64, True, 1023, "triton_local"),
}
SMOKE = {"smoke-S40-D16-W7": (1, 2, 1, 40, 16, True, 7, "triton_local")}


def _fast_kernels():
    from attntune.kernels.triton_flash import launch

    return (launch._FWD, launch._PRE, launch._DKDV, launch._DQ)


def _set_direct(on: bool) -> None:
    for fk in _fast_kernels():
        fk.direct = on


def _events_ms(fn, device: str) -> float:
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_shape(spec, reps: int, inner: int, device: str, dtype) -> dict:
    import attntune
    import torch.nn.functional as F
    from attntune.kernels.triton_flash.op import flash_attention

    B, Hq, Hkv, S, D, causal, left, pinned = spec
    window = None if left is None else (left, 0)
    g = torch.Generator(device=device).manual_seed(0)
    mk = (lambda h: torch.randn(B, h, S, D, device=device, dtype=dtype, generator=g))
    q, k, v = (t.requires_grad_() for t in (mk(Hq), mk(Hkv), mk(Hkv)))
    do = mk(Hq)
    os.environ["ATTNTUNE_POLICY"] = f"fixed:{pinned}"
    attntune.reset()

    def fwd():
        with torch.no_grad():
            flash_attention(q, k, v, causal=causal, window=window)

    def fwd_bwd():
        flash_attention(q, k, v, causal=causal, window=window).backward(do)

    def attention_fwd_bwd():
        attntune.attention(q, k, v, causal=causal, window=window).backward(do)

    paths = {"fwd": fwd, "fwd_bwd": fwd_bwd, "attention_fwd_bwd": attention_fwd_bwd}
    if window is None and device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa_fwd_bwd():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv).backward(do)

        paths["sdpa_flash_fwd_bwd"] = sdpa_fwd_bwd
    modes = ("direct", "triton")
    raw = {p: {m: {"host_us": [], "single_ms": [], "b2b_ms": []} for m in modes} for p in paths}
    for p, fn in paths.items():  # warm-up: compiles, plans, FastKernel keys
        for m in modes:
            _set_direct(m == "direct")
            fn(), fn()
    ran = {p["variant"] for p in attntune.stats()["plans"]}
    if ran != {pinned}:
        raise RuntimeError(f"attntune.attention ran {sorted(ran)}, not {pinned}")
    _sync(device)
    for _ in range(reps):
        for p, fn in paths.items():
            for m in modes:
                if p.startswith("sdpa") and m == "triton":
                    continue  # SDPA does not launch through Triton: one figure
                _set_direct(m == "direct")
                r = raw[p][m]
                _sync(device)
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                r["host_us"].append((time.perf_counter() - t0) * 1e6 / inner)
                _sync(device)
                r["single_ms"].append(_events_ms(fn, device))

                def burst():
                    for _ in range(inner):
                        fn()

                r["b2b_ms"].append(_events_ms(burst, device) / inner)
                q.grad = k.grad = v.grad = None
    _set_direct(device == "cuda" and os.environ.get("TRITON_INTERPRET") != "1")
    out = {"shape": {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal, "window": window,
                     "pinned": pinned}, "paths": {}}
    for p in paths:
        rec = {m: {k: statistics.median(v) for k, v in raw[p][m].items() if v} for m in modes}
        rec = {m: r for m, r in rec.items() if r}
        if "triton" in rec:
            rec["triton_over_direct"] = {k: rec["triton"][k] / rec["direct"][k] for k in rec["direct"]}
        out["paths"][p] = rec
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="probe_flash_launch.json")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="a tiny float32 shape on the CPU (Triton interpreter)")
    args = ap.parse_args(argv)
    target = bench_target(args.smoke, SHAPES, SMOKE, "probe_flash_launch")
    if target is None:
        return 2
    shapes, device, dtype = target
    doc = {"benchmark": "probe_flash_launch", "environment": environment(), "args": vars(args), "cases": {}}
    for name in (list(shapes) if args.smoke else args.shapes.split(",")):
        doc["cases"][name] = run_shape(shapes[name], args.reps, args.inner, device, dtype)
        brief = {p: {m: r.get(m) for m in ("triton_over_direct",)} | {"direct": r.get("direct")}
                 for p, r in doc["cases"][name]["paths"].items()}
        print(json.dumps({name: brief}), flush=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
