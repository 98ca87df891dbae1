"""A training call (forward + backward of one attention call) under ``torch.compile``, side by side:

* ``attntune``: ``attntune.attention`` compiled — the ``attntune::attention_train`` op, which keeps the
  forward's residuals (flash kernels: output and row LSE) and runs the variant's own backward from them;
* ``attntune_recompute``: the same plan through ``attntune::attention`` (the op before
  2026-12-06), whose backward recomputes the forward and differentiates it;
* ``attntune_eager``: ``attntune.attention`` not compiled (the variant's own autograd);
* ``sdpa``: torch SDPA compiled (``is_causal``, or a boolean mask for a window).

Usage: python benchmarks/bench_compile_train.py --out results.json   (CUDA; the shipped cache's plans)
Each case: median ms of ``--reps`` steps (CUDA events around forward + backward, after warm-up), the
plan attntune used, and the ratios attntune_recompute / attntune and sdpa / attntune.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

import attntune  # noqa: E402

NO_WINDOW = -2
CASES = {  # name: (B, Hq, Hkv, S, D, dtype, window)
    "window1024-S16384-D128-bf16": (1, 32, 32, 16384, 128, torch.bfloat16, (1024, 0)),
    "window1024-S4096-D128-bf16-gqa": (4, 32, 8, 4096, 128, torch.bfloat16, (1024, 0)),
    "causal-S4096-D128-bf16-gqa": (4, 32, 8, 4096, 128, torch.bfloat16, None),
    "causal-S2048-D64-bf16": (8, 16, 16, 2048, 64, torch.bfloat16, None),
    "causal-S2048-D64-fp32-tf32": (2, 16, 16, 2048, 64, torch.float32, None),
}


def _step_ms(fn, q, k, v, g, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn(q, k, v).backward(g)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(q, k, v).backward(g)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def _mask(S: int, window, device) -> torch.Tensor:
    i = torch.arange(S, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return (j <= i) & (j >= i - window[0])


def run_case(name: str, reps: int) -> dict:
    B, Hq, Hkv, S, D, dtype, window = CASES[name]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(B, h, S, D, device=dev, dtype=dtype, generator=gen).requires_grad_(True)
               for h in (Hq, Hkv, Hkv))
    g = torch.randn(B, Hq, S, D, device=dev, dtype=dtype, generator=gen)
    wl, wr = window if window is not None else (NO_WINDOW, NO_WINDOW)
    mask = None if window is None else _mask(S, window, dev)

    def new(q, k, v):
        return attntune.attention(q, k, v, causal=True, window=window)

    def recompute(q, k, v):
        return torch.ops.attntune.attention(q, k, v, None, True, False, wl, wr, None, -1, True)

    def sdpa(q, k, v):
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hq != Hkv)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=Hq != Hkv)

    impls = {"attntune": torch.compile(new, fullgraph=True), "attntune_recompute": torch.compile(recompute, fullgraph=True),
             "attntune_eager": new, "sdpa": torch.compile(sdpa, fullgraph=True)}
    row = {"case": name, "shape": {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "dtype": str(dtype).split(".")[-1],
                                   "window": window}, "ms": {}}
    for impl, fn in impls.items():
        try:
            row["ms"][impl] = _step_ms(fn, q, k, v, g, reps)
        except Exception as e:  # noqa: BLE001 — one implementation failing must not lose the others
            row["ms"][impl] = None
            row.setdefault("errors", {})[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        torch.cuda.empty_cache()
    row["plans"] = sorted({f'{p["variant"]}/{p["source"]}' for p in attntune.stats()["plans"]})
    ms = row["ms"]
    if ms.get("attntune"):
        for other in ("attntune_recompute", "attntune_eager", "sdpa"):
            if ms.get(other):
                row[f"{other}_over_attntune"] = ms[other] / ms["attntune"]
    attntune.reset()
    torch._dynamo.reset()
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/compile_train.json")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_compile_train.py needs a CUDA GPU")
    if "tf32" in args.cases:
        torch.backends.cuda.matmul.allow_tf32 = True  # the fp32 case is the TF32 family
        torch.set_float32_matmul_precision("high")
    doc = {"benchmark": "compile_train", "environment": environment(), "args": vars(args), "cases": []}
    for name in [c for c in args.cases.split(",") if c]:
        doc["cases"].append(run_case(name, args.reps))
        print(json.dumps(doc["cases"][-1]), flush=True)
        Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    rec = [c["attntune_recompute_over_attntune"] for c in doc["cases"] if c.get("attntune_recompute_over_attntune")]
    doc["summary"] = {"recompute_over_saved_geomean": statistics.geometric_mean(rec) if rec else None,
                      "recompute_over_saved_min": min(rec, default=None)}
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc["summary"]))


if __name__ == "__main__":
    main()
