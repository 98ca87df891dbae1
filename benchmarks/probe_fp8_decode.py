"""Where FP8-KV decode loses its bandwidth (#15): one split-K-free decode loop in four modes, side by side.

``triton_decode`` reads an FP8 KV cache at ~3.4 TB/s (H200, B32 KV8192: 158 µs for 512 MB) while its bf16
twin reads 4.4 TB/s. This probe bisects the loop on one big problem (one program per (batch, kv head), no
``kv_lens``, no window, no split: nothing but the loop), each mode timed under CUDA graphs:

* ``read``  — the same K/V tiles loaded as int32 words and xor-folded: the loop's bandwidth ceiling;
* ``fp16``  — what ``triton_decode`` does: codes widened to fp16, two fp16 dots, online softmax;
* ``qk8``   — q quantised to e4m3 per row inside the kernel, QKᵀ an FP8 dot on the raw K codes (no widening
  of K), V widened as in ``fp16``;
* ``all8``  — as ``qk8``, and P (in [0, 1]) cast to e4m3 for an FP8 PV dot on the raw V codes;
* ``dots``  — ``fp16`` without the softmax (the scores go straight into the PV dot: wrong output, the cost of
  loads, widening and dots alone);
* ``nopv``  — ``fp16`` without the PV dot (V still loaded and widened, folded into the row sums: wrong output,
  the cost of everything but that dot);
* ``fp16t`` — ``fp16`` with K loaded as stored (``[BLOCK_N, D]``, D contiguous) and transposed for the dot
  (``tl.trans``) instead of loaded transposed: another shared-memory layout for the compiler to pick;
* ``swap``  — the keys as the dots' M dimension (``swap_kernel``): Sᵀ = K·qᵀ ([BLOCK_N, 16], K the A operand,
  qᵀ loaded once) and Oᵀ += Vᵀ·Pᵀ ([D, 16]): M >= 64 lets Hopper take wgmma with A from registers;
* ``swap_qk`` — only QKᵀ swapped, PV as in ``fp16`` (Pᵀ transposed back);
* ``vt``    — ``fp16`` over a V cache stored keys-contiguous (``[B, Hkv, D, S]``, a layout the cache would be
  written in): the PV dot's B operand then has its K dimension (keys) contiguous, like K's for QKᵀ. With V as
  stored (``[B, Hkv, S, D]``) Triton 3.6 reads that e4m3 operand from shared memory one byte at a time
  (``ld.shared.b8``: no transposing ldmatrix for 8-bit types on sm_90; see ``--ptx``).

Each compute mode is checked against a float32 reference (relative Frobenius error); the library's own
``decode_attention`` (FP8 and bf16, default config) and SDPA bf16 are timed in the same run. The kernel here
is a probe, not a variant: if a mode wins, it goes into ``kernels/triton_decode`` behind a knob.

    python benchmarks/probe_fp8_decode.py --out $OUT/probe_fp8_decode.json   # GPU, ~1-2 min
    python benchmarks/probe_fp8_decode.py --ptx                               # CPU: PTX counts per mode
"""
import argparse
import itertools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decode import time_graph  # noqa: E402
from env import environment  # noqa: E402

MODES = {"read": 0, "fp16": 1, "qk8": 2, "all8": 3, "dots": 4, "nopv": 5, "fp16t": 6, "swap": 7, "swap_qk": 8, "vt": 9}
CASES = [(32, 8192, 32, 8), (64, 4096, 32, 8), (8, 32768, 32, 8)]  # (B, KV len, Hq, Hkv), D 128: 512 MB FP8
GRID = dict(BLOCK_N=(128, 256), num_warps=(4, 8), num_stages=(2, 3))
D = 128
E4M3_MAX = 448.0


@triton.jit
def _program(S, HKV, GROUP, D: tl.constexpr):
    """This program's (batch, kv head) and the element offsets of its K/V ``[S, D]`` and of its query rows."""
    pid = tl.program_id(0)
    b = pid // HKV
    hkv = pid % HKV
    kv_base = (b.to(tl.int64) * HKV + hkv) * S * D
    q_base = (b.to(tl.int64) * HKV * GROUP + hkv * GROUP) * D
    return hkv, kv_base, q_base


@triton.jit
def probe_kernel(Q, K, V, OUT, K_SCALE, V_SCALE, S, S_READ, HKV, GROUP, qk_scale,
                 MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Q [B, HKV*GROUP, D] fp16, K/V [B, HKV, S, D] e4m3 codes (contiguous), scales [HKV] fp32, OUT
    [B, HKV*GROUP, D] fp32 (MODE 0 writes its xor fold into OUT's first row of the group instead). The loop
    visits S keys but reads key ``n % S_READ`` (a multiple of BLOCK_N): S_READ = S is the real problem, a small
    S_READ keeps the bytes in L2 and leaves the loop's compute cost (what bounds it once HBM is fast enough)."""
    hkv, kv_base, q_base = _program(S, HKV, GROUP, D)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP
    offs_d = tl.arange(0, D)
    if MODE == 0:
        offs_w = tl.arange(0, D // 4)
        fold = tl.zeros([BLOCK_N, D // 4], dtype=tl.int32)
        K32 = K.to(tl.pointer_type(tl.int32))
        V32 = V.to(tl.pointer_type(tl.int32))
        for start in range(0, S, BLOCK_N):
            offs_n = start % S_READ + tl.arange(0, BLOCK_N)
            w = (kv_base // 4) + offs_n[:, None].to(tl.int64) * (D // 4) + offs_w[None, :]
            fold = fold ^ tl.load(K32 + w) ^ tl.load(V32 + w)
        tot = tl.sum(tl.sum(fold, 1), 0)
        tl.store(OUT + q_base, tot.to(tl.float32))
    else:
        q = tl.load(Q + q_base + rows[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        scale = qk_scale * tl.load(K_SCALE + hkv)
        if MODE == 2 or MODE == 3:
            # per-row e4m3 quantisation of q: q = q8 * qs
            amax = tl.max(tl.abs(q.to(tl.float32)), 1)
            qs = tl.where(amax > 0, amax / 448.0, 1.0)
            q8 = (q.to(tl.float32) / qs[:, None]).to(tl.float8e4nv)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        for start in range(0, S, BLOCK_N):
            offs_n = start % S_READ + tl.arange(0, BLOCK_N)
            if MODE == 6:
                k = tl.trans(tl.load(K + kv_base + offs_n[:, None].to(tl.int64) * D + offs_d[None, :]))
            else:
                k = tl.load(K + kv_base + offs_n[None, :].to(tl.int64) * D + offs_d[:, None])  # [D, BLOCK_N]
            if MODE == 9:  # V given as [.., D, S]: the tile read as [D, BLOCK_N] and transposed
                v = tl.trans(tl.load(V + kv_base + offs_d[:, None] * S + (offs_n[None, :]).to(tl.int64)))
            else:
                v = tl.load(V + kv_base + offs_n[:, None].to(tl.int64) * D + offs_d[None, :])  # [BLOCK_N, D]
            if MODE == 2 or MODE == 3:
                s = tl.dot(q8, k) * (qs[:, None] * scale)
            else:
                s = tl.dot(q, k.to(tl.float16)) * scale
            if MODE == 4:
                acc += tl.dot(s.to(tl.float16), v.to(tl.float16))
                l_i += 1.0
                m_new = m_i
            else:
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp2(m_i - m_new)
                p = tl.exp2(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
            if MODE == 5:
                acc = acc * alpha[:, None] + tl.sum(v.to(tl.float16).to(tl.float32), 0)[None, :]
            elif MODE == 4:
                pass
            elif MODE == 3:
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.float8e4nv), v)
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))
            m_i = m_new
        o = acc / l_i[:, None] * tl.load(V_SCALE + hkv)
        tl.store(OUT + q_base + rows[:, None] * D + offs_d[None, :], o, mask=row_ok[:, None])


@triton.jit
def swap_kernel(Q, K, V, OUT, K_SCALE, V_SCALE, S, S_READ, HKV, GROUP, qk_scale,
                SWAP_PV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """``probe_kernel``'s fp16 mode with the keys as M: the group's query rows are the N dimension (BLOCK_M
    columns, GROUP of them real), the softmax runs down the columns."""
    hkv, kv_base, q_base = _program(S, HKV, GROUP, D)
    cols = tl.arange(0, BLOCK_M)
    col_ok = cols < GROUP
    offs_d = tl.arange(0, D)
    q_t = tl.load(Q + q_base + cols[None, :] * D + offs_d[:, None], mask=col_ok[None, :], other=0.0)  # [D, BM]
    scale = qk_scale * tl.load(K_SCALE + hkv)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if SWAP_PV:
        acc_t = tl.zeros([D, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start in range(0, S, BLOCK_N):
        offs_n = start % S_READ + tl.arange(0, BLOCK_N)
        k = tl.load(K + kv_base + offs_n[:, None].to(tl.int64) * D + offs_d[None, :])  # [BLOCK_N, D]
        v = tl.load(V + kv_base + offs_n[:, None].to(tl.int64) * D + offs_d[None, :])  # [BLOCK_N, D]
        s_t = tl.dot(k.to(tl.float16), q_t) * scale  # [BLOCK_N, BLOCK_M]
        m_new = tl.maximum(m_i, tl.max(s_t, 0))
        alpha = tl.exp2(m_i - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p_t, 0)
        if SWAP_PV:
            acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v.to(tl.float16)), p_t.to(tl.float16))
        else:
            acc = acc * alpha[:, None] + tl.dot(tl.trans(p_t.to(tl.float16)), v.to(tl.float16))
        m_i = m_new
    vsc = tl.load(V_SCALE + hkv)
    if SWAP_PV:
        o_t = acc_t / l_i[None, :] * vsc
        tl.store(OUT + q_base + cols[None, :] * D + offs_d[:, None], o_t, mask=col_ok[None, :])
    else:
        o = acc / l_i[:, None] * vsc
        tl.store(OUT + q_base + cols[:, None] * D + offs_d[None, :], o, mask=col_ok[:, None])


def launch(mode, q16, k8, v8, ks, vs, out, cfg, group, s_read=None):
    """One probe launch; ``v8`` is ``[B, Hkv, D, S]`` for mode ``vt``, ``[B, Hkv, S, D]`` otherwise."""
    B, hkv, S, _ = k8.shape
    qk_scale = D ** -0.5 * 1.4426950408889634
    if mode in ("swap", "swap_qk"):
        swap_kernel[(B * hkv,)](q16, k8, v8, out, ks, vs, S, s_read or S, hkv, group, qk_scale,
                                SWAP_PV=mode == "swap", BLOCK_M=16, BLOCK_N=cfg["BLOCK_N"], D=D,
                                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        return out
    probe_kernel[(B * hkv,)](q16, k8, v8, out, ks, vs, S, s_read or S, hkv, group, qk_scale, MODE=MODES[mode],
                             BLOCK_M=16, BLOCK_N=cfg["BLOCK_N"], D=D, num_warps=cfg["num_warps"],
                             num_stages=cfg["num_stages"])
    return out


def case(b, s, hq, hkv, modes, grid, l2_keys=0):
    from attntune import fp8
    from attntune.kernels.triton_decode.op import decode_attention

    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(b, hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k8, v8, ks, vs = fp8.quantize_kv(k, v)
    ks, vs = ks.reshape(hkv).float().contiguous(), vs.reshape(hkv).float().contiguous()
    q16 = q.reshape(b, hq, D).half().contiguous()
    exact = F.scaled_dot_product_attention(q.float(), (k8.float() * ks.view(1, hkv, 1, 1)),
                                           (v8.float() * vs.view(1, hkv, 1, 1)), enable_gqa=True).reshape(b, hq, D)
    fp8_bytes = 2 * k8.numel()
    rec = {"B": b, "kv_len": s, "Hq": hq, "Hkv": hkv, "D": D, "fp8_bytes": fp8_bytes, "modes": {}, "lib": {}}
    lens = torch.full((b,), s, device="cuda", dtype=torch.int32)
    lib = {"triton_decode_fp8": lambda: decode_attention(q, k8, v8, kv_lens=lens, k_scale=ks, v_scale=vs),
           "triton_decode_bf16": lambda: decode_attention(q, k, v, kv_lens=lens),
           "sdpa_bf16": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}
    for name, fn in lib.items():
        try:
            fn()
            t = time_graph(fn)
            rec["lib"][name] = {"us": round(t, 2), "tbps": round((fp8_bytes * (2 if "bf16" in name else 1))
                                                                  / (t * 1e-6) / 1e12, 3)}
        except Exception as e:  # noqa: BLE001 — report, go on
            rec["lib"][name] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
    out = torch.empty(b, hq, D, device="cuda", dtype=torch.float32)
    v8t = v8.transpose(-1, -2).contiguous() if "vt" in modes else None  # [B, Hkv, D, S], mode vt's cache
    for mode in modes:
        vv = v8t if mode == "vt" else v8
        rows = []
        for vals in itertools.product(*grid.values()):
            cfg = dict(zip(grid, vals))
            try:
                launch(mode, q16, k8, vv, ks, vs, out, cfg, hq // hkv)
                torch.cuda.synchronize()
                err = None if mode == "read" else ((out - exact).norm() / exact.norm()).item()
                t = time_graph(lambda: launch(mode, q16, k8, vv, ks, vs, out, cfg, hq // hkv), rep=20)
                rows.append({"cfg": cfg, "us": round(t, 2), "tbps": round(fp8_bytes / (t * 1e-6) / 1e12, 3),
                             "rel_err": err})
            except Exception as e:  # noqa: BLE001 — out of resources, or a dot the compiler refuses
                rows.append({"cfg": cfg, "error": f"{type(e).__name__}: {str(e)[:160]}"})
        ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
        rec["modes"][mode] = {"best": ok[0] if ok else None, "rows": rows}
        print(b, s, mode, ok[0] if ok else rows[:1], flush=True)
        if l2_keys:
            # the same work with the reads in L2: tbps_equiv = the real problem's bytes / this time
            l2 = []
            for vals in itertools.product(*grid.values()):
                cfg = dict(zip(grid, vals))
                if l2_keys % cfg["BLOCK_N"]:
                    continue
                try:
                    t = time_graph(lambda: launch(mode, q16, k8, vv, ks, vs, out, cfg, hq // hkv, l2_keys), rep=20)
                    l2.append({"cfg": cfg, "us": round(t, 2), "tbps_equiv": round(fp8_bytes / (t * 1e-6) / 1e12, 3)})
                except Exception as e:  # noqa: BLE001
                    l2.append({"cfg": cfg, "error": f"{type(e).__name__}: {str(e)[:160]}"})
            ok2 = sorted((r for r in l2 if "us" in r), key=lambda r: r["us"])
            rec["modes"][mode]["l2_keys"] = l2_keys
            rec["modes"][mode]["l2_best"] = ok2[0] if ok2 else None
            rec["modes"][mode]["l2_rows"] = l2
            print(b, s, mode, "L2", ok2[0] if ok2 else l2[:1], flush=True)
    return rec


def ptx_counts(modes, block_n=128, num_warps=4, num_stages=2, arch=90):
    """Compile each compute mode for ``sm_{arch}`` without a GPU (what the installed Triton emits) and count
    the instructions that tell where the operands go: shared-memory stores/loads, ldmatrix, cp.async, the MMA
    flavour (``mma.sync`` or Hopper's ``wgmma``), e4m3 widenings, exp2. Static counts in the PTX, not executions.

    >>> c = ptx_counts(["swap"])["swap"]  # doctest: +SKIP
    """
    from ptx_of import count
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {"Q": "*fp16", "K": "*fp8e4nv", "V": "*fp8e4nv", "OUT": "*fp32", "K_SCALE": "*fp32", "V_SCALE": "*fp32",
           "S": "i32", "S_READ": "i32", "HKV": "i32", "GROUP": "i32", "qk_scale": "fp32"}
    res = {}
    for mode in modes:
        if mode == "read":
            continue
        fn, ce = ((swap_kernel, {"SWAP_PV": mode == "swap"}) if mode.startswith("swap")
                  else (probe_kernel, {"MODE": MODES[mode]}))
        ce = dict(ce, BLOCK_M=16, BLOCK_N=block_n, D=D)
        # what the runtime specialises at a launch: 16-byte aligned pointers, lengths divisible by 16
        names = list({**sig, **ce})
        attrs = {(names.index(n),): [["tt.divisibility", 16]]
                 for n in ("Q", "K", "V", "OUT", "K_SCALE", "V_SCALE", "S", "S_READ")}
        try:
            k = triton.compile(ASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in ce}}, constexprs=ce,
                                         attrs=attrs),
                               target=GPUTarget("cuda", arch, 32),
                               options={"num_warps": num_warps, "num_stages": num_stages})
        except Exception as e:  # noqa: BLE001 — a mode this Triton cannot compile
            res[mode] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        res[mode] = {p_: n for p_, n in count(k.asm["ptx"]).items() if n}
        res[mode]["shared_bytes"] = k.metadata.shared
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptx", action="store_true",
                    help="no GPU: compile the modes for sm_90 and print their PTX instruction counts (--out ignored)")
    ap.add_argument("--out")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--cases", type=int, default=len(CASES), help="the first N of CASES")
    ap.add_argument("--grid", type=json.loads, default=None, help='JSON overriding GRID, e.g. {"num_stages": [1, 2]}')
    ap.add_argument("--l2-keys", type=int, default=0,
                    help="also time each mode reading only the first N keys of each (batch, kv head), in L2")
    ap.add_argument("--time-limit", type=float, default=150.0, help="no new case after this many seconds")
    args = ap.parse_args()
    if args.ptx:
        print(f"triton {triton.__version__}, sm_90, BLOCK_N 128, 4 warps, 2 stages")
        for mode, c in ptx_counts(args.modes.split(",")).items():
            print(f"{mode:8s} {dict(c)}")
        return
    if not args.out:
        ap.error("--out is required (or --ptx)")
    t0 = time.time()
    grid = {**GRID, **{k: tuple(v) for k, v in (args.grid or {}).items()}}
    res = {"benchmark": "probe_fp8_decode", "environment": environment(), "grid": grid, "cases": []}
    for c in CASES[:args.cases]:
        if time.time() - t0 > args.time_limit:
            res.setdefault("skipped", []).append(list(c))
            continue
        res["cases"].append(case(*c, args.modes.split(","), grid, args.l2_keys))
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    res["elapsed_s"] = round(time.time() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
