"""Can a Hopper forward with explicit async wgmma beat our Triton forward (#14 item 2)? A Gluon probe.

Why Gluon: Triton (3.6 and 3.9) places ``wgmma.wait_group 0`` right after every ``tl.dot`` of the flash loop,
so reordering the source cannot overlap the softmax with the tensor cores (``--ptx-order`` shows it: compiled
for sm_90, each dot's commit is followed by a wait for 0 before the first ``ex2``, with or without the next
block's QKᵀ issued ahead). FlashAttention-3's intra-warpgroup pipelining needs the waits under the kernel's
control, which Gluon gives (``warpgroup_mma(..., is_async=True)``, ``warpgroup_mma_wait(num_outstanding)``).

The kernel is the library's ``gluon_flash`` variant (``kernels/gluon_flash``, experimental: ``ATTNTUNE_GLUON=1``):
``BM`` query rows per program, K/V blocks of ``BN`` keys through a ``STAGES``-deep TMA ring, the softmax of block j
running while the tensor cores do P_{j-1} V_{j-1} (its module docstring has the schedule). This probe runs it
directly, over the forward contract of ``kernels/triton_flash`` for 16-bit inputs (GQA, causal in both alignments,
windows, odd lengths, padded head dims, LSE, rows with no key): first a correctness grid against a float32
reference, then its configs timed beside SDPA cuDNN, SDPA flash and our Triton forward.

    python benchmarks/probe_gluon_fwd.py --out $OUT/probe_gluon_fwd.json   # GPU: check, then time (~1 min)
    python benchmarks/probe_gluon_fwd.py --compile                         # CPU: compile for sm_90 only
    python benchmarks/probe_gluon_fwd.py --ptx-order                       # CPU: where Triton's tl.dot waits
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

from attntune.kernels.gluon_flash.config import GluonFwdConfig
from attntune.kernels.gluon_flash.launch import compile_for, forward

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ptx_of import resources  # noqa: E402

GRID = dict(BM=(128,), BN=(64, 128), STAGES=(2, 3), num_warps=(8,), WS=(0, 1))


def launch(q, k, v, cfg, causal=False, window=None, causal_align="bottom_right"):
    """The library's Gluon forward (``kernels/gluon_flash``) with a probe config dict; returns (o, lse)."""
    return forward(q, k, v, typed(cfg), causal=causal, causal_align=causal_align, window=window)


def typed(cfg):
    return GluonFwdConfig(BLOCK_M=cfg["BM"], BLOCK_N=cfg["BN"], num_stages=cfg["STAGES"], num_warps=cfg["num_warps"],
                          WS=cfg["WS"])


def configs():
    keys = list(GRID)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(GRID[k] for k in keys))]


MASKS = {"dense": (False, False), "causal": (False, True), "window": (True, True)}


def compile_only(ds=(128, 64, 80), masks=tuple(MASKS), arch=90):
    """Compile every probe config for ``sm_{arch}`` without a GPU, per head dim and mask kind; returns
    {"D/mask/config": shared bytes, wgmma count, the wait_group counts, registers and spills, or the error}."""
    res = {}
    for d, mask, cfg in itertools.product(ds, masks, configs()):
        has_left, has_right = MASKS[mask]
        name = f"D{d}/{mask}/" + "/".join(str(cfg[k]) for k in GRID)
        try:
            kern = compile_for(typed(cfg), d, has_left=has_left, has_right=has_right, arch=arch)
        except Exception as e:  # noqa: BLE001 — report each config's failure
            res[name] = {"error": f"{type(e).__name__}: {str(e)[-900:]}"}
            continue
        ptx = kern.asm["ptx"]
        res[name] = {"shared_bytes": kern.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                     "wait_groups": sorted({ln.split()[-1].rstrip(";") for ln in ptx.splitlines()
                                            if "wgmma.wait_group" in ln})}
        res_ = resources(ptx)  # ptxas -v (benchmarks/ptx_of.py)
        res[name].update(registers=res_["registers"], spill_bytes=[res_["spill_stores"], res_["spill_loads"]])
    return res


def dot_wait_order(arch=90):
    """Triton's own flash loop compiled for sm_{arch}: the sequence of wgmma issue (M), commit (C), wait (W<n>)
    and ex2 (e) in the PTX — with the next block's QKᵀ issued before this block's softmax (PIPE=1) or not."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = {}
    for pipe in (0, 1):
        sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "S": "i32", "qk_scale": "fp32",
               "PIPE": "constexpr", "BM": "constexpr", "BN": "constexpr", "D": "constexpr"}
        k = triton.compile(ASTSource(_tl_loop, sig, constexprs={"PIPE": pipe, "BM": 128, "BN": 64, "D": 128}),
                           target=GPUTarget("cuda", arch, 32), options={"num_warps": 8, "num_stages": 3})
        ev = []
        for ln in k.asm["ptx"].splitlines():
            s = ln.strip()
            e = ("M" if s.startswith("wgmma.mma_async") else "C" if s.startswith("wgmma.commit_group")
                 else "W" + s.split()[-1].rstrip(";") if s.startswith("wgmma.wait_group")
                 else "e" if s.startswith("ex2.approx") else None)
            if e and (not ev or ev[-1][0] != e):
                ev.append([e, 1])
            elif e:
                ev[-1][1] += 1
        out[f"PIPE={pipe}"] = " ".join(f"{e}x{n}" if n > 1 else e for e, n in ev)
    return out


@triton.jit
def _tl_step(acc, l_i, m_i, qk, v, qk_scale):
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    return tl.dot(p.to(v.dtype), v, acc * alpha[:, None]), l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _tl_loop(Q, K, V, O, S, qk_scale, PIPE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    """The flash loop in plain Triton, PIPE=1 issuing block j+1's QKᵀ before block j's softmax (for --ptx-order)."""
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    base = tl.program_id(1).to(tl.int64) * S * D
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    if PIPE:
        qk = tl.dot(q, tl.load(K + base + offs_n[None, :] * D + offs_d[:, None]))
        for n0 in tl.range(0, S - BN, BN):
            qk_next = tl.dot(q, tl.load(K + base + (n0 + BN + offs_n)[None, :] * D + offs_d[:, None]))
            v = tl.load(V + base + (n0 + offs_n)[:, None] * D + offs_d[None, :])
            acc, l_i, m_i = _tl_step(acc, l_i, m_i, qk, v, qk_scale)
            qk = qk_next
        v = tl.load(V + base + (S - BN + offs_n)[:, None] * D + offs_d[None, :])
        acc, l_i, m_i = _tl_step(acc, l_i, m_i, qk, v, qk_scale)
    else:
        for n0 in tl.range(0, S, BN):
            qk = tl.dot(q, tl.load(K + base + (n0 + offs_n)[None, :] * D + offs_d[:, None]))
            v = tl.load(V + base + (n0 + offs_n)[:, None] * D + offs_d[None, :])
            acc, l_i, m_i = _tl_step(acc, l_i, m_i, qk, v, qk_scale)
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(tl.bfloat16))


# correctness grid: (B, Hq, Hkv, Sq, Skv, D, causal, causal_align, window) — odd lengths, GQA, padded D, rows
# that admit no key (bottom-right causal with Sq > Skv), one- and two-sided windows, top-left alignment
CHECKS = [
    (2, 8, 2, 333, 1000, 80, True, "bottom_right", None),
    (1, 4, 4, 1000, 333, 128, True, "bottom_right", None),
    (2, 6, 3, 515, 515, 64, False, "bottom_right", (127, 0)),
    (3, 4, 2, 77, 77, 96, False, "bottom_right", None),
    (1, 4, 2, 300, 700, 64, False, "bottom_right", (100, 50)),
    (1, 4, 2, 200, 500, 64, True, "top_left", None),
    (1, 2, 1, 4096, 4096, 128, False, "bottom_right", None),
]
# timing: (B, H, S, D, causal) — the #14 targets: D128 S>=4k dense >= 600 TF/s; D64, D80/96 >= 1.05x cuDNN
TIMES = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (8, 32, 4096, 64, False), (4, 32, 4096, 96, False),
         (2, 32, 8192, 128, False)]


def reference(q, k, v, causal, causal_align, window):
    """float32 attention with the library's reference (rows admitting no key: 0 and LSE -inf): (out, lse)."""
    from attntune.kernels.reference import masked_softmax_attention
    from attntune.problem import problem_from_tensors

    problem = problem_from_tensors(q, k, v, causal=causal, causal_align=causal_align, window=window)
    return masked_softmax_attention(q, k, v, problem, compute_dtype=torch.float32, return_lse=True)


def gpu_run(time_limit: float):
    """The correctness grid (each shape with two configs, against a float32 reference), then per timing case every
    probe config beside SDPA cuDNN, SDPA flash and our Triton forward (default config, pointer / descriptor loads)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attntune.kernels.triton_flash.op import flash_attention

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from env import environment

    t0 = time.time()
    doc = {"benchmark": "probe_gluon_fwd", "environment": environment(), "checks": [], "cases": []}
    for b, hq, hkv, sq, skv, d, causal, align, window in CHECKS:
        torch.manual_seed(0)
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        ref_o, ref_lse = reference(q, k, v, causal, align, window)
        for cfg in (configs()[0], configs()[1], configs()[-1]):  # 64/2 one partition and WS; 128/3 WS
            rec = {"shape": [b, hq, hkv, sq, skv, d], "causal": causal, "align": align, "window": window,
                   "config": cfg}
            try:
                o, lse = launch(q, k, v, cfg, causal=causal, window=window, causal_align=align)
                torch.cuda.synchronize()
                fin = torch.isfinite(ref_lse)
                rec.update(rel_err=((o.float() - ref_o).norm() / ref_o.norm()).item(),
                           lse_max_err=(lse[fin] - ref_lse[fin]).abs().max().item() if fin.any() else 0.0,
                           lse_inf_match=bool(torch.equal(torch.isinf(lse), ~fin)),
                           nan=bool(torch.isnan(o).any()))
                rec["ok"] = (rec["rel_err"] < 1e-2 and rec["lse_max_err"] < 1e-2 and rec["lse_inf_match"]
                             and not rec["nan"])
            except Exception as e:  # noqa: BLE001
                rec.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            doc["checks"].append(rec)
            print("check", rec, flush=True)
    doc["checks_ok"] = all(r["ok"] for r in doc["checks"])
    print("checks_ok", doc["checks_ok"], flush=True)
    for b, h, s, d, causal in TIMES:
        if time.time() - t0 > time_limit:
            break
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        rec = {"b": b, "h": h, "s": s, "d": d, "causal": causal, "configs": {}, "baselines": {}}

        def tf(ms):
            return flops / ms / 1e9

        def sdpa():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        for name, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    ms = triton.testing.do_bench(sdpa, warmup=50, rep=300)
                rec["baselines"][name] = {"ms": ms, "tflops": tf(ms)}
            except Exception as e:  # noqa: BLE001
                rec["baselines"][name] = {"error": str(e)[:200]}
        for loads in (0, 1):  # our Triton forward, its default config with pointer / descriptor loads
            ms = triton.testing.do_bench(lambda: flash_attention(q, k, v, causal=causal, config={"LOADS": loads}),
                                         warmup=50, rep=300)
            rec["baselines"][f"triton_flash_loads{loads}"] = {"ms": ms, "tflops": tf(ms)}
        for cfg in configs():
            name = "/".join(str(cfg[kk]) for kk in GRID)
            try:
                ms = triton.testing.do_bench(lambda: launch(q, k, v, cfg, causal=causal), warmup=50, rep=300)
                rec["configs"][name] = {"ms": ms, "tflops": tf(ms)}
            except Exception as e:  # noqa: BLE001
                rec["configs"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        best = min((c["ms"] for c in rec["configs"].values() if "ms" in c), default=None)
        cudnn = rec["baselines"]["sdpa_cudnn"].get("ms")
        rec["best_tflops"] = tf(best) if best else None
        rec["best_vs_cudnn"] = cudnn / best if best and cudnn else None
        print(b, h, s, d, causal, {k_: round(v_.get("tflops", 0), 1) for k_, v_ in rec["baselines"].items()},
              {k_: round(v_.get("tflops", 0), 1) for k_, v_ in rec["configs"].items()}, "vs cuDNN",
              rec["best_vs_cudnn"], flush=True)
        doc["cases"].append(rec)
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile", action="store_true", help="compile every config for sm_90 (no GPU needed)")
    ap.add_argument("--ptx-order", action="store_true", help="where Triton's tl.dot waits (no GPU needed)")
    ap.add_argument("--out")
    ap.add_argument("--time-limit", type=float, default=160.0, help="no new timing case after this many seconds")
    args = ap.parse_args()
    if args.compile or args.ptx_order:
        res = compile_only() if args.compile else dot_wait_order()
        print(json.dumps(res, indent=1))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"triton": triton.__version__, "result": res}, f, indent=1)
        return
    doc = gpu_run(args.time_limit)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
