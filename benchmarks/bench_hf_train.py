"""A Hugging Face training step, SDPA against attntune, eager and under ``torch.compile``: #14's
"Mistral-style HF training step" measured as a user runs it.

The random-weight models of bench_generate.py (8 layers, hidden 2048, 32 query / 8 KV heads, head dim 64;
Mistral-style: sliding window 1024), bf16, ``attn_implementation`` "sdpa" or "attntune" (after
``attntune.hf.register()``), identical weights. A step: forward with ``labels`` (HF's loss), backward, SGD
update. Models alternate step by step within a case, so a drifting host or clock moves both alike; the
median step of each is reported with the ratio sdpa / attntune (> 1: attntune faster).

Usage: python benchmarks/bench_hf_train.py --out hf_train.json [--models mistral,llama] [--seq 4096]
       [--batch 1] [--modes eager,compiled] [--steps 10]        (CUDA; --smoke: tiny float32 models on the CPU)
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
from bench_generate import build_models  # noqa: E402
from env import environment  # noqa: E402

import attntune  # noqa: E402
import attntune.hf  # noqa: E402

IMPLS = ("sdpa", "attntune")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_case(kind: str, mode: str, batch: int, seq: int, steps: int, device, dtype, smoke: bool) -> dict:
    models, cfg = build_models(kind, IMPLS, device, dtype, smoke, max_pos=seq)
    torch._dynamo.reset()
    attntune.reset()
    ids = torch.randint(3, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
    step_fns = {}
    for impl, m in models.items():
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=1e-5)
        loss_fn = (lambda ids, m=m: m(ids, labels=ids).loss)
        if mode == "compiled":
            loss_fn = torch.compile(loss_fn)

        def step(loss_fn=loss_fn, opt=opt):
            loss = loss_fn(ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        step_fns[impl] = step
    times = {impl: [] for impl in IMPLS}
    losses = {}
    row = {"model": kind, "mode": mode, "batch": batch, "seq": seq, "window": getattr(cfg, "sliding_window", None)}
    try:
        for impl, step in step_fns.items():  # warm-up: compiles, plans, autotuned kernels
            for _ in range(2):
                losses[impl] = float(step())
        _sync(device)
        for _ in range(steps):
            for impl, step in step_fns.items():
                t0 = time.perf_counter()
                step()
                _sync(device)
                times[impl].append(time.perf_counter() - t0)
    except torch.OutOfMemoryError:
        row["error"] = "out of memory"
        return row
    row["ms"] = {impl: 1e3 * statistics.median(ts) for impl, ts in times.items()}
    row["ms_min"] = {impl: 1e3 * min(ts) for impl, ts in times.items()}
    row["warmup_loss"] = losses
    row["ratio"] = row["ms"]["sdpa"] / row["ms"]["attntune"]
    row["plans"] = sorted({f'{p["variant"]}/{p["source"]}' for p in attntune.stats()["plans"]})
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/hf_train.json")
    ap.add_argument("--models", default="mistral,llama")
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="tiny float32 models on the CPU (default without CUDA)")
    args = ap.parse_args(argv)
    smoke = args.smoke or not torch.cuda.is_available()
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    if smoke:
        args.seq, args.steps = min(args.seq, 24), min(args.steps, 2)
    attntune.hf.register()
    import transformers

    doc = {"benchmark": "hf_train", "environment": environment(), "transformers": transformers.__version__,
           "args": vars(args), "smoke": smoke, "cases": []}
    for kind in [m for m in args.models.split(",") if m]:
        for mode in [m for m in args.modes.split(",") if m]:
            row = run_case(kind, mode, args.batch, args.seq, args.steps, device, dtype, smoke)
            doc["cases"].append(row)
            print(json.dumps(row), flush=True)
            Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    ratios = [c["ratio"] for c in doc["cases"] if "ratio" in c]
    doc["summary"] = {"geomean_vs_sdpa": statistics.geometric_mean(ratios) if ratios else None,
                      "min_vs_sdpa": min(ratios, default=None),
                      **{f'{c["model"]}_{c["mode"]}_vs_sdpa': c.get("ratio") for c in doc["cases"]}}
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc["summary"]))


if __name__ == "__main__":
    main()
