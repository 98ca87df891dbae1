"""Triton flash attention (attntune's ``triton_flash``) against torch SDPA (default and every backend)
and FlexAttention, measured in one run on one GPU.

    python benchmarks/bench_flash.py --out $OUT/flash.json [--budget-s 300] [--workers 12]

For every case our kernel is swept over its declared space (forward: every forward config; forward +
backward: the forward configs of the training space timed forward-only, then every distinct backward
config with the best forward one) and its best config is reported. All timings are
``triton.testing.do_bench`` medians (L2 flushed) on random normal data. FLOPs = 4*D per admitted
(query, key) pair times B*H (so causal is ~half of 4*B*H*S^2*D); forward+backward counts 3.5x the
forward. Configs are compiled first by a pool of processes (Triton's disk cache is shared), so the
sweep itself only times. The JSON (environment + every measurement) is rewritten after each case, so
a run cut short still leaves its results; a short table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
import traceback

import torch

# (name, B, Hq, Hkv, S, D, dtype, causal, window, mode, tf32)
CASES = [
    ("dense-fwd-S4096", 8, 32, 32, 4096, 128, "bfloat16", False, None, "fwd", False),
    ("causal-fwd-S4096", 8, 32, 32, 4096, 128, "bfloat16", True, None, "fwd", False),
    ("dense-fwd-S8192", 4, 32, 32, 8192, 128, "bfloat16", False, None, "fwd", False),
    ("causal-fwd-S8192", 4, 32, 32, 8192, 128, "bfloat16", True, None, "fwd", False),
    ("window1024-fwd-S16384", 1, 32, 32, 16384, 128, "bfloat16", True, (1024, 0), "fwd", False),
    # where cuDNN is weakest (issue #14): D=64 and an odd head dim (96, padded to 128 in our tiles)
    ("dense-fwd-S4096-D64", 8, 32, 32, 4096, 64, "bfloat16", False, None, "fwd", False),
    ("dense-fwd-S4096-D96", 8, 32, 32, 4096, 96, "bfloat16", False, None, "fwd", False),
    ("window1024-fwdbwd-S16384", 1, 32, 32, 16384, 128, "bfloat16", True, (1024, 0), "fwd_bwd", False),
    ("fp32-tf32-fwd-S4096", 4, 16, 16, 4096, 128, "float32", False, None, "fwd", True),
    ("fp32-tf32-fwdbwd-S4096", 4, 16, 16, 4096, 128, "float32", True, None, "fwd_bwd", True),
    ("dense-fwdbwd-S8192", 4, 32, 32, 8192, 128, "bfloat16", False, None, "fwd_bwd", False),
    ("causal-fwdbwd-S8192", 4, 32, 32, 8192, 128, "bfloat16", True, None, "fwd_bwd", False),
    # the training keys of benchmarks/regret.py (families16)
    ("window512-fwdbwd-S2048-D128", 2, 16, 16, 2048, 128, "bfloat16", True, (512, 0), "fwd_bwd", False),
    ("causal-fwdbwd-S1024-D64", 4, 16, 16, 1024, 64, "bfloat16", True, None, "fwd_bwd", False),
]
# --wide-bwd: the backward grid measured beyond the tuning space (register model off, deeper pipelines),
# to see where the tuning space and the defaults should be
WIDE_BWD = {"BWD_BLOCK_M": (16, 32, 64), "BWD_BLOCK_N": (64, 128), "BWD_WARPS": (4, 8), "BWD_STAGES": (1, 2, 3, 4)}
SDPA_BACKENDS = ("default", "flash", "efficient", "cudnn", "math")
# --dry-run: tiny versions of the cases on the CPU under the Triton interpreter (checks this script,
# not speed); everything else targets "cuda"
DEV = "cuda"
TINY = [
    ("tiny-fwd", 1, 2, 2, 64, 32, "float16", True, None, "fwd", False),
    ("tiny-window-fwdbwd", 1, 2, 1, 64, 32, "float32", True, (16, 0), "fwd_bwd", False),
    ("tiny-fp32-tf32", 1, 2, 2, 48, 32, "float32", False, None, "fwd", True),
]
MATH_MAX_SCORES = 2**31  # the math backend materialises B*H*S*S scores: skip it above this


def problem_of(case):
    from attntune.problem import AttentionProblem

    _name, b, hq, hkv, s, d, dt, causal, window, mode, _ = case
    return AttentionProblem(
        batch=b,
        heads_q=hq,
        heads_kv=hkv,
        seqlen_q=s,
        seqlen_kv=s,
        head_dim=d,
        head_dim_v=d,
        dtype=dt,
        device_type=DEV,
        causal=causal,
        window=window,
        mode=mode,
    )


def inputs(prob, seed=0, requires_grad=False):
    g = torch.Generator(device=DEV).manual_seed(seed)
    dt = prob.torch_dtype

    def r(*shape):
        return torch.randn(*shape, device=DEV, dtype=dt, generator=g).requires_grad_(requires_grad)

    return (
        r(prob.batch, prob.heads_q, prob.seqlen_q, prob.head_dim),
        r(prob.batch, prob.heads_kv, prob.seqlen_kv, prob.head_dim),
        r(prob.batch, prob.heads_kv, prob.seqlen_kv, prob.head_dim),
    )


def set_precision(tf32: bool):
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def split(cfg: dict):
    fwd = {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
    bwd = {k: cfg[k] for k in cfg if k.startswith("BWD")} or None
    return fwd, bwd


def ours_fn(q, k, v, prob, cfg, do=None):
    from attntune.kernels.triton_flash.op import flash_attention

    fwd, bwd = split(cfg)
    kw = {"causal": prob.causal, "window": prob.window, "config": fwd, "bwd_config": bwd}
    if do is None:
        return lambda: flash_attention(q, k, v, **kw)
    return lambda: flash_attention(q, k, v, **kw).backward(do)


# ---- parallel compilation -------------------------------------------------------------------
def _compile_worker(args):
    case, cfgs = args
    try:
        torch.cuda.init()
        set_precision(case[10])
        prob = problem_of(case)
        train = prob.mode == "fwd_bwd"
        q, k, v = inputs(prob, requires_grad=train)
        do = torch.randn_like(q) if train else None
        bad = 0
        for cfg in cfgs:
            try:
                ours_fn(q, k, v, prob, cfg, do)()
            except Exception:  # noqa: BLE001 — recorded again (with the message) by the timing pass
                bad += 1
        torch.cuda.synchronize()
        return bad
    except Exception:  # noqa: BLE001 — a failed baseline is reported, not fatal
        return -1


def precompile(jobs, workers: int):
    """jobs: [(case, [cfg, ...])]; spread the configs over ``workers`` processes."""
    flat = [(case, cfg) for case, cfgs in jobs for cfg in cfgs]
    if not flat or workers <= 1:
        return
    chunks: dict[int, list] = {}
    for i, (case, cfg) in enumerate(flat):
        chunks.setdefault(i % workers, []).append((case, cfg))
    tasks = []
    for items in chunks.values():
        by_case: dict[str, tuple] = {}
        for case, cfg in items:
            by_case.setdefault(case[0], (case, []))[1].append(cfg)
        tasks.extend(by_case.values())
    t = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(_compile_worker, tasks, chunksize=1)
    print(f"[precompile] {len(flat)} configs on {workers} processes in {time.time() - t:.0f} s", flush=True)


# ---- timing --------------------------------------------------------------------------------
def bench(fn, rep=100, grad_to_none=None) -> float:
    import triton

    if DEV == "cpu":  # dry run: one call, wall clock
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return float(
        triton.testing.do_bench(fn, warmup=10, rep=rep, grad_to_none=grad_to_none, return_mode="median")
    )


def likely_fast_first(cfgs: list[dict], default: dict) -> list[dict]:
    """The default first, then larger row blocks and more warps first (on the H200 the best forward
    configs were 128-row blocks with 8 warps; 32-row blocks were 1.6-7x slower), so that a sweep cut
    short by the time budget has still timed the likely winners."""
    rest = [c for c in cfgs if c != default]
    rest.sort(
        key=lambda c: (
            -c.get("BLOCK_M", 0),
            -c.get("num_warps", 0),
            -c.get("LOADS", 0),  # the descriptor (TMA) launches early: what a cut-short sweep must not miss
            -c.get("BWD_BLOCK_N", 0),
            -c.get("BWD_WARPS", 0),
        )
    )
    return ([default] if default in cfgs else []) + rest


def sweep(fn_of_cfg, cfgs, rep, grad_to_none=None, deadline=None) -> list[dict]:
    out = []
    for i, cfg in enumerate(cfgs):
        if deadline is not None and time.time() > deadline and i > 0:  # the first one always runs
            out.append({"config": cfg, "skipped": "time budget"})
            continue
        try:
            out.append({"config": cfg, "ms": bench(fn_of_cfg(cfg), rep=rep, grad_to_none=grad_to_none)})
        except Exception as e:  # noqa: BLE001 — a failing config is a measurement, not a crash (out of resources…)
            out.append({"config": cfg, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
    return out


def bwd_grid(space, prob, wide: bool) -> list[dict]:
    """The distinct backward configs to sweep: the tuning space's, or with ``wide`` every combination of
    :data:`WIDE_BWD` that fits the device's shared memory (no register model: spilling is measured)."""
    if not wide:
        return [dict(t) for t in sorted({tuple((n, c[n]) for n in c if n.startswith("BWD")) for c in space.grid()})]
    import itertools

    from attntune.kernels.triton_common import block_d
    from attntune.kernels.triton_flash.space import bwd_smem_bytes, device_arch, smem_limit

    bd, es, limit = block_d(prob.head_dim), prob.torch_dtype.itemsize, smem_limit(device_arch(prob.device_type))
    out = []
    for vals in itertools.product(*WIDE_BWD.values()):
        c = dict(zip(WIDE_BWD, vals))
        if bwd_smem_bytes(c["BWD_BLOCK_M"], c["BWD_BLOCK_N"], bd, es, c["BWD_STAGES"]) <= limit:
            out.append(c)
    return out


def sdpa_fn(q, k, v, prob, backend: str, do=None):
    import torch.nn.functional as F
    from attntune.kernels.masks import build_mask, needs_mask
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mask = build_mask(prob, q.device) if needs_mask(prob) else None
    kw = {"attn_mask": mask, "is_causal": prob.causal and mask is None, "enable_gqa": prob.group > 1}
    be = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }.get(backend)

    def f():
        if be is None:
            o = F.scaled_dot_product_attention(q, k, v, **kw)
        else:
            with sdpa_kernel(be):
                o = F.scaled_dot_product_attention(q, k, v, **kw)
        if do is not None:
            o.backward(do)
        return o

    return f


_FLEX = {}


def flex_fn(q, k, v, prob, do=None):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention)
    block_mask = None
    if prob.causal or prob.window is not None:
        left = None if prob.window is None or prob.window[0] < 0 else prob.window[0]

        def mask_mod(b, h, qi, kj):
            ok = qi >= kj
            if left is not None:
                ok = ok & (qi - kj <= left)
            return ok

        block_mask = create_block_mask(mask_mod, None, None, prob.seqlen_q, prob.seqlen_kv, device=DEV)
    fn = _FLEX["fn"]

    def f():
        o = fn(q, k, v, block_mask=block_mask, enable_gqa=prob.group > 1)
        if do is not None:
            o.backward(do)
        return o

    return f


def max_error_vs_fp64(prob, fns: dict[str, callable], q, k, v) -> dict[str, float]:
    """Max |out - fp64 reference| on batch element 0 (keeps the fp64 score matrix to a few GB)."""
    from attntune.kernels.reference import reference_attention

    p1 = prob.model_copy(update={"batch": 1})
    ref = reference_attention(q[:1], k[:1], v[:1], p1, dtype=torch.float64)
    out = {}
    for name, fn in fns.items():
        try:
            out[name] = float((fn()[:1].double() - ref).abs().max())
        except Exception as e:  # noqa: BLE001 — a failed baseline is reported, not fatal
            out[name] = f"{type(e).__name__}: {e}"
    del ref
    return out


# ---- environment ---------------------------------------------------------------------------
def environment() -> dict:
    import triton

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "host": platform.node(),
    }
    if DEV == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(
            gpu=p.name,
            sm_count=p.multi_processor_count,
            capability=f"{p.major}.{p.minor}",
            memory_gib=round(p.total_memory / 2**30, 1),
        )
    try:
        env["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            check=False,
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except Exception as e:  # noqa: BLE001 — a failed baseline is reported, not fatal
        env["driver"] = f"unavailable ({type(e).__name__})"
    return env


# ---- main ----------------------------------------------------------------------------------
def run_case(case, rep, deadline, fwd_cache, wide_bwd=False) -> dict:
    from attntune.kernels import registry

    name, tf32 = case[0], case[10]
    set_precision(tf32)
    prob = problem_of(case)
    train = prob.mode == "fwd_bwd"
    flops = prob.flops()
    var = registry.get("triton_flash")
    res = {
        "name": name,
        "problem": json.loads(prob.model_dump_json()),
        "flops": flops,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "results": {},
    }
    q, k, v = inputs(prob, requires_grad=train)
    do = torch.randn_like(q) if train else None
    gtn = [q, k, v] if train else None

    # ours: sweep
    fwd_prob = prob.model_copy(update={"mode": "fwd"})
    space = var.space(prob)
    fwd_key = (fwd_prob, tuple(sorted(p.name for p in space.params if not p.name.startswith("BWD"))))
    default_cfg = space.first()
    if train:
        fwd_cfgs = [split(c)[0] for c in space.grid()]
        fwd_cfgs = [dict(t) for t in dict.fromkeys(tuple(c.items()) for c in fwd_cfgs)]
    else:
        fwd_cfgs = list(space.grid())
    fwd_cfgs = likely_fast_first(fwd_cfgs, split(default_cfg)[0])
    if fwd_key not in fwd_cache:
        qf, kf, vf = (t.detach() for t in (q, k, v))
        fwd_cache[fwd_key] = sweep(
            lambda c: ours_fn(qf, kf, vf, fwd_prob, c), fwd_cfgs, rep=30, deadline=deadline
        )
    fwd_sweep = fwd_cache[fwd_key]
    timed = sorted([r for r in fwd_sweep if "ms" in r], key=lambda r: r["ms"])
    if not timed:
        res["results"]["triton_flash"] = {"error": "no forward config ran", "sweep": fwd_sweep}
        return res
    best_fwd = timed[0]["config"]
    if train:
        bwd_cfgs = bwd_grid(space, prob, wide_bwd)
        bwd_cfgs = likely_fast_first(bwd_cfgs, split(default_cfg)[1])
        bwd_sweep = sweep(
            lambda b: ours_fn(q, k, v, prob, dict(best_fwd, **b), do),
            bwd_cfgs,
            rep=60,
            grad_to_none=gtn,
            deadline=deadline,
        )
        for r in bwd_sweep:
            r["config"] = dict(best_fwd, **dict(r["config"]))
        cand = sorted([r for r in bwd_sweep if "ms" in r], key=lambda r: r["ms"])[:3]
        sweep_log = {"forward": fwd_sweep, "backward": bwd_sweep}
    else:
        cand = timed[:3]
        sweep_log = {"forward": fwd_sweep}
    # re-time the three best with a longer rep: the sweep's short reps are noisy
    final = []
    for r in cand:
        fn = ours_fn(q, k, v, prob, r["config"], do)
        final.append((bench(fn, rep=rep, grad_to_none=gtn), r["config"]))
    if not final:
        res["results"]["triton_flash"] = {"error": "no backward config ran", "sweep": sweep_log}
        return res
    ms, cfg = min(final, key=lambda t: t[0])
    default_ms = bench(ours_fn(q, k, v, prob, default_cfg, do), rep=rep, grad_to_none=gtn)
    res["results"]["triton_flash"] = {
        "ms": ms,
        "config": cfg,
        "tflops": flops / ms / 1e9,
        "default_config": default_cfg,
        "default_ms": default_ms,
        "sweep": sweep_log,
    }
    if train:
        fwd_ms = bench(ours_fn(q.detach(), k.detach(), v.detach(), fwd_prob, cfg), rep=rep)
        res["results"]["triton_flash"]["fwd_ms_of_best"] = fwd_ms

    # baselines
    for be in SDPA_BACKENDS:
        if be == "math" and prob.batch * prob.heads_q * prob.seqlen_q * prob.seqlen_kv > MATH_MAX_SCORES:
            res["results"][f"sdpa_{be}"] = {"skipped": "score matrix too large for the math backend"}
            continue
        try:
            t = bench(sdpa_fn(q, k, v, prob, be, do), rep=rep, grad_to_none=gtn)
            res["results"][f"sdpa_{be}"] = {"ms": t, "tflops": flops / t / 1e9}
        except Exception as e:  # noqa: BLE001 — a failed baseline is reported, not fatal
            res["results"][f"sdpa_{be}"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    if prob.window is not None:  # what the window saves: the full causal attention
        full = prob.model_copy(update={"window": None})
        try:
            t = bench(sdpa_fn(q, k, v, full, "default", do), rep=rep, grad_to_none=gtn)
            res["results"]["sdpa_full_causal"] = {"ms": t, "note": "full causal, not windowed"}
        except Exception as e:  # noqa: BLE001 — a failed baseline is reported, not fatal
            res["results"]["sdpa_full_causal"] = {"error": f"{type(e).__name__}: {e}"[:200]}
    try:
        if DEV == "cpu":
            raise RuntimeError("dry run: flex skipped")
        if time.time() > deadline and prob.window is None:
            raise RuntimeError("time budget spent before flex could compile")
        torch._dynamo.reset()  # a fresh static-shape compile per case
        f = flex_fn(q, k, v, prob, do)
        f()
        t = bench(f, rep=rep, grad_to_none=gtn)
        res["results"]["flex"] = {"ms": t, "tflops": flops / t / 1e9}
    except Exception as e:  # noqa: BLE001 — a failed baseline is reported, not fatal
        res["results"]["flex"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}

    if prob.dtype == "float32":
        qf, kf, vf = (t.detach() for t in (q, k, v))
        res["max_abs_error_vs_fp64_batch0"] = max_error_vs_fp64(
            prob,
            {
                "triton_flash": ours_fn(qf, kf, vf, prob, cfg),
                "sdpa_default": sdpa_fn(qf, kf, vf, prob, "default"),
            },
            qf,
            kf,
            vf,
        )

    ours_ms = res["results"]["triton_flash"]["ms"]
    res["speedup_of_triton_flash"] = {
        k2: r["ms"] / ours_ms for k2, r in res["results"].items() if "ms" in r and k2 != "triton_flash"
    }
    sd = [
        r["ms"]
        for k2, r in res["results"].items()
        if k2.startswith("sdpa_") and "ms" in r and k2 != "sdpa_full_causal"
    ]
    if sd:
        res["speedup_of_triton_flash"]["best_sdpa"] = min(sd) / ours_ms
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return res


def _ms(case: dict | None, impl: str):
    r = (case or {}).get("results", {}).get(impl) or {}
    return r.get("ms")


def _speedup(case: dict | None, base: str):
    """``base``'s time over ours (> 1: ours faster), as :func:`run_case` recorded it; None where either
    did not run."""
    return ((case or {}).get("speedup_of_triton_flash") or {}).get(base)


def best_by_knob(case: dict, knob: str = "LOADS") -> dict:
    """The fastest forward sweep time per value of ``knob`` (e.g. LOADS: pointer loads, tensor
    descriptors, + warp specialization): what each code path reaches on this case, side by side."""
    rows = (case.get("results", {}).get("triton_flash", {}).get("sweep") or {}).get("forward") or []
    out: dict = {}
    for r in rows:
        if "ms" in r:
            v = str(r["config"].get(knob, 0))
            out[v] = min(out.get(v, float("inf")), r["ms"])
    return out


def summary(cases: list[dict]) -> dict:
    """Issue #14's figures from the cases that ran (None where a case did not run). The dispatch figures
    come from ``benchmarks/bench_suite.py`` (the dense suite through dispatch), not from here."""
    by = {c["name"]: c for c in cases}
    dense128 = [c for c in cases if c["name"] in ("dense-fwd-S4096", "dense-fwd-S8192")]
    tf = [c["results"]["triton_flash"]["tflops"] for c in dense128 if "tflops" in c["results"].get("triton_flash", {})]
    win = by.get("window1024-fwdbwd-S16384")
    return {
        "dense_fwd_d128_tflops": max(tf, default=None),
        "dense_fwd_d64_vs_cudnn": _speedup(by.get("dense-fwd-S4096-D64"), "sdpa_cudnn"),
        "dense_fwd_d96_vs_cudnn": _speedup(by.get("dense-fwd-S4096-D96"), "sdpa_cudnn"),
        "dense_fwd_d128_vs_cudnn": _speedup(by.get("dense-fwd-S4096"), "sdpa_cudnn"),
        "causal_fwd_d128_vs_cudnn": _speedup(by.get("causal-fwd-S4096"), "sdpa_cudnn"),
        "window_fwdbwd_ms": _ms(win, "triton_flash"),
        "flex_window_fwdbwd_ms": _ms(win, "flex"),
        "fp32_d128_vs_sdpa": _speedup(by.get("fp32-tf32-fwd-S4096"), "sdpa_default"),
        "fp32_d128_causal_fwdbwd_vs_sdpa": _speedup(by.get("fp32-tf32-fwdbwd-S4096"), "sdpa_default"),
        "dispatch_dense_geomean": None,
        "dispatch_dense_min": None,
        "fwd_best_ms_by_loads": {n: b for n, b in ((c["name"], best_by_knob(c)) for c in cases) if b},
    }


def merge(paths: list[str], suite_json: str | None = None) -> dict:
    """One document from several runs: each case from the newest run (by its environment's date) that
    timed it (every figure of a case stays side by side within that run; ``merged_from`` names each
    file and its cases), the summary recomputed; the dispatch figures from a ``bench_suite`` JSON."""
    docs = []
    for p in paths:
        with open(p) as f:
            docs.append((p, json.load(f)))
    docs.sort(key=lambda pd: (pd[1].get("environment") or {}).get("date") or "")
    by: dict = {}
    origin: dict = {}
    for p, d in docs:
        for c in d.get("cases", []):
            if c.get("results"):
                by[c["name"]] = c
                origin[c["name"]] = p
    order = [c[0] for c in CASES]
    cases = sorted(by.values(), key=lambda c: order.index(c["name"]) if c["name"] in order else len(order))
    out = {"environment": docs[-1][1].get("environment") if docs else None,
           "method": __doc__.strip().splitlines()[0],
           "merged_from": [{"file": os.path.basename(p), "date": (d.get("environment") or {}).get("date"),
                            "cases": sorted(n for n, o in origin.items() if o == p)} for p, d in docs],
           "cases": cases}
    out["summary"] = summary(cases)
    if suite_json:
        with open(suite_json) as f:
            sdoc = json.load(f)
        dense = (sdoc.get("summary") or {}).get("dense") or {}
        out["summary"]["dispatch_dense_geomean"] = dense.get("geomean_vs_sdpa_default")
        out["summary"]["dispatch_dense_min"] = dense.get("min_vs_sdpa_default")
        out["summary"]["dispatch_from"] = {"file": os.path.basename(suite_json),
                                           "date": (sdoc.get("environment") or {}).get("date")}
    return out


def table(cases: list[dict]) -> str:
    lines = [f"{'case':28s} {'impl':18s} {'ms':>9s} {'TFLOP/s':>8s} {'ours x':>7s}"]
    for c in cases:
        ours = c["results"].get("triton_flash", {}).get("ms")
        for impl, r in c["results"].items():
            if "ms" not in r:
                lines.append(
                    f"{c['name']:28s} {impl:18s} {'-':>9s} {'':>8s} {'':>7s}  "
                    + (r.get("error") or r.get("skipped") or "")[:60]
                )
                continue
            tf = c["flops"] / r["ms"] / 1e9 if impl != "sdpa_full_causal" else float("nan")
            ratio = r["ms"] / ours if ours else float("nan")
            lines.append(f"{c['name']:28s} {impl:18s} {r['ms']:9.3f} {tf:8.1f} {ratio:7.2f}")
        cfg = c["results"].get("triton_flash", {}).get("config")
        if cfg:
            lines.append(f"{'':28s} best config {cfg}")
        if "max_abs_error_vs_fp64_batch0" in c:
            lines.append(f"{'':28s} max |err| vs fp64: {c['max_abs_error_vs_fp64_batch0']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/flash_h200.json")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop sweeping after this many seconds")
    ap.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms) of the final timings")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="tiny cases on the CPU (interpreter)")
    ap.add_argument("--wide-bwd", action="store_true",
                    help="sweep the backward over WIDE_BWD (shared-memory fit only), not the tuning space")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="combine these runs into --out (no timing)")
    ap.add_argument("--suite-json", help="with --merge: the bench_suite JSON the dispatch figures come from")
    args = ap.parse_args(argv)
    if args.merge:
        doc = merge(args.merge, args.suite_json)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        print(json.dumps(doc["summary"], indent=1, default=str))
        return 0
    global DEV
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        DEV, args.workers = "cpu", 1
    elif not torch.cuda.is_available():
        print("bench_flash: needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    t0 = time.time()
    deadline = t0 + args.budget_s
    cases = [c for c in (TINY if args.dry_run else CASES) if not args.cases or c[0] in args.cases.split(",")]

    from attntune.kernels import registry

    var = registry.get("triton_flash")
    jobs = []
    for case in cases:
        set_precision(case[10])
        sp = var.space(problem_of(case))
        jobs.append(
            (
                case,
                list(sp.grid())
                if problem_of(case).mode == "fwd"
                else [
                    dict(split(c)[0], **d)
                    for c in [sp.first()]
                    for d in bwd_grid(sp, problem_of(case), args.wide_bwd)
                ],
            )
        )
    precompile(jobs, args.workers)

    out = {"environment": environment(), "method": __doc__.strip().splitlines()[0], "cases": []}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fwd_cache: dict = {}
    for i, case in enumerate(cases):
        t = time.time()
        # an equal share of what is left, so that a slow case cannot starve the ones after it
        case_deadline = t + max(0.0, deadline - t) / (len(cases) - i)
        try:
            res = run_case(case, args.rep, case_deadline, fwd_cache, args.wide_bwd)
        except Exception as e:  # noqa: BLE001 — a failed baseline is reported, not fatal
            traceback.print_exc()
            res = {
                "name": case[0],
                "error": f"{type(e).__name__}: {e}"[:300],
                "results": {},
                "flops": problem_of(case).flops(),
            }
        res["wall_s"] = round(time.time() - t, 1)
        out["cases"].append(res)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
        r = res["results"].get("triton_flash", {})
        print(
            f"[{time.time() - t0:5.0f}s] {case[0]}: ours {r.get('ms', float('nan')):.3f} ms "
            f"{res.get('speedup_of_triton_flash', {})}",
            flush=True,
        )
    set_precision(False)
    out["summary"] = summary(out["cases"])
    out["total_s"] = round(time.time() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(table(out["cases"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
