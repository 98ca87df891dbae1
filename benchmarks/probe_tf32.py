"""Probe (GPU): does the float32 forward with TF32 dots gain from V stored keys-contiguous?

Only 16-bit wgmma reads a B operand that is not K-major; the PV dot's B operand is V's [BN, D] tile,
D-contiguous as users pass it. FP8 gained 2.4x from a keys-contiguous copy of V (fp8_h200.json); this
times the float32 forward (``set_float32_matmul_precision("high")``: TF32 dots) over a list of configs
with the launcher's switch :data:`attntune.kernels.triton_flash.launch.TF32_V_KEYS` off (V as given) and
on (copied keys-contiguous inside the call, so the copy is timed in), beside SDPA default and
FlexAttention on the same inputs. ``triton.testing.do_bench`` medians, L2 flushed.

Usage: python benchmarks/probe_tf32.py --out probe_tf32.json
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


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/probe_tf32_h200.json")
    ap.add_argument("--rep", type=int, default=60, help="do_bench rep (ms)")
    args = ap.parse_args(argv)
    import triton.testing

    from attntune.kernels.triton_flash import launch
    from attntune.kernels.triton_flash.op import flash_attention

    torch.set_float32_matmul_precision("high")
    doc = {"benchmark": "probe_tf32", "environment": environment(), "args": vars(args), "cases": []}
    t0 = time.time()
    for name, b, h, s, d, causal in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=g) for _ in range(3))
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
                    ms = triton.testing.do_bench(fn, rep=args.rep)
                    row["v_keys" if keys else "v_as_given"] = {"ms": ms, "tflops": flops / ms / 1e9, "max_err": err}
                except Exception as e:  # noqa: BLE001 — a config that does not compile is recorded
                    row["v_keys" if keys else "v_as_given"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            launch.TF32_V_KEYS = True
            case["ours"].append(row)
            print(name, cfg, {k: round(v.get("ms", float("nan")), 3) for k, v in row.items() if k != "config"},
                  flush=True)
        case["sdpa_default_ms"] = triton.testing.do_bench(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), rep=args.rep)
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            fx = torch.compile(flex_attention)
            bm = create_block_mask(lambda b_, h_, i, j: i >= j, None, None, s, s) if causal else None
            fx(q, k, v, block_mask=bm)
            case["flex_ms"] = triton.testing.do_bench(lambda: fx(q, k, v, block_mask=bm), rep=args.rep)
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
