"""Probe (GPU): does the float32 forward with TF32 dots gain from V stored keys-contiguous?

Only 16-bit wgmma reads a B operand that is not K-major; the PV dot's B operand is V's [BN, D] tile,
D-contiguous as users pass it. FP8 gained 2.4x from a keys-contiguous copy of V (fp8_h200.json); this
times the float32 forward (``set_float32_matmul_precision("high")``: TF32 dots) over a list of configs
with the launcher's switch :data:`attntune.kernels.triton_flash.launch.TF32_V_KEYS` off (V as given) and
on (copied keys-contiguous inside the call, so the copy is timed in), beside SDPA default and
FlexAttention on the same inputs. ``triton.testing.do_bench`` medians, L2 flushed.

``--train``: forward + backward (float32, TF32) over a list of backward configs with
:data:`~attntune.kernels.triton_flash.launch.TF32_B_COPIES` off and on (q, dO and k copied so that the
backward's dV, dK and dQ dots read K-major B tiles; the copies timed in), beside SDPA default's fwd+bwd.

Usage: python benchmarks/probe_tf32.py --out probe_tf32.json [--train]
       TRITON_INTERPRET=1 python benchmarks/probe_tf32.py --dry-run --train --out /tmp/p.json   # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

# (name, B, H, S, D, causal)
CASES = [("dense-S4096-D128", 4, 16, 4096, 128, False), ("causal-S4096-D128", 4, 16, 4096, 128, True)]
CONFIGS = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
           for bm, bn, w, s in [(128, 32, 8, 4), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3),
                                (128, 64, 4, 2), (64, 128, 4, 2)]]


DEV = "cuda"
TRAIN_CASES = [("train-causal-S4096-D128", 2, 16, 4096, 128, True), ("train-dense-S2048-D64", 4, 16, 2048, 64, False)]
# (BWD_BLOCK_M, BWD_BLOCK_N, BWD_WARPS, BWD_STAGES): fp32 tiles that fit 227 KiB without the copies' tiles
TRAIN_BWD = [(32, 64, 4, 2), (16, 64, 4, 3), (32, 64, 8, 3), (16, 128, 8, 2), (64, 64, 8, 1), (32, 64, 4, 1)]


def _bench(fn, rep, grad_to_none=None):
    """``triton.testing.do_bench`` on the GPU; one wall-clock call under --dry-run (checks the script)."""
    if DEV == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, rep=rep, grad_to_none=grad_to_none)
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def train_cases(args, doc):

    from attntune.kernels.triton_flash import launch
    from attntune.kernels.triton_flash.op import flash_attention

    fwd = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    for name, b, h, s, d, causal in TRAIN_CASES:
        g = torch.Generator(device=DEV).manual_seed(1)
        q, k, v = (torch.randn(b, h, s, d, device=DEV, generator=g).requires_grad_() for _ in range(3))
        do = torch.randn(b, h, s, d, device=DEV, generator=g)
        flops = 3.5 * 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        case = {"name": name, "flops": flops, "ours": []}
        refs = [t.double() for t in (q, k, v)]
        ro = F.scaled_dot_product_attention(*refs, is_causal=causal)
        rg = torch.autograd.grad(ro, refs, do.double())
        for bm, bn, w, st in TRAIN_BWD:
            bwd = dict(BWD_BLOCK_M=bm, BWD_BLOCK_N=bn, BWD_WARPS=w, BWD_STAGES=st)
            row = {"bwd_config": bwd}
            for copies in (False, True):
                launch.TF32_B_COPIES = copies
                key = "copies" if copies else "as_given"
                try:
                    def fn():
                        return flash_attention(q, k, v, causal=causal, config=fwd, bwd_config=bwd).backward(do)
                    out = flash_attention(q, k, v, causal=causal, config=fwd, bwd_config=bwd)
                    gs = torch.autograd.grad(out, (q, k, v), do)
                    err = max((a.double() - r).abs().max().item() for a, r in zip(gs, rg))
                    ms = _bench(fn, rep=args.rep, grad_to_none=[q, k, v])
                    row[key] = {"ms": ms, "tflops": flops / ms / 1e9, "max_grad_err": err}
                except Exception as e:  # noqa: BLE001 — a config that does not compile or fit is recorded
                    row[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            launch.TF32_B_COPIES = True
            case["ours"].append(row)
            print(name, bwd, {k_: round(v_.get("ms", float("nan")), 3) for k_, v_ in row.items() if k_ != "bwd_config"},
                  flush=True)
        case["sdpa_default_ms"] = _bench(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do), rep=args.rep,
            grad_to_none=[q, k, v])
        for lay in ("as_given", "copies"):
            best = min((r[lay]["ms"] for r in case["ours"] if "ms" in r[lay]), default=None)
            case[f"best_{lay}_ms"] = best
            case[f"best_{lay}_vs_sdpa"] = case["sdpa_default_ms"] / best if best else None
        print(name, {k_: v_ for k_, v_ in case.items() if k_.startswith(("best", "sdpa"))}, flush=True)
        doc["train"].append(case)
        Path(args.out).write_text(json.dumps(doc, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/probe_tf32_h200.json")
    ap.add_argument("--rep", type=int, default=60, help="do_bench rep (ms)")
    ap.add_argument("--dry-run", action="store_true", help="tiny cases on the CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--train", action="store_true", help="forward+backward cases only (the backward's copies)")
    args = ap.parse_args(argv)
    global DEV, CASES, TRAIN_CASES, CONFIGS, TRAIN_BWD
    if args.dry_run:
        DEV = "cpu"
        CASES = [("tiny-causal", 1, 2, 40, 32, True)]
        TRAIN_CASES = [("tiny-train", 1, 2, 40, 32, True)]
        CONFIGS = [dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)]
        TRAIN_BWD = [(16, 16, 4, 1)]

    from attntune.kernels.triton_flash import launch
    from attntune.kernels.triton_flash.op import flash_attention

    torch.set_float32_matmul_precision("high")
    doc = {"benchmark": "probe_tf32", "environment": environment(), "args": vars(args), "cases": [], "train": []}
    t0 = time.time()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.train:
        train_cases(args, doc)
    for name, b, h, s, d, causal in [] if args.train else CASES:
        g = torch.Generator(device=DEV).manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device=DEV, generator=g) for _ in range(3))
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        case = {"name": name, "flops": flops, "ours": []}
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal).float()
        for cfg in CONFIGS:
            row = {"config": cfg}
            for keys in (False, True):
                launch.TF32_V_KEYS = keys
                try:
                    fn = lambda: flash_attention(q, k, v, causal=causal, config=cfg)  # noqa: E731
                    err = (fn() - ref).abs().max().item()
                    ms = _bench(fn, rep=args.rep)
                    row["v_keys" if keys else "v_as_given"] = {"ms": ms, "tflops": flops / ms / 1e9, "max_err": err}
                except Exception as e:  # noqa: BLE001 — a config that does not compile is recorded
                    row["v_keys" if keys else "v_as_given"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            launch.TF32_V_KEYS = True
            case["ours"].append(row)
            print(name, cfg, {k: round(v.get("ms", float("nan")), 3) for k, v in row.items() if k != "config"},
                  flush=True)
        case["sdpa_default_ms"] = _bench(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), rep=args.rep)
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            fx = torch.compile(flex_attention)
            bm = create_block_mask(lambda b_, h_, i, j: i >= j, None, None, s, s) if causal else None
            fx(q, k, v, block_mask=bm)
            case["flex_ms"] = _bench(lambda: fx(q, k, v, block_mask=bm), rep=args.rep)
        except Exception as e:  # noqa: BLE001
            case["flex_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        for lay in ("v_as_given", "v_keys"):
            best = min((r[lay]["ms"] for r in case["ours"] if "ms" in r[lay]), default=None)
            case[f"best_{lay}_ms"] = best
            case[f"best_{lay}_vs_sdpa"] = case["sdpa_default_ms"] / best if best else None
        print(name, {k: v for k, v in case.items() if k.startswith(("best", "sdpa", "flex"))}, flush=True)
        doc["cases"].append(case)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
    doc["elapsed_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
