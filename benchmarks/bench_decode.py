"""Decode benchmark: split-K flash-decoding (``triton_decode``) beside torch SDPA, and Nyström vs exact.

    python benchmarks/bench_decode.py --out benchmarks/results/decode_h200.json [--quick] [--no-sweep]

Decode cases (q_len 1, D 128, bf16, full-length caches, no kv_lens unless the name says so) are the
baseline table's (``baselines/h200-2026-12-02.md``) plus B=1 at 1k..131k. Each implementation is timed

* eager: ``triton.testing.do_bench`` median (an L2 flush before every call; host launch cost included
  whenever it exceeds the GPU time, as in a plain Python decode loop), and
* graph: ``triton.testing.do_bench_cudagraph`` median (what a serving engine that captures decode sees).

Both rotate over enough copies of K/V (>= 4x the L2 size in all) that every call reads its cache from
HBM: ``do_bench_cudagraph`` does not flush L2, and a 33 MB cache would otherwise be served from the
60 MB L2. Bytes = K + V once (the baseline's convention); TB/s = bytes / time.

``--sweep`` (default on) times a grid of launch configs under graphs for a few cases, to show how far the
default ("auto" split count) is from the best config the tuner could pick.

Nyström: B=1, H=8, S=65536, D=64, bf16, non-causal — time vs SDPA default, and the relative Frobenius
error vs an fp32 exact reference on random and on smooth (low-frequency) Q/K.

Output: JSON with the environment; a short table printed last.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import math
import multiprocessing as mp
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DECODE_CASES = [  # (B, KV len, Hq, Hkv)
    (1, 1024, 32, 8), (1, 2048, 32, 8), (1, 4096, 32, 8), (1, 8192, 32, 8), (1, 32768, 32, 8),
    (1, 131072, 32, 8), (4, 8192, 32, 8), (8, 32768, 32, 8), (32, 8192, 32, 8), (64, 4096, 32, 8),
    (1, 8192, 32, 32), (16, 2048, 32, 32),
]
QUICK_CASES = [(1, 8192, 32, 8), (32, 8192, 32, 8)]
SWEEP_CASES = [(1, 1024, 32, 8), (1, 8192, 32, 8), (1, 131072, 32, 8), (4, 8192, 32, 8),
               (32, 8192, 32, 8), (64, 4096, 32, 8), (1, 8192, 32, 32), (16, 2048, 32, 32)]
SWEEP_GRID = dict(BLOCK_N=(32, 64, 128), num_splits=(1, 2, 4, 8, 16, 32, 64), num_warps=(4, 8),
                  num_stages=(2, 3))
SDPA_VARIANTS = ("sdpa_default", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
D, DTYPE = 128, torch.bfloat16


# ---- timing -----------------------------------------------------------------------------------------
def l2_bytes() -> int:
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20) or (60 << 20))


def rotating(calls):
    """One callable that runs the next of ``calls`` each time (captured graphs record each in turn)."""
    it = itertools.cycle(calls)
    return lambda: next(it)()


def time_eager(fn) -> float:
    import triton.testing as tt

    return tt.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3  # µs


def time_graph(fn, rep=40) -> float:
    import triton.testing as tt

    return tt.do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3  # µs


def time_host(fn, n=300) -> float:
    """Wall-clock µs per call of ``n`` back-to-back calls, one sync at the end: the host's cost per call
    when it exceeds the GPU's (small decode steps on a slow host), else about the GPU time."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def kv_copies(b, s, hkv, n_copies, gen):
    out = []
    for _ in range(n_copies):
        k = torch.randn(b, hkv, s, D, device="cuda", dtype=DTYPE, generator=gen)
        v = torch.randn(b, hkv, s, D, device="cuda", dtype=DTYPE, generator=gen)
        out.append((k, v))
    return out


def n_copies_for(kv_bytes: int) -> int:
    return max(1, min(64, math.ceil(4 * l2_bytes() / kv_bytes)))


# ---- precompile (parallel): fills Triton's on-disk cache so the sweep times kernels, not compilers ----
def _precompile(cfgs):
    from attntune.kernels.triton_decode.op import decode_attention

    q = torch.randn(1, 32, 1, D, device="cuda", dtype=DTYPE)
    k = torch.randn(1, 8, 4096, D, device="cuda", dtype=DTYPE)
    errs = []
    for cfg in cfgs:
        try:
            decode_attention(q, k, k, config=cfg)
        except Exception as e:  # a config that does not compile is a measurement, reported later
            errs.append(f"{cfg}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    torch.cuda.synchronize()
    return errs


def precompile(cfgs, workers):
    chunks = [cfgs[i::workers] for i in range(workers)]
    ctx = mp.get_context("spawn")
    errs = []
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
        for e in ex.map(_precompile, [c for c in chunks if c]):
            errs.extend(e)
    return errs


# ---- decode -----------------------------------------------------------------------------------------
def bench_decode_case(b, s, hq, hkv, sdpa_names, with_lens=False, sq=1):
    from attntune.kernels import registry
    from attntune.kernels.triton_decode.op import decode_attention
    from attntune.problem import problem_from_tensors

    gen = torch.Generator(device="cuda").manual_seed(b * 1000003 + s + hkv)
    kv_bytes = 2 * b * hkv * s * D * DTYPE.itemsize
    copies = kv_copies(b, s, hkv, n_copies_for(kv_bytes), gen)
    q = torch.randn(b, hq, sq, D, device="cuda", dtype=DTYPE, generator=gen)
    lens = torch.full((b,), s, dtype=torch.int32, device="cuda") if with_lens else None
    row = dict(B=b, kv_len=s, Hq=hq, Hkv=hkv, q_len=sq, D=D, dtype=str(DTYPE).split(".")[-1],
               kv_lens=with_lens, kv_bytes=kv_bytes, copies=len(copies), impl={})

    k0, v0 = copies[0]
    ours = decode_attention(q, k0, v0, kv_lens=lens)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k0.float(), v0.float(),
                                                           enable_gqa=hq != hkv)
    row["max_abs_err_vs_fp32"] = float((ours.float() - ref).abs().max())

    impls = {"triton_decode": [lambda k=k, v=v: decode_attention(q, k, v, kv_lens=lens) for k, v in copies]}
    prob = problem_from_tensors(q, k0, v0, kv_lens=lens)
    for name in sdpa_names:
        var = registry.get(name)
        why = registry.reasons(var, prob)
        if why:
            row["impl"][name] = {"error": "; ".join(why)[:300]}
            continue
        impls[name] = [lambda k=k, v=v, var=var: var.run(q, k, v, prob, {}, lens) for k, v in copies]
    for name, calls in impls.items():
        rec = row["impl"].setdefault(name, {})
        if name in ("triton_decode", "sdpa_default") and kv_bytes < (1 << 30):
            rec["host_loop_us"] = round(time_host(calls[0]), 2)
        for mode, timer in (("eager_us", time_eager), ("graph_us", time_graph)):
            try:
                t = timer(rotating(calls))
                rec[mode] = round(t, 2)
                rec[mode.replace("_us", "_tbs")] = round(kv_bytes / (t * 1e-6) / 1e12, 3)
            except Exception as e:  # e.g. a backend that cannot be captured: record, keep going
                rec[mode.replace("_us", "_error")] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    del copies
    torch.cuda.empty_cache()
    return row


def sweep_case(b, s, hq, hkv):
    from attntune.kernels.triton_decode.op import decode_attention

    gen = torch.Generator(device="cuda").manual_seed(7)
    kv_bytes = 2 * b * hkv * s * D * DTYPE.itemsize
    copies = kv_copies(b, s, hkv, n_copies_for(kv_bytes), gen)
    q = torch.randn(b, hq, 1, D, device="cuda", dtype=DTYPE, generator=gen)
    results = []
    for values in itertools.product(*SWEEP_GRID.values()):
        cfg = dict(zip(SWEEP_GRID, values))
        if cfg["num_splits"] > 1 and s // cfg["num_splits"] < cfg["BLOCK_N"]:
            continue  # splits of less than one tile
        calls = [lambda k=k, v=v: decode_attention(q, k, v, config=cfg) for k, v in copies]
        try:
            t = time_graph(rotating(calls), rep=10)
            results.append(dict(cfg, graph_us=round(t, 2), tbs=round(kv_bytes / (t * 1e-6) / 1e12, 3)))
        except Exception as e:
            results.append(dict(cfg, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))
    auto = time_graph(rotating([lambda k=k, v=v: decode_attention(q, k, v) for k, v in copies]), rep=10)
    ok = sorted((r for r in results if "graph_us" in r), key=lambda r: r["graph_us"])
    del copies
    torch.cuda.empty_cache()
    return dict(B=b, kv_len=s, Hq=hq, Hkv=hkv, auto_graph_us=round(auto, 2), best=ok[:5],
                n_configs=len(results), n_failed=sum("error" in r for r in results),
                by_splits={str(ns): min((r["graph_us"] for r in ok if r["num_splits"] == ns), default=None)
                           for ns in SWEEP_GRID["num_splits"]})


# ---- Nyström ------------------------------------------------------------------------------------------
def bench_nystrom(landmarks=(32, 64, 128, 256), s=65536, h=8, d=64, b=1, extra=((128, 12), (256, 12))):
    import torch.nn.functional as F

    from attntune.kernels.error import relative_error
    from attntune.kernels.nystrom import nystrom_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    out = dict(B=b, H=h, S=s, D=d, dtype=str(DTYPE).split(".")[-1], causal=False, data={})
    t = torch.linspace(0, 1, s, device="cuda")
    basis = torch.stack([torch.sin(2 * math.pi * (i + 1) * t + i) for i in range(8)], -1)  # [S, 8]

    def smooth():
        w = torch.randn(b, h, 8, d, device="cuda", generator=gen)
        return (basis @ w) + 0.1 * torch.randn(b, h, s, d, device="cuda", generator=gen)

    datasets = {
        "random": [torch.randn(b, h, s, d, device="cuda", generator=gen) for _ in range(3)],
        "smooth": [smooth(), smooth(), torch.randn(b, h, s, d, device="cuda", generator=gen)],
    }
    for name, (q32, k32, v32) in datasets.items():
        q, k, v = q32.to(DTYPE), k32.to(DTYPE), v32.to(DTYPE)
        # fp32 exact reference of the *rounded* inputs (memory-efficient backend takes fp32)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        rec = dict(sdpa_default_ms=round(time_eager(lambda: F.scaled_dot_product_attention(q, k, v)) / 1e3, 3))
        rec["sdpa_default_rel_err"] = relative_error(F.scaled_dot_product_attention(q, k, v), ref)
        rec["nystrom"] = {}
        for m, it in [(m, 6) for m in landmarks] + list(extra):
            o = nystrom_attention(q, k, v, landmarks=m, pinv_iters=it)
            ms = time_eager(lambda m=m, it=it: nystrom_attention(q, k, v, landmarks=m, pinv_iters=it)) / 1e3
            key = str(m) if it == 6 else f"{m}/it{it}"
            rec["nystrom"][key] = dict(ms=round(ms, 3), speedup_vs_sdpa=round(rec["sdpa_default_ms"] / ms, 2),
                                       rel_err=relative_error(o, ref), landmarks=m, pinv_iters=it)
        if name == "random":  # where the time goes (one call, m=64)
            try:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    nystrom_attention(q, k, v, landmarks=64)
                    torch.cuda.synchronize()
                rec["profile_m64"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)[-3000:]
            except Exception as e:
                rec["profile_m64"] = f"profiler failed: {type(e).__name__}: {e}"[:300]
        out["data"][name] = rec
        del ref
        torch.cuda.empty_cache()
    return out


def compiled_kernel_stats():
    """Registers, spills and shared memory of every compiled decode kernel (best effort: the cache layout
    of ``JITFunction`` differs across Triton versions)."""
    from attntune.kernels.triton_decode import jit

    out = []
    for fn in (jit.decode_split_kernel, jit.decode_reduce_kernel):
        try:
            for entry in getattr(fn, "device_caches", {}).values():
                cache = entry[0] if isinstance(entry, tuple) else entry
                for kern in cache.values():
                    md = kern.metadata
                    consts = {k: v for k, v in (getattr(kern.src, "constants", None) or {}).items()
                              if isinstance(v, (int, bool, str))} if hasattr(kern, "src") else {}
                    out.append(dict(kernel=fn.__name__, n_regs=getattr(kern, "n_regs", None),
                                    n_spills=getattr(kern, "n_spills", None), shared=getattr(md, "shared", None),
                                    num_warps=getattr(md, "num_warps", None),
                                    num_stages=getattr(md, "num_stages", None), constants=str(consts)[:300]))
        except Exception as e:
            out.append(dict(kernel=fn.__name__, error=f"{type(e).__name__}: {e}"[:200]))
    return out


# ---- main ---------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="two decode cases, no sweep, no Nyström")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-nystrom", action="store_true")
    ap.add_argument("--precompile-workers", type=int, default=min(12, os.cpu_count() or 1))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_decode: needs a CUDA GPU")
    from env import environment

    res = dict(environment=environment(), notes=__doc__, l2_bytes=l2_bytes(), decode=[], sweep=[],
               nystrom=None, errors=[])

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    t0 = time.time()
    sweep = not (args.quick or args.no_sweep)
    if sweep and args.precompile_workers > 1:
        cfgs = [dict(zip(SWEEP_GRID, v)) for v in itertools.product(*SWEEP_GRID.values())
                if v[1] in (1, 2)]  # splits 1 and 2 cover both kernel variants; NUM_SPLITS is unspecialised
        cfgs += [{"num_splits": ns} for ns in (4, 8, 16, 32, 64)]  # the reduction's BLOCK_S variants
        res["precompile_errors"] = precompile(cfgs, args.precompile_workers)
        res["precompile_s"] = round(time.time() - t0, 1)
        print(f"precompiled {len(cfgs)} configs in {res['precompile_s']} s", flush=True)

    cases = QUICK_CASES if args.quick else DECODE_CASES
    extra = [] if args.quick else [dict(b=1, s=8192, hq=32, hkv=8, with_lens=True),
                                   dict(b=1, s=8192, hq=32, hkv=8, sq=4)]
    for c in [dict(b=b, s=s, hq=hq, hkv=hkv) for b, s, hq, hkv in cases] + extra:
        try:
            row = bench_decode_case(sdpa_names=SDPA_VARIANTS, **c)
            res["decode"].append(row)
            print(json.dumps({k: row[k] for k in ("B", "kv_len", "Hkv", "q_len", "kv_lens")}),
                  {n: (r.get("eager_us"), r.get("graph_us")) for n, r in row["impl"].items()}, flush=True)
        except Exception:
            res["errors"].append(dict(case=c, trace=traceback.format_exc()[-1500:]))
            print("FAILED", c, traceback.format_exc()[-800:], flush=True)
        save()

    if sweep:
        for b, s, hq, hkv in SWEEP_CASES:
            try:
                r = sweep_case(b, s, hq, hkv)
                res["sweep"].append(r)
                print("sweep", b, s, hkv, "auto", r["auto_graph_us"], "best", r["best"][:1], flush=True)
            except Exception:
                res["errors"].append(dict(sweep=(b, s, hq, hkv), trace=traceback.format_exc()[-1500:]))
            save()

    if not (args.quick or args.no_nystrom):
        try:
            res["nystrom"] = bench_nystrom()
        except Exception:
            res["errors"].append(dict(nystrom=True, trace=traceback.format_exc()[-1500:]))
        save()
    res["compiled_kernels"] = compiled_kernel_stats()
    res["wall_s"] = round(time.time() - t0, 1)
    save()
    print_table(res)


def print_table(res):
    print(f"\n{res['environment'].get('gpu')}  torch {res['environment']['torch']}  triton "
          f"{res['environment']['triton']}  (speedup = SDPA default time / triton_decode time)")
    print(f"{'B':>3} {'KV':>7} {'Hkv':>3} {'q':>2} | {'ours eag':>8} {'sdpa eag':>8} {'x':>5} | "
          f"{'ours gr':>8} {'sdpa gr':>8} {'x':>5} | {'TB/s gr':>7} {'best sdpa gr':>18} | {'host ours/sdpa':>14}")
    for r in res["decode"]:
        o, s = r["impl"].get("triton_decode", {}), r["impl"].get("sdpa_default", {})

        def x(a, b):
            return f"{b / a:5.2f}" if a and b else "  n/a"

        sd = {n: v["graph_us"] for n, v in r["impl"].items() if n.startswith("sdpa") and "graph_us" in v}
        best = min(sd.items(), key=lambda kv: kv[1]) if sd else ("n/a", 0)
        tag = " lens" if r["kv_lens"] else ""
        print(f"{r['B']:>3} {r['kv_len']:>7} {r['Hkv']:>3} {r['q_len']:>2} | {o.get('eager_us', 0):8.1f} "
              f"{s.get('eager_us', 0):8.1f} {x(o.get('eager_us'), s.get('eager_us'))} | {o.get('graph_us', 0):8.1f} "
              f"{s.get('graph_us', 0):8.1f} {x(o.get('graph_us'), s.get('graph_us'))} | {o.get('graph_tbs', 0):7.2f} "
              f"{best[0][5:]:>10} {best[1]:7.1f} | {o.get('host_loop_us', 0):6.1f} {s.get('host_loop_us', 0):6.1f}{tag}")
    for sw in res["sweep"]:
        b0 = sw["best"][0] if sw["best"] else {}
        print(f"sweep B{sw['B']} KV{sw['kv_len']} Hkv{sw['Hkv']}: auto {sw['auto_graph_us']} µs, best "
              f"{b0.get('graph_us')} µs {({k: b0.get(k) for k in SWEEP_GRID})}")
    ny = res.get("nystrom")
    if ny:
        for name, rec in ny["data"].items():
            parts = [f"m={m}: {v['ms']} ms x{v['speedup_vs_sdpa']} err {v['rel_err']:.3f}"
                     for m, v in rec["nystrom"].items()]
            print(f"nystrom {name} S={ny['S']}: sdpa {rec['sdpa_default_ms']} ms (err {rec['sdpa_default_rel_err']:.4f}); "
                  + "; ".join(parts))
    if res["errors"]:
        print(f"{len(res['errors'])} errors (see JSON)")


if __name__ == "__main__":
    main()
