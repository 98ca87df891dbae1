"""FP8 KV-cache decode (issue #15, item 1) beside bf16 decode, side by side in one run.

    python benchmarks/bench_fp8.py --out benchmarks/results/fp8_h200.json [--quick]

Per case (q_len 1, GQA 32/8 unless said, D 128, bf16 q, ``kv_lens`` = full): the FP8 cache (e4m3, scales
per kv head, :func:`attntune.fp8.quantize_kv`) through ``decode_attention`` at its default config and at
the best of a small grid (splits x BLOCK_N x warps) — and with fp16 queries (``fp16q_fp8_decode``: the
codes widen to fp16, the widening lead), and with V stored keys-contiguous (``fp8_decode_vkeys``,
``quantize_kv(v_layout="keys")``: the PV operand in 16-byte vectors; opt-in, so the summary's FP8 time, the
best over every FP8 entry, names its layout in ``fp8_best_entry``) —, against the same problem in bf16
through torch SDPA (default backend, and each fused backend that runs it; no mask: every length is full) and
through our bf16 decode. Timed under CUDA graphs (``do_bench_cudagraph``, what a serving engine sees) and eagerly
(``do_bench``), rotating over enough copies of the cache that every call reads it from HBM (as
``bench_decode.py``). Bytes: K + V once, in the format read (FP8 TB/s counts FP8 bytes). Relative error
of the FP8 output against a float32 reference on the float cache it was quantised from, and of the bf16
SDPA output likewise, per case.

Summary (``summary``): ``decode_fp8_vs_sdpa_bf16`` (geomean over cases whose bf16 K+V is >= 32 MB, best
SDPA backend, graphs), ``decode_fp8_tbps`` (max), ``decode_b1_kv8k_graph_us``, ``max_rel_error``;
``prefill_fp8_tflops`` and ``prefill_fp8_vs_cudnn_bf16`` (the dense S=4096 D=128 case, eager, the best of
PREFILL_GRID), ``prefill_fp8_vs_cudnn_bf16_geomean`` over the PREFILL cases (``--no-prefill`` skips them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decode import l2_bytes, rotating, time_eager, time_graph  # noqa: E402
from env import environment  # noqa: E402

from attntune import fp8  # noqa: E402
from attntune.kernels.triton_decode.op import decode_attention  # noqa: E402

CASES = [  # (B, KV len, Hq, Hkv)
    (1, 8192, 32, 8), (1, 32768, 32, 8), (1, 131072, 32, 8), (8, 8192, 32, 8), (32, 8192, 32, 8),
    (64, 4096, 32, 8), (8, 32768, 32, 8), (16, 2048, 32, 32),
]
QUICK = [(1, 8192, 32, 8), (32, 8192, 32, 8)]
GRID = dict(num_splits=(0, 1, 2, 4, 8, 16, 32), BLOCK_N=(64, 128), num_warps=(4, 8))
# --wide: bytes in flight (an FP8 tile carries half a bf16 tile's bytes): larger tiles and deeper
# pipelines at the automatic split count, swept for FP8 and bf16 alike
WIDE = dict(num_splits=(0,), BLOCK_N=(128, 256), num_warps=(4, 8), num_stages=(0, 2, 4))
D = 128
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend])):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return run


def rel_err(out, exact) -> float:
    return ((out.float() - exact).norm() / exact.norm()).item()


def bench_case(b, s, hq, hkv, sweep: bool, grid=None):
    gen = torch.Generator(device="cuda").manual_seed(b * 1000 + s)
    bf16_bytes = 2 * b * hkv * s * D * 2
    n = max(1, min(32, math.ceil(4 * l2_bytes() / (bf16_bytes // 2))))  # FP8 copies >= 4x L2
    q = torch.randn(b, hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    lens = torch.full((b,), s, device="cuda", dtype=torch.int32)
    copies, copies8 = [], []
    for _ in range(n):
        k = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        copies8.append(fp8.quantize_kv(k, v))
        if len(copies) < max(1, min(n, math.ceil(4 * l2_bytes() / bf16_bytes))):
            copies.append((k, v))
    rec = {"B": b, "kv_len": s, "Hq": hq, "Hkv": hkv, "D": D, "bf16_kv_bytes": bf16_bytes,
           "fp8_kv_bytes": bf16_bytes // 2, "copies_fp8": len(copies8), "copies_bf16": len(copies),
           "graph_us": {}, "eager_us": {}, "rel_error": {}}

    def fp8_calls(cfg=None, qq=q):
        return [lambda c=c: decode_attention(qq, c[0], c[1], kv_lens=lens, k_scale=c[2], v_scale=c[3],
                                             config=cfg) for c in copies8]

    def bf16_calls(cfg=None):
        return [lambda k=k, v=v: decode_attention(q, k, v, kv_lens=lens, config=cfg) for k, v in copies]

    # the widening lead: fp16 queries make the kernel widen e4m3 codes to fp16 (a paired conversion on
    # sm_89+) instead of bf16 (no direct conversion on sm_90); named apart so the summary stays bf16's
    q16 = q.half()
    # the same codes with V stored keys-contiguous (fp8.V_LAYOUTS): the PV operand read in 16-byte vectors
    copies8_vk = [(k8, fp8.keys_contiguous(v8), ks, vs) for k8, v8, ks, vs in copies8]

    def fp8_vkeys_calls(cfg=None):
        return [lambda c=c: decode_attention(q, c[0], c[1], kv_lens=lens, k_scale=c[2], v_scale=c[3],
                                             config=cfg) for c in copies8_vk]

    impls = {"fp8_decode": fp8_calls(), "fp16q_fp8_decode": fp8_calls(qq=q16), "fp8_decode_vkeys": fp8_vkeys_calls(),
             "bf16_decode": bf16_calls()}
    for name in [None, *SDPA_BACKENDS]:
        fn = _sdpa(name)
        try:
            fn(q, copies[0][0], copies[0][1])
        except Exception as e:  # noqa: BLE001 — a backend that cannot run this problem
            rec.setdefault("sdpa_unavailable", {})[name or "default"] = f"{type(e).__name__}: {e}"[:200]
            continue
        impls[f"sdpa_{name or 'default'}"] = [lambda k=k, v=v, fn=fn: fn(q, k, v) for k, v in copies]
    for name, calls in impls.items():
        f = rotating(calls)
        f()
        torch.cuda.synchronize()
        rec["graph_us"][name] = time_graph(f)
        rec["eager_us"][name] = time_eager(f)
    if sweep:
        grid = grid or GRID
        for label, make in (("fp8_decode", fp8_calls), ("fp8_decode_vkeys", fp8_vkeys_calls),
                            ("bf16_decode", bf16_calls)):
            if label == "bf16_decode" and grid is GRID:
                continue  # the plain sweep is FP8's only (as before)
            best, timed = (math.inf, None), []
            for vals in itertools.product(*grid.values()):
                cfg = dict(zip(grid, vals))
                try:
                    f = rotating(make(cfg))
                    f()
                    t = time_graph(f, rep=10)
                except Exception:  # noqa: BLE001 — out of resources at this shape
                    continue
                timed.append((t, cfg))
                if t < best[0]:
                    best = (t, cfg)
            if best[1] is not None:
                rec[f"{label}_best_config"] = best[1]
                rec[f"{label}_sweep_us"] = [[round(t, 2), c] for t, c in sorted(timed, key=lambda x: x[0])]
                rec["graph_us"][f"{label}_best"] = time_graph(rotating(make(best[1])))
        if "fp8_decode_best_config" in rec:
            rec["fp8_best_config"] = rec["fp8_decode_best_config"]
            rec["graph_us"]["fp16q_fp8_decode_best"] = time_graph(rotating(
                fp8_calls(rec["fp8_decode_best_config"], qq=q16)))
    # error against float32 on the float cache of copy 0
    k, v = copies[0]
    k8, v8, ks, vs = copies8[0]
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    out8 = decode_attention(q, k8, v8, kv_lens=lens, k_scale=ks, v_scale=vs)
    rec["rel_error"]["fp8_decode"] = rel_err(out8, exact)
    rec["rel_error"]["sdpa_default_bf16"] = rel_err(_sdpa(None)(q, k, v), exact)
    sd = [t for n_, t in rec["graph_us"].items() if n_.startswith("sdpa_")]
    fp = min(t for n_, t in rec["graph_us"].items() if n_.startswith("fp8_decode"))
    rec["fp8_best_entry"] = min((t, n_) for n_, t in rec["graph_us"].items() if n_.startswith("fp8_decode"))[1]
    rec["fp8_vs_best_sdpa_graph"] = min(sd) / fp if sd else None
    rec["fp8_tbps"] = rec["fp8_kv_bytes"] / (fp * 1e-6) / 1e12
    return rec


PREFILL = [  # (B, S, Hq, Hkv, causal): the FP8 forward against cuDNN bf16, D=128
    (2, 4096, 32, 8, False), (2, 4096, 32, 8, True), (1, 8192, 32, 8, True)]
PREFILL_GRID = dict(BLOCK_M=(128,), BLOCK_N=(64, 128), num_warps=(8,), num_stages=(2, 3, 4), LOADS=(0, 1, 2))


def bench_prefill(b, s, hq, hkv, causal, device="cuda", d=None, grid=None):
    """The flash forward over e4m3 K/V (both dots FP8; :mod:`attntune.kernels.triton_flash.jit_fwd`) at the
    best of PREFILL_GRID, against SDPA's backends on the bf16 K/V; TF/s counts attention FLOPs
    (4·B·Hq·S²·D, halved when causal). Relative errors against float32 attention over the float K/V.
    ``device``/``d``/``grid``: the CPU smoke test's tiny run (the Triton interpreter; its times mean nothing)."""
    from attntune.kernels.triton_flash.op import flash_attention

    D = d or globals()["D"]
    grid = grid or PREFILL_GRID
    gen = torch.Generator(device=device).manual_seed(b * 7 + s)
    q = torch.randn(b, hq, s, D, device=device, generator=gen, dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, s, D, device=device, generator=gen) for _ in range(2))
    k8, v8, ks, vs = fp8.quantize_kv(k, v)
    kb, vb = k.bfloat16(), v.bfloat16()
    flops = 4 * b * hq * s * s * D * (0.5 if causal else 1.0)
    rec = {"B": b, "S": s, "Hq": hq, "Hkv": hkv, "D": D, "causal": causal, "ms": {}, "sweep_ms": []}
    # V's memory layout: "d" as given ([B, H, S, D], D contiguous: the launch transposes it, copy
    # included in the time); "n" the same logical tensor stored [B, H, D, S] (keys contiguous) — the
    # layout FP8 tensor cores want for the PV dot's B operand, which the launch then takes as it is.
    # Descriptor loads (LOADS 1/2) read either through a descriptor of V^T (jit_fwd's V_T: the launch's
    # copy, or "n" as given); the copy is also timed on its own.
    v8n = v8.transpose(2, 3).contiguous().transpose(2, 3)
    rec["ms"]["v_transpose"] = time_eager(lambda: v8.transpose(2, 3).contiguous()) / 1e3
    for layout, vv in (("d", v8), ("n", v8n)):
        for vals in itertools.product(*grid.values()):
            cfg = dict(zip(grid, vals))
            if cfg["LOADS"] == 2 and cfg["num_warps"] < 8:
                continue
            try:
                t = time_eager(lambda: flash_attention(q, k8, vv, causal=causal, config=cfg, k_scale=ks, v_scale=vs))
                rec["sweep_ms"].append([round(t / 1e3, 4), cfg, layout])
            except Exception as e:  # noqa: BLE001 — a config that does not compile is a row, not a crash
                rec["sweep_ms"].append([None, cfg, layout, f"{type(e).__name__}: {str(e)[:120]}"])
    timed = sorted((r for r in rec["sweep_ms"] if r[0] is not None), key=lambda r: r[0])
    if not timed:
        raise RuntimeError("no FP8 forward config ran")
    best_ms, best_cfg, best_layout = timed[0][0], timed[0][1], timed[0][2]
    rec["ms"]["fp8_flash"], rec["fp8_best_config"], rec["fp8_best_v_layout"] = best_ms, best_cfg, best_layout
    for layout in ("d", "n"):
        rec["ms"][f"fp8_flash_v{layout}"] = min((r[0] for r in timed if r[2] == layout), default=None)
    v8 = v8n if best_layout == "n" else v8
    rec["ms"]["bf16_flash_default"] = time_eager(lambda: flash_attention(q, kb, vb, causal=causal)) / 1e3
    for name in ("cudnn", "flash"):
        try:
            rec["ms"][f"sdpa_{name}"] = time_eager(lambda: _sdpa_causal(name, q, kb, vb, causal)) / 1e3
        except RuntimeError as e:
            rec.setdefault("sdpa_unavailable", {})[name] = f"{type(e).__name__}: {e}"[:200]
    rec["fp8_tflops"] = flops / (best_ms * 1e-3) / 1e12
    if "sdpa_cudnn" in rec["ms"]:
        rec["fp8_vs_cudnn_bf16"] = rec["ms"]["sdpa_cudnn"] / best_ms
        rec["cudnn_tflops"] = flops / (rec["ms"]["sdpa_cudnn"] * 1e-3) / 1e12
    exact = F.scaled_dot_product_attention(q.float(), k.repeat_interleave(hq // hkv, 1),
                                           v.repeat_interleave(hq // hkv, 1), is_causal=causal)
    out = flash_attention(q, k8, v8, causal=causal, config=best_cfg, k_scale=ks, v_scale=vs)
    rec["rel_error"] = {"fp8_flash": rel_err(out, exact),
                        "sdpa_bf16": rel_err(F.scaled_dot_product_attention(q, kb, vb, is_causal=causal,
                                                                            enable_gqa=True), exact)}
    return rec


def _sdpa_causal(backend, q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[backend])):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def summarize(rows, prefill=()):
    big = [r["fp8_vs_best_sdpa_graph"] for r in rows
           if r["bf16_kv_bytes"] >= 32e6 and r["fp8_vs_best_sdpa_graph"]]
    b1 = [min(t for n, t in r["graph_us"].items() if n.startswith("fp8_decode")) for r in rows
          if r["B"] == 1 and r["kv_len"] == 8192 and r["Hkv"] == 8]
    return {"decode_fp8_vs_sdpa_bf16": math.exp(sum(map(math.log, big)) / len(big)) if big else None,
            "decode_fp8_tbps": max((r["fp8_tbps"] for r in rows), default=None),
            "decode_b1_kv8k_graph_us": b1[0] if b1 else None,
            # the dense (non-causal) S >= 4k case, the target shape
            "prefill_fp8_tflops": next((r["fp8_tflops"] for r in prefill if not r["causal"]), None),
            "prefill_fp8_vs_cudnn_bf16": next((r.get("fp8_vs_cudnn_bf16") for r in prefill if not r["causal"]), None),
            # V as a user passes it ([B, H, S, D]): the launch's transposing copy included
            "prefill_fp8_vs_cudnn_bf16_v_as_given": next((r["ms"]["sdpa_cudnn"] / r["ms"]["fp8_flash_vd"] for r in prefill
                                                          if not r["causal"] and r["ms"].get("fp8_flash_vd")
                                                          and r["ms"].get("sdpa_cudnn")), None),
            "prefill_fp8_vs_cudnn_bf16_geomean": (math.exp(sum(math.log(r["fp8_vs_cudnn_bf16"]) for r in prefill)
                                                  / len(prefill)) if prefill and all(r.get("fp8_vs_cudnn_bf16")
                                                                                     for r in prefill) else None),
            "max_rel_error": max([r["rel_error"]["fp8_decode"] for r in rows]
                                 + [r["rel_error"]["fp8_flash"] for r in prefill], default=None)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/fp8_h200.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--wide", action="store_true", help="sweep WIDE (tiles x stages) for FP8 and bf16, not GRID")
    ap.add_argument("--prefill", action=argparse.BooleanOptionalAction, default=True,
                    help="the FP8 flash forward against cuDNN bf16 (PREFILL cases, PREFILL_GRID sweep)")
    ap.add_argument("--decode", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_fp8 needs a CUDA GPU")
    t0 = time.time()
    doc = {"benchmark": "fp8", "environment": environment(), "args": vars(args), "cases": [], "prefill": []}

    def save():
        ok = [c for c in doc["cases"] if "error" not in c]
        doc["summary"] = summarize(ok, [c for c in doc["prefill"] if "error" not in c])
        doc["elapsed_s"] = time.time() - t0
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    for b, s, hq, hkv, causal in (PREFILL[:2] if args.quick else PREFILL) if args.prefill else ():
        try:
            r = bench_prefill(b, s, hq, hkv, causal)
        except Exception as e:  # noqa: BLE001
            r = {"B": b, "S": s, "Hq": hq, "Hkv": hkv, "causal": causal, "error": f"{type(e).__name__}: {e}"}
        torch.cuda.empty_cache()
        doc["prefill"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "sweep_ms"}), flush=True)
        save()
    for b, s, hq, hkv in (QUICK if args.quick else CASES) if args.decode else ():
        try:
            r = bench_case(b, s, hq, hkv, sweep=not args.no_sweep, grid=WIDE if args.wide else None)
        except Exception as e:  # noqa: BLE001
            r = {"B": b, "kv_len": s, "Hq": hq, "Hkv": hkv, "error": f"{type(e).__name__}: {e}"}
        torch.cuda.empty_cache()  # the case's cache copies are gone with its frame
        doc["cases"].append(r)
        print(json.dumps(r), flush=True)
        save()
    print(json.dumps(doc.get("summary"), indent=1))


if __name__ == "__main__":
    main()
