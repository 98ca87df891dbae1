"""Can a Hopper forward with explicit async wgmma beat our Triton forward (#14 item 2)? A Gluon probe.

Why Gluon: Triton (3.6 and 3.9) places ``wgmma.wait_group 0`` right after every ``tl.dot`` of the flash loop,
so reordering the source cannot overlap the softmax with the tensor cores (``--ptx-order`` shows it: compiled
for sm_90, each dot's commit is followed by a wait for 0 before the first ``ex2``, with or without the next
block's QKᵀ issued ahead). FlashAttention-3's intra-warpgroup pipelining needs the waits under the kernel's
control, which Gluon gives (``warpgroup_mma(..., is_async=True)``, ``warpgroup_mma_wait(num_outstanding)``).

The probe kernel (``fa_fwd``) per program: ``BM`` query rows of one (batch, head); K/V blocks of ``BN`` keys
through a ``STAGES``-deep ring of TMA loads (an mbarrier per slot for K and one for V); the schedule

    S_0 = Q K_0ᵀ; softmax_0
    for j in 1..n-1:  issue S_j = Q K_jᵀ;  issue O += P_{j-1} V_{j-1};  wait for S_j only (1 outstanding);
                      softmax_j (runs while PV_{j-1} is on the tensor cores);  wait for PV_{j-1};
                      O *= alpha_j;  refill the freed slot with block j-1+STAGES
    O += P_{n-1} V_{n-1};  O /= l

Scope of a probe, not a variant: bf16, dense (no mask), one kv head per query head, contiguous
``[B, H, S, D]``, ``S`` a multiple of ``BM`` and ``BN`` (2-D descriptors over ``[B*H*S, D]``: rows past a head's
end would be the next head's). If it wins, it goes into ``kernels/triton_flash`` behind the ``LOADS`` knob
with masks, GQA and the other shapes.

    python benchmarks/probe_gluon_fwd.py --out $OUT/probe_gluon_fwd.json   # GPU: check, then time (~1 min)
    python benchmarks/probe_gluon_fwd.py --compile                         # CPU: compile for sm_90 only
    python benchmarks/probe_gluon_fwd.py --ptx-order                       # CPU: where Triton's tl.dot waits
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
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634
CASES = [(4, 32, 4096, 128), (2, 32, 8192, 128), (8, 32, 4096, 64)]  # (B, H, S, D)
# Triton 3.6 names the TMA copies async_copy_global_to_shared / async_copy_shared_to_global; later versions
# async_load / async_store (the old names raise)
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
GRID = dict(BM=(128,), BN=(64, 128), STAGES=(2, 3), num_warps=(8,))


@gluon.jit
def _load_kv(desc, row, bars, smem, slot, pred):
    """One K or V block into ring slot ``slot`` (TMA), its arrival counted on ``bars[slot]``."""
    mbarrier.expect(bars.index(slot), desc.block_type.nbytes, pred=pred)
    _tma_load(desc, [row, 0], bars.index(slot), smem.index(slot), pred=pred)


@gluon.jit
def fa_fwd(desc_q, desc_k, desc_v, desc_o, qk_scale, S_q, S_kv,
           BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    """Grid (S_q // BM, B*H). desc_q/desc_o over [B*H*S_q, D] (block [BM, D]), desc_k/desc_v over
    [B*H*S_kv, D] (block [BN, D]); qk_scale = softmax scale * log2(e). Dense attention, base-2 softmax."""
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    q_row = bh * S_q + pid_m * BM
    kv_row = bh * S_kv
    n = S_kv // BN
    num_warps: gl.constexpr = gl.num_warps()  # the launch option: 8 = two warpgroups of 64 rows each

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [BM, D], desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [STAGES, BN, D], desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [STAGES, BN, D], desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    mbarrier.expect(q_bar, desc_q.block_type.nbytes)
    _tma_load(desc_q, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_kv(desc_k, kv_row + i * BN, k_bars, k_smem, i, i < n)
        _load_kv(desc_v, kv_row + i * BN, v_bars, v_smem, i, i < n)

    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    o = gl.zeros([BM, D], gl.float32, layout=o_layout)

    # block 0: S_0 and its softmax (nothing to overlap with yet)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(p, 1)

    for j in range(1, n):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        p16 = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        o_tok = warpgroup_mma(p16, v_smem.index(prev), o, is_async=True)
        # S_j is the older group: waiting for 1 outstanding leaves PV_{j-1} running during the softmax
        s = warpgroup_mma_wait(1, deps=[s_tok])
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])  # p16 (registers) stays live until PV_{j-1} is done
        o = o * gl.convert_layout(alpha, row_o)[:, None]
        # slot `prev` is free (QK_{j-1} and PV_{j-1} done): refill it with block j-1+STAGES
        nxt = j - 1 + STAGES
        _load_kv(desc_k, kv_row + nxt * BN, k_bars, k_smem, prev, nxt < n)
        _load_kv(desc_v, kv_row + nxt * BN, v_bars, v_smem, prev, nxt < n)

    last = (n - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n - 1) // STAGES) & 1)
    p16 = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    o_tok = warpgroup_mma(p16, v_smem.index(last), o, is_async=True)
    o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
    out = o / gl.convert_layout(l_i, row_o)[:, None]

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    o_smem = gl.allocate_shared_memory(desc_o.dtype, [BM, D], desc_o.layout)
    o_smem.store(out.to(desc_o.dtype))
    fence_async_shared()
    _tma_store(desc_o, [q_row, 0], o_smem)
    tma.store_wait(0)


def descriptors(q, k, v, o, bm, bn):
    """2-D TMA descriptors over the [B*H*S, D] views of contiguous [B, H, S, D] tensors."""
    d = q.shape[-1]

    def desc(t, rows):
        flat = t.reshape(-1, d)
        lay = gl.NVMMASharedLayout.get_default_for([rows, d], gl.bfloat16)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, d], lay)

    return desc(q, bm), desc(k, bn), desc(v, bn), desc(o, bm)


def launch(q, k, v, o, cfg):
    b, h, s, d = q.shape
    dq, dk, dv, do = descriptors(q, k, v, o, cfg["BM"], cfg["BN"])
    fa_fwd[(s // cfg["BM"], b * h)](dq, dk, dv, do, LOG2E / math.sqrt(d), s, k.shape[2], BM=cfg["BM"], BN=cfg["BN"],
                                     D=d, STAGES=cfg["STAGES"], num_warps=cfg["num_warps"])
    return o


def configs():
    keys = list(GRID)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(GRID[k] for k in keys))]


def compile_only(d=128, arch=90):
    """Compile every probe config for ``sm_{arch}`` without a GPU; returns {config: registers/shared or error}."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    res = {}
    for cfg in configs():
        q = torch.empty(1, 1, 256, d, dtype=torch.bfloat16)
        descs = descriptors(q, q, q, q, cfg["BM"], cfg["BN"])
        sig = {n: mangle_type(x) for n, x in zip(("desc_q", "desc_k", "desc_v", "desc_o"), descs)}
        sig.update({"qk_scale": "fp32", "S_q": "i32", "S_kv": "i32"})
        ce = {"BM": cfg["BM"], "BN": cfg["BN"], "D": d, "STAGES": cfg["STAGES"]}
        sig.update({n: "constexpr" for n in ce})
        name = "/".join(str(cfg[k]) for k in GRID)
        try:
            kern = triton.compile(GluonASTSource(fa_fwd, sig, constexprs=ce), target=GPUTarget("cuda", arch, 64),
                                  options={"num_warps": cfg["num_warps"], "num_stages": 1})
        except Exception as e:  # noqa: BLE001 — report each config's failure
            res[name] = {"error": f"{type(e).__name__}: {str(e)[-900:]}"}
            continue
        ptx = kern.asm["ptx"]
        res[name] = {"shared_bytes": kern.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                     "wait_groups": sorted({ln.split()[-1].rstrip(";") for ln in ptx.splitlines()
                                            if "wgmma.wait_group" in ln})}
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
                           target=GPUTarget("cuda", arch, 64), options={"num_warps": 8, "num_stages": 3})
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


def gpu_run(time_limit: float):
    """Per case: each probe config checked against SDPA (float32 math reference on a slice) and timed beside
    our Triton forward (its default config), SDPA cuDNN and SDPA flash; TFLOP/s of dense attention."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attntune.kernels.triton_flash.op import flash_attention

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from env import environment

    t0 = time.time()
    doc = {"benchmark": "probe_gluon_fwd", "environment": environment(), "cases": []}
    for b, h, s, d in CASES:
        if time.time() - t0 > time_limit:
            break
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * s * s * d
        ref = torch.nn.functional.scaled_dot_product_attention(q[:1, :2].float(), k[:1, :2].float(), v[:1, :2].float())
        rec = {"b": b, "h": h, "s": s, "d": d, "configs": {}, "baselines": {}}

        def tf(ms):
            return flops / ms / 1e9

        for name, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    ms = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                                                 warmup=50, rep=300)
                rec["baselines"][name] = {"ms": ms, "tflops": tf(ms)}
            except Exception as e:  # noqa: BLE001
                rec["baselines"][name] = {"error": str(e)[:200]}
        for loads in (0, 1):  # our Triton forward, its default config with pointer / descriptor loads
            ms = triton.testing.do_bench(lambda: flash_attention(q, k, v, config={"LOADS": loads}), warmup=50, rep=300)
            rec["baselines"][f"triton_flash_loads{loads}"] = {"ms": ms, "tflops": tf(ms)}
        for cfg in configs():
            name = "/".join(str(cfg[kk]) for kk in GRID)
            o = torch.empty_like(q)
            try:
                launch(q, k, v, o, cfg)
                torch.cuda.synchronize()
                err = ((o[:1, :2].float() - ref).norm() / ref.norm()).item()
                ms = triton.testing.do_bench(lambda: launch(q, k, v, o, cfg), warmup=50, rep=300)
                rec["configs"][name] = {"ms": ms, "tflops": tf(ms), "rel_err": err}
            except Exception as e:  # noqa: BLE001
                rec["configs"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(b, h, s, d, name, rec["configs"][name], flush=True)
        print(b, h, s, d, rec["baselines"], flush=True)
        doc["cases"].append(rec)
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile", action="store_true", help="compile every config for sm_90 (no GPU needed)")
    ap.add_argument("--ptx-order", action="store_true", help="where Triton's tl.dot waits (no GPU needed)")
    ap.add_argument("--out")
    ap.add_argument("--time-limit", type=float, default=90.0)
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
