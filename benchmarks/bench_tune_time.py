"""Benchmark: wall time of ``attntune tune`` with configs compiled ahead in batches (``--compile-workers``,
default: the host's cores) against one compile per trial (``--compile-workers 0``), same keys, same seed.

Each run is a fresh ``attntune tune`` process with a fresh Triton cache directory (every kernel compiles
from scratch, as on a new machine), a fresh attntune cache and in-memory optuna storage. A short warm-up
tune first fills the operating system's file caches (Python, torch, ptxas) so that neither timed run pays
for them. Per run: the wall time, each key's tuning seconds and winner (``attntune show --json``); then
the ratio and whether the two runs chose the same winners (they measure the same configs, so a different
winner can only come from timing noise between near-equal configs).

Usage (GPU): python benchmarks/bench_tune_time.py --out $OUT/tune_time.json [--trials 8] [--shapes ...]
(--smoke: one tiny CPU key, to check the script; nothing compiles ahead on the CPU.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

# decode with kv_lens, window prefill, dense causal D64, window training (Mistral-style), TF32 prefill
SHAPES = [
    "b=8,hq=32,hkv=8,sq=1,skv=4096,d=128,kv_lens=1",
    "b=2,hq=32,hkv=8,sq=4096,d=128,causal=1,window=1024:0",
    "b=4,hq=16,sq=2048,d=64,causal=1",
    "b=1,hq=32,hkv=8,sq=4096,d=64,causal=1,window=1023:0,mode=fwd_bwd",
]
SMOKE = ["b=1,hq=2,sq=33,d=16,causal=1"]


def run_tune(shapes, workers, trials: int, device: str, timeout: float) -> dict:
    """One fresh ``attntune tune`` process over ``shapes``: wall seconds and the stored rows."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TRITON_CACHE_DIR=str(Path(tmp) / "triton"), ATTNTUNE_SYSTEM_CACHE="")
        cache = str(Path(tmp) / "c.db")
        cmd = [sys.executable, "-m", "attntune", "tune", "--cache", cache, "--storage", "memory", "--device", device,
               "--trials", str(trials)]
        for s in shapes:
            cmd += ["--shape", s]
        if workers is not None:
            cmd += ["--compile-workers", str(workers)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        show = subprocess.run([sys.executable, "-m", "attntune", "show", "--cache", cache, "--no-system", "--json"],
                              env=env, capture_output=True, text=True, timeout=120)
        rows = json.loads(show.stdout) if show.returncode == 0 and show.stdout.strip() else []
        return {"workers": workers, "rc": proc.returncode, "wall_s": wall,
                "tail": proc.stdout[-1500:] + proc.stderr[-800:],
                "keys": [_row(r.get("record") or {}) for r in rows]}


def _row(rec: dict) -> dict:
    k = rec.get("key") or {}
    key = ",".join(f"{f}={k.get(f)}" for f in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim",
                                                "causal", "window", "kv_lens", "mode", "dtype"))
    return {"key": key, "variant": rec.get("variant"), "config": rec.get("config"), "ms": rec.get("median_ms"),
            "tuning_s": rec.get("tuning_seconds"), "trials": rec.get("trials")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/tune_time.json")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--shapes", nargs="+", help="--shape specs (default: four keys of four families)")
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds per tune process")
    ap.add_argument("--smoke", action="store_true", help="one tiny CPU key (checks the script only)")
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    shapes = args.shapes or (SMOKE if args.smoke else SHAPES)
    doc = {"benchmark": "bench_tune_time", "environment": environment(), "args": vars(args), "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    warm = run_tune(shapes[:1], 0, 1, device, args.timeout)  # fills the OS file caches only
    doc["warmup_wall_s"] = warm["wall_s"]
    for workers in (0, None):  # None: the default (the host's cores)
        doc["runs"].append(run_tune(shapes, workers, args.trials, device, args.timeout))
        out.write_text(json.dumps(doc, indent=1))
        print(json.dumps({k: v for k, v in doc["runs"][-1].items() if k != "tail"}), flush=True)
    serial, ahead = doc["runs"]
    same = {k["key"]: (k["variant"], k["config"]) for k in serial["keys"]} == \
        {k["key"]: (k["variant"], k["config"]) for k in ahead["keys"]}
    doc["summary"] = {"keys": len(shapes), "serial_wall_s": serial["wall_s"], "ahead_wall_s": ahead["wall_s"],
                      "speedup": serial["wall_s"] / ahead["wall_s"] if ahead["wall_s"] else None,
                      "both_ok": serial["rc"] == 0 and ahead["rc"] == 0, "same_winners": same}
    out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["summary"]))
    return 0 if doc["summary"]["both_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
