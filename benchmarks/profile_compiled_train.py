"""Where a compiled training step's time goes: benchmarks/gpt.py's decoder under ``torch.compile``, SDPA
against attntune, one ``torch.profiler`` run of a few steps each; the top CUDA kernels by total time.

Usage: python benchmarks/profile_compiled_train.py --out prof.json [--batch 8 --seq 4096]  (CUDA)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402
from gpt import GPT, GPTConfig  # noqa: E402


def profile(impl: str, batch: int, seq: int, steps: int) -> dict:
    torch.manual_seed(0)
    torch._dynamo.reset()
    cfg = GPTConfig()
    model = torch.compile(GPT(cfg, impl).to(device="cuda", dtype=torch.bfloat16))
    tokens = torch.randint(0, cfg.vocab, (batch, seq), device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        loss = torch.nn.functional.cross_entropy(model(tokens).float().view(-1, cfg.vocab), tokens.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            rows.append({"name": e.key[:160], "calls": e.count, "us_per_step": t / steps})
    rows.sort(key=lambda r: -r["us_per_step"])
    return {"impl": impl, "steps": steps, "kernels": rows[:25],
            "device_us_per_step": sum(r["us_per_step"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/profile_compiled_train.json")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    doc = {"benchmark": "profile_compiled_train", "environment": environment(), "args": vars(args), "runs": []}
    for impl in ("sdpa", "attntune"):
        r = profile(impl, args.batch, args.seq, args.steps)
        doc["runs"].append(r)
        print(impl, f"{r['device_us_per_step']:.0f} us/step")
        for k in r["kernels"][:14]:
            print(f"  {k['us_per_step']:9.1f} us  x{k['calls'] // args.steps:<3d} {k['name'][:110]}")
        Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
