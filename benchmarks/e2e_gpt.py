"""End-to-end: the GPT-style decoder of benchmarks/gpt.py with eager attention, SDPA default and attntune.

Reproduces the product's reference table on one GPU, all implementations measured in one run:
  * inference tokens/ms at seq 2048 · batch 16 (forward, no grad)
  * training samples/s at seq 4096 · batch 8 (forward + backward + SGD step)
  * peak memory of one training step at seq 8192 · batch 4
  * a sliding-window (Mistral-style) configuration: forward + training at seq 16384 · batch 1, W=1024

Usage: python benchmarks/e2e_gpt.py --out results.json [--quick] [--compiled] [--cases training,...]
``--compiled`` wraps the model in ``torch.compile`` (what a user's compiled training step gets: attntune's
calls become its custom ops) and compares SDPA with attntune only (the eager implementation's masked scores
are not what anyone compiles).
Weights are random (seeded); identical for every implementation. CPU: a tiny smoke configuration.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402
from gpt import GPT, GPTConfig  # noqa: E402


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn, reps: int, warmup: int = 2) -> float:
    """Median seconds per call (device-synchronised wall clock around each call)."""
    for _ in range(warmup):
        fn()
    _sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def _model(cfg, impl, device, dtype):
    torch.manual_seed(0)
    return GPT(cfg, impl).to(device=device, dtype=dtype)


def run_case(name, cfg, impl, device, dtype, batch, seq, kind, reps, compiled=False):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = _model(cfg, impl, device, dtype)
    if compiled:
        torch._dynamo.reset()
        model = torch.compile(model)
    tokens = torch.randint(0, cfg.vocab, (batch, seq), device=device)
    res = {"case": name, "impl": impl, "batch": batch, "seq": seq, "kind": kind, "window": cfg.window,
           "compiled": compiled}
    try:
        if kind == "inference":
            model.eval()

            def step():
                with torch.no_grad():
                    model(tokens)

            t = _time(step, reps)
            res.update(seconds=t, tokens_per_ms=batch * seq / (t * 1e3))
        else:
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)

            def step():
                logits = model(tokens)
                loss = torch.nn.functional.cross_entropy(logits.float().view(-1, cfg.vocab), tokens.view(-1))
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            t = _time(step, reps, warmup=2 if compiled else 1)
            res.update(seconds=t, samples_per_s=batch / t)
        if device.type == "cuda":
            res["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    except torch.OutOfMemoryError:
        res["error"] = "out of memory"
    model = None  # free the weights before the next case
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/e2e_gpt.json")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--compiled", action="store_true", help="torch.compile the model; SDPA and attntune only")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    reps = 3 if args.quick else 5
    base = GPTConfig() if gpu else GPTConfig(vocab=256, d_model=64, n_heads=4, n_kv_heads=4, n_layers=2)
    win = GPTConfig(**{**base.__dict__, "window": 1024 if gpu else 16})
    if gpu:
        cases = [("inference", base, 16, 2048, "inference"), ("training", base, 8, 4096, "training"),
                 ("memory", base, 4, 8192, "training"),
                 ("window_inference", win, 1, 16384, "inference"), ("window_training", win, 1, 16384, "training")]
    else:
        cases = [("inference", base, 2, 64, "inference"), ("training", base, 2, 64, "training"),
                 ("window_inference", win, 1, 96, "inference")]
    if args.cases:
        cases = [c for c in cases if c[0] in args.cases.split(",")]
    impls = ("sdpa", "attntune") if args.compiled else ("eager", "sdpa", "attntune")
    results = []
    for name, cfg, b, s, kind in cases:
        for impl in impls:
            r = run_case(name, cfg, impl, device, dtype, b, s, kind, 2 if name == "memory" else reps, args.compiled)
            if args.compiled and impl == "attntune":
                import attntune

                r["plans"] = sorted({f'{p["variant"]}/{p["source"]}' for p in attntune.stats()["plans"]})
                attntune.reset()
            results.append(r)
            print(json.dumps(r), flush=True)
    summary = {}
    for name, *_ in cases:
        rows = {r["impl"]: r for r in results if r["case"] == name and "error" not in r}
        if args.compiled and "sdpa" in rows and "attntune" in rows:
            summary[name] = {"attntune_speedup_vs_sdpa": rows["sdpa"]["seconds"] / rows["attntune"]["seconds"]}
        elif "eager" in rows and "attntune" in rows:
            e, a = rows["eager"], rows["attntune"]
            s_ = rows.get("sdpa")
            summary[name] = {
                "attntune_speedup_vs_eager": e["seconds"] / a["seconds"],
                "attntune_speedup_vs_sdpa": (s_["seconds"] / a["seconds"]) if s_ else None,
                "sdpa_speedup_vs_eager": (e["seconds"] / s_["seconds"]) if s_ else None,
            }
            if "peak_gib" in a and "peak_gib" in e:
                summary[name]["attntune_memory_change_vs_eager"] = a["peak_gib"] / e["peak_gib"] - 1
    doc = {"benchmark": "e2e_gpt", "compiled": args.compiled, "environment": environment(), "model": base.__dict__, "dtype": str(dtype),
           "results": results, "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"\n{'case':18s} {'impl':9s} {'ms':>9s} {'tok/ms|samp/s':>14s} {'peak GiB':>9s}")
    for r in results:
        rate = r.get("tokens_per_ms", r.get("samples_per_s", float("nan")))
        print(f"{r['case']:18s} {r['impl']:9s} {1e3 * r.get('seconds', float('nan')):9.2f} {rate:14.2f} "
              f"{r.get('peak_gib', float('nan')):9.2f} {r.get('error', '')}")
    for k, v in summary.items():
        print(k, {a: (round(b, 3) if b is not None else None) for a, b in v.items()})


if __name__ == "__main__":
    main()
