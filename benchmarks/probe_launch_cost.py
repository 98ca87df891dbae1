"""Probe (GPU): the host time of one launch — a Triton kernel with 13 arguments against single torch ops — the
question behind a fused FP8 cache append (``FP8StaticLayer.update`` launched 9 torch ops per layer and decode step;
eager ``generate`` is host-bound there).

Modes (each called ``--calls`` times back to back, no synchronisation inside; the best of ``--rounds`` rounds,
µs per call on the host's clock):

* ``triton``: a copy kernel with 13 arguments (pointers, ints, two constexprs), cached after warm-up;
* ``torch_div``: one torch op (``x / scale``);
* ``cast_index_copy``: two torch ops (``.to(float8)``, ``index_copy_``), what one of K/V's append took.

Usage: python benchmarks/probe_launch_cost.py --out $OUT/probe_launch_cost.json   (~5 s)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("probe_launch_cost: needs a CUDA GPU")
    import triton
    import triton.language as tl

    @triton.jit
    def copy(a, b, c, d, s, p, n, sa, sb, sc, sd, N: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(c + i, tl.load(a + i, mask=i < N), mask=i < N)

    x = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
    s = torch.ones(8, device="cuda")
    c = torch.empty(1, 8, 4096, 128, device="cuda", dtype=torch.float8_e4m3fn)
    pos = torch.zeros((), dtype=torch.int64, device="cuda")
    modes = {
        "triton": lambda: copy[(8,)](x, x, c, c, s, pos, 1, 1, 2, 3, 4, N=128, BLOCK=128),
        "torch_div": lambda: x / s.view(1, -1, 1, 1),
        "cast_index_copy": lambda: c.view(torch.uint8).index_copy_(
            2, pos.view(1), x.to(torch.float8_e4m3fn).view(torch.uint8)),
    }
    us = {}
    for name, f in modes.items():
        for _ in range(200):
            f()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(args.rounds):
            t = time.perf_counter()
            for _ in range(args.calls):
                f()
            best = min(best, (time.perf_counter() - t) / args.calls * 1e6)
            torch.cuda.synchronize()
        us[name] = round(best, 2)
        print(f"{name:16s} {best:6.2f} µs host per call")
    if args.out:
        doc = {"benchmark": "probe_launch_cost", "environment": environment(), "args": {
            k: str(v) for k, v in vars(args).items()}, "host_us_per_call": us}
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
