"""Where ``attntune tune`` spends a key's time: cProfile of one tune run (fresh Triton cache), summed by
phase — Triton compiles (``triton.compile``), FlexAttention's torch.compile, the correctness gate, timing,
the confirmation round, the reference and inputs, optuna — each as cumulative seconds of its entry point.

Usage (GPU): TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/profile_tune.py --out $OUT/profile_tune.json
    --shape b=1,hq=32,hkv=8,sq=4096,d=64,causal=1,window=1023:0,mode=fwd_bwd [--compile-workers 0]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

# phase: (file suffix, function name) of its entry point; cumulative times of nested phases overlap
PHASES = {
    "triton_compile": ("triton/compiler/compiler.py", "compile"),
    "precompile_batches": ("autotune/precompile.py", "precompile"),
    "flex_compile": ("torch/_dynamo/eval_frame.py", "_fn"),
    "gate": ("autotune/gate.py", "check"),
    "inputs_and_reference": ("autotune/gate.py", "prepare"),
    "timing_full": ("autotune/timing.py", "full"),
    "timing_cheap": ("autotune/timing.py", "cheap"),
    "confirm": ("autotune/confirm.py", "confirm"),
    "optuna_ask": ("optuna/study/study.py", "ask"),
    "optuna_tell": ("optuna/study/study.py", "tell"),
    "sweep_total": ("autotune/sweep.py", "_run"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/profile_tune.json")
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--compile-workers", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    from attntune.autotune.runner import run_tuning
    from attntune.autotune.shapes import parse_shape

    problems = [parse_shape(s, device_type=args.device, dtype="bfloat16" if args.device == "cuda" else "float32")
                for s in args.shape]
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        prof.enable()
        res = run_tuning(problems, cache=str(Path(tmp) / "c.db"), storage="memory", trials=args.trials,
                         compile_workers=args.compile_workers)
        prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    phases = {}
    for name, (suffix, func) in PHASES.items():
        tot, calls = 0.0, 0
        for (file, _line, fn), (cc, nc, tt, ct, callers) in stats.stats.items():
            if fn == func and file.replace("\\", "/").endswith(suffix):
                tot, calls = tot + ct, calls + nc
        phases[name] = {"s": round(tot, 3), "calls": calls}
    doc = {"benchmark": "profile_tune", "environment": environment(), "args": vars(args), "wall_s": wall,
           "keys": [{"key": r.key.short(), "status": r.status, "trials": r.trials, "seconds": r.seconds}
                    for r in res], "phases": phases}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps({"wall_s": round(wall, 1), "keys": doc["keys"], "phases": phases}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
