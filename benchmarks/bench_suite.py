"""Kernel suite: dispatched ``attntune.attention`` vs torch SDPA (default and each backend) and
FlexAttention, measured side by side in one run on one GPU.

Usage: python benchmarks/bench_suite.py --out results.json [--groups dense,training,decode,window,fp32]
[--no-flex]. Timing: ``triton.testing.do_bench`` medians on random data (L2 flushed by do_bench);
decode also under CUDA graphs (``do_bench_cudagraph``). FLOPs: AttentionProblem.flops() (4·D per
admitted (q,k) pair, fwd+bwd 3.5x); decode bytes: K+V once.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

import attntune  # noqa: E402
from attntune.kernels import registry  # noqa: E402
from attntune.problem import problem_from_tensors  # noqa: E402

SDPA = ["sdpa_default", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"]


def cases(groups):
    c = []
    if "dense" in groups:
        for d in (64, 80, 96, 128, 256):
            for causal in (False, True):
                for b, s in ((16, 2048), (4, 8192)) if d in (64, 128) else ((4, 4096),):
                    c.append(dict(group="dense", b=b, h=16 if d != 128 else 32, hkv=None, s=s, d=d, causal=causal))
        for b, h, s in ((64, 12, 256), (32, 16, 512), (1, 32, 32768)):
            for causal in (False, True):
                c.append(dict(group="dense", b=b, h=h, hkv=None, s=s, d=64 if s < 32768 else 128, causal=causal))
        c.append(dict(group="dense", b=17, h=8, hkv=2, s=1025, d=96, causal=True))  # odd shape + GQA
    if "training" in groups:
        for b, h, s, d in ((4, 32, 8192, 128), (8, 16, 4096, 64), (16, 16, 2048, 64)):
            for causal in (False, True):
                c.append(dict(group="training", b=b, h=h, hkv=None, s=s, d=d, causal=causal, bwd=True))
    if "decode" in groups:
        for b, kv, hkv in ((1, 1024, 8), (1, 4096, 8), (1, 8192, 8), (1, 32768, 8), (1, 131072, 8), (4, 8192, 8),
                           (8, 32768, 8), (32, 8192, 8), (64, 4096, 8), (1, 8192, 32), (16, 2048, 32)):
            c.append(dict(group="decode", b=b, h=32, hkv=hkv, s=1, skv=kv, d=128, causal=False, kv_lens=True))
    if "window" in groups:
        c.append(dict(group="window", b=1, h=32, hkv=None, s=16384, d=128, causal=True, window=1024))
        c.append(dict(group="window", b=1, h=32, hkv=None, s=16384, d=128, causal=True, window=1024, bwd=True))
        c.append(dict(group="window", b=4, h=16, hkv=None, s=8192, d=64, causal=True, window=512))
    if "fp32" in groups:
        for d in (64, 128):
            c.append(dict(group="fp32", b=4, h=16, hkv=None, s=4096, d=d, causal=False, dtype="float32"))
    return c


def make_inputs(cs, device):
    dt = getattr(torch, cs.get("dtype", "bfloat16"))
    b, h, s, d = cs["b"], cs["h"], cs["s"], cs["d"]
    hkv, skv = cs.get("hkv") or h, cs.get("skv") or s
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, h, s, d, device=device, dtype=dt, generator=g)
    k = torch.randn(b, hkv, skv, d, device=device, dtype=dt, generator=g)
    v = torch.randn(b, hkv, skv, d, device=device, dtype=dt, generator=g)
    kv_lens = torch.full((b,), skv, device=device, dtype=torch.int32) if cs.get("kv_lens") else None
    return q, k, v, kv_lens


def make_step(fn, bwd, q, k, v):
    """The timed callable: forward under no_grad, or forward + backward with a fixed output gradient."""
    if bwd:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = fn(q, k, v)
        g = torch.randn_like(out)

        def step():
            o = fn(q, k, v)
            torch.autograd.grad(o, (q, k, v), g)
    else:
        def step():
            with torch.no_grad():
                fn(q, k, v)
    step()  # compile / plan outside the timed region
    torch.cuda.synchronize()
    return step


#: repetitions an implementation gets per round at least: do_bench's ``rep`` is a time (ms) and at 40 ms a
#: 28 ms kernel ran once a round (H100, 2026-12-07)
MIN_REPS = 8


def rep_ms(est_ms: float) -> float:
    """do_bench's ``rep`` for a step that takes ``est_ms``: 40 ms, or :data:`MIN_REPS` repetitions if longer.

    >>> rep_ms(0.05), rep_ms(28.0)
    (40.0, 224.0)
    """
    return max(40.0, MIN_REPS * est_ms)


def estimate_ms(step) -> float:
    """One call of ``step`` timed with CUDA events (after the warm-up call :func:`make_step` made)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    step()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def bench_round(step, graphs=False, rep=40.0):
    import triton.testing as tt

    if graphs:
        return tt.do_bench_cudagraph(step, rep=rep)
    return tt.do_bench(step, warmup=10, rep=rep, return_mode="median")


def max_sm_mhz(device) -> Optional[int]:
    """The card's highest SM clock (NVML; None without it)."""
    from bench_generate import _nvml_handle

    h = _nvml_handle(device.index if device.index is not None else torch.cuda.current_device())
    if h is None:
        return None
    try:
        return int(h[0].nvmlDeviceGetMaxClockInfo(h[1], h[0].NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001
        return None


def round_order(names, r):
    """The implementations in the order round ``r`` times them: rotated by one a round, so that none is
    always timed right after the same neighbour. With a fixed order, on an H100 (2026-12-07) ``sdpa_cudnn``
    always followed ``sdpa_efficient``'s 8 ms kernel and ``attntune`` always came first; the same SDPA
    kernel timed as ``attntune`` and as ``sdpa_default`` differed by 0.95-1.14x across the dense cases.

    >>> round_order(["a", "b", "c"], 0), round_order(["a", "b", "c"], 1), round_order(["a", "b", "c"], 4)
    (['a', 'b', 'c'], ['b', 'c', 'a'], ['b', 'c', 'a'])
    """
    names = list(names)
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def spread(ts):
    """Relative spread of one implementation's round medians: (max - min) / median.

    >>> round(spread([2.20, 2.44, 2.85]), 3), spread([1.0])
    (0.266, 0.0)
    """
    return (max(ts) - min(ts)) / statistics.median_high(ts) if ts else 0.0


def aa_ratio(plan, ms):
    """The A/A control of a case: where dispatch chose an SDPA backend, ``attntune`` runs that very kernel,
    so ``ms[plan] / ms["attntune"]`` differs from 1 only by noise and dispatch's overhead — the case's noise
    floor, against which its ``vs_*`` ratios are read. None where the plan is our own kernel.

    >>> aa_ratio("sdpa_cudnn", {"attntune": 2.0, "sdpa_cudnn": 2.1}), aa_ratio("triton_flash", {"attntune": 1.0})
    (1.05, None)
    """
    if plan in SDPA and plan in ms and "attntune" in ms:
        return ms[plan] / ms["attntune"]
    return None


def flex_fn(cs, q):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    s, window, causal = cs["s"], cs.get("window"), cs["causal"]
    skv = cs.get("skv") or s
    off = skv - s

    def mod(b, h, qi, kj):
        ok = kj <= qi + off if causal else kj >= 0
        if window is not None:
            ok = ok & (kj >= qi + off - window)
        return ok

    bm = create_block_mask(mod, None, None, s, skv, device=q.device) if (causal or window) else None
    compiled = torch.compile(flex_attention, dynamic=False)
    gqa = cs.get("hkv") not in (None, cs["h"])
    return lambda q, k, v: compiled(q, k, v, block_mask=bm, enable_gqa=gqa)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/suite_h200.json")
    ap.add_argument("--groups", default="dense,training,decode,window,fp32")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--flex-groups", default="window,dense,training",
                    help="groups where FlexAttention is compiled and timed (each shape costs a compile)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per case (order rotated)")
    ap.add_argument("--fp32-precision", default="high", help="matmul precision for the fp32 group")
    ap.add_argument("--only", default="", help="comma list: only cases whose key contains one of these")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "bench_suite needs a GPU"
    from bench_generate import RunMeter

    dev = torch.device("cuda")
    top = max_sm_mhz(dev)
    rows = []
    only = [x for x in args.only.split(",") if x]
    for cs in cases(args.groups.split(",")):
        prec = args.fp32_precision if cs.get("dtype") == "float32" else "highest"
        torch.set_float32_matmul_precision(prec)
        q, k, v, kv_lens = make_inputs(cs, dev)
        bwd = cs.get("bwd", False)
        window = None if cs.get("window") is None else (cs["window"], 0)
        with torch.no_grad():
            prob = problem_from_tensors(q, k, v, causal=cs["causal"], window=window, kv_lens=kv_lens,
                                        mode="fwd_bwd" if bwd else "fwd")
        # kv_lens are the full length here: count every key (flops() of a kv_lens problem counts the tuner's
        # timed lengths, AttentionProblem.timed_kv_lens)
        flops = prob.model_copy(update={"kv_lens": False}).flops()
        if only and not any(x in prob.short() for x in only):
            continue
        row = {**cs, "key": prob.short(), "flops": flops, "precision": prec, "ms": {}, "errors": {}}

        def at(q_, k_, v_):
            return attntune.attention(q_, k_, v_, causal=cs["causal"], window=window, kv_lens=kv_lens)

        impls = {"attntune": at}
        for name in SDPA:
            var = registry.get(name)
            if not var.supports(prob):
                impls[name] = (lambda var_: lambda q_, k_, v_: var_.run(q_, k_, v_, prob, {}, kv_lens))(var)
            else:
                row["errors"][name] = "; ".join(var.supports(prob))
        if cs["group"] == "decode":
            # kv_lens are the full length here, so SDPA without any mask computes the same thing: the
            # baseline table's decode figure (what SDPA costs when no per-sequence lengths are needed).
            plain = prob.model_copy(update={"kv_lens": False})
            sd = registry.get("sdpa_default")
            impls["sdpa_plain"] = lambda q_, k_, v_: sd.run(q_, k_, v_, plain, {}, None)
        if not args.no_flex and cs["group"] in args.flex_groups.split(",") and (cs["s"] >= 2048 or cs.get("window")):
            f = flex_fn(cs, q)
            if f is not None:
                impls["flex"] = f
        # Interleaved rounds: every implementation is timed once per round, in an order rotated each round
        # (round_order), the reported figure is the median over rounds, so clock or thermal drift during the
        # case does not favour whoever ran first or after a heavy neighbour.
        steps = {}
        for name, fn in impls.items():
            try:
                steps[name] = make_step(fn, bwd, q, k, v)
            except Exception as e:  # noqa: BLE001 — a backend that cannot run this shape is a result too
                row["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        reps = {name: rep_ms(estimate_ms(step)) for name, step in steps.items()}
        samples, clocks, reasons = {}, {}, set()
        for r in range(args.rounds):
            for name in round_order(steps, r):
                step = steps[name]
                modes = (False, True) if cs["group"] == "decode" else (False,)
                for graphs in modes:
                    label = name + ("@graph" if graphs else "")
                    if label in row["errors"]:
                        continue
                    try:
                        # a sample every 10 ms: >= 4 a round (rep >= 40 ms), and a sampling thread that takes
                        # the GIL seldom enough not to slow host-bound (µs-scale decode) launches much
                        with RunMeter(dev, period=0.01) as meter:
                            t = bench_round(step, graphs, reps[name])
                        samples.setdefault(label, []).append(t)
                        clocks.setdefault(label, []).append((meter.result.get("sm_mhz") or [None] * 3)[1])
                        reasons.update(meter.result.get("clock_reasons", []))
                    except Exception as e:  # noqa: BLE001
                        row["errors"][label] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"

        ok = [label for label in samples if label not in row["errors"]]
        row["ms"] = {label: statistics.median_high(samples[label]) for label in ok}
        row["rounds"] = {label: ts for label, ts in samples.items()}
        # The clocks are context, not a correction: rescaling each round to the top clock (tried on an H100,
        # 2026-12-07, suite_h100_2026-12-07c_dense_aa.json) widened the A/A control from 0.982-1.021 to
        # 0.882-1.061 — one median sample a round does not say at which clock the kernel ran, and the heavy
        # cases' drops are the power cap (sw_power_cap), which every user of that workload meets as well.
        row["sm_mhz"] = clocks
        row["clock_reasons"] = sorted(reasons)  # why the clock sat below its top in any round (RunMeter)
        row["spread"] = {label: round(spread(ts), 4) for label, ts in samples.items()}
        try:
            row["plan"] = attntune.explain(q, k, v, causal=cs["causal"], window=window, kv_lens=kv_lens).variant
        except Exception as e:  # noqa: BLE001
            row["plan"] = f"? ({e})"
        ms = row["ms"]
        if aa_ratio(row["plan"], ms) is not None:
            row["aa_ratio"] = aa_ratio(row["plan"], ms)
        sdpa_ms = [ms[n] for n in SDPA if n in ms]
        if "attntune" in ms and "sdpa_default" in ms:
            row["vs_sdpa_default"] = ms["sdpa_default"] / ms["attntune"]
        if "attntune" in ms and sdpa_ms:
            row["vs_best_sdpa"] = min(sdpa_ms) / ms["attntune"]
        if "attntune" in ms and "flex" in ms:
            row["vs_flex"] = ms["flex"] / ms["attntune"]
        if "attntune" in ms:
            row["tflops"] = flops / (ms["attntune"] * 1e-3) / 1e12
            if cs["group"] == "decode":
                kv_bytes = 2 * k.numel() * k.element_size()
                row["tbps"] = kv_bytes / (ms["attntune"] * 1e-3) / 1e12
                if "attntune@graph" in ms:
                    row["tbps_graph"] = kv_bytes / (ms["attntune@graph"] * 1e-3) / 1e12
                    row["vs_sdpa_default_graph"] = ms.get("sdpa_default@graph", math.nan) / ms["attntune@graph"]
                    row["vs_sdpa_plain_graph"] = ms.get("sdpa_plain@graph", math.nan) / ms["attntune@graph"]
                row["vs_sdpa_plain"] = ms.get("sdpa_plain", math.nan) / ms["attntune"]
        rows.append(row)
        print(json.dumps({k_: row[k_] for k_ in ("key", "plan", "ms") if k_ in row}
                         | {k_: round(row[k_], 3) for k_ in ("vs_sdpa_default", "vs_best_sdpa", "vs_flex", "tflops") if k_ in row}),
              flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    torch.set_float32_matmul_precision("highest")

    def geo(xs):
        xs = [x for x in xs if x and x == x]
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None

    summary = {}
    for grp in sorted({r["group"] for r in rows}):
        rs = [r for r in rows if r["group"] == grp]
        summary[grp] = {"geomean_vs_sdpa_default": geo([r.get("vs_sdpa_default") for r in rs]),
                        "min_vs_sdpa_default": min((r["vs_sdpa_default"] for r in rs if "vs_sdpa_default" in r), default=None),
                        "geomean_vs_best_sdpa": geo([r.get("vs_best_sdpa") for r in rs]), "n": len(rs)}
        aa = [r["aa_ratio"] for r in rs if "aa_ratio" in r]
        if aa:  # the noise floor of this group's ratios (aa_ratio): how far 1.0 strays where nothing differs
            summary[grp].update({"aa_n": len(aa), "aa_min": min(aa), "aa_max": max(aa), "aa_geomean": geo(aa)})
        if grp == "decode":
            for k_ in ("vs_sdpa_plain", "vs_sdpa_default_graph", "vs_sdpa_plain_graph"):
                summary[grp]["geomean_" + k_] = geo([r.get(k_) for r in rs])
    summary["all"] = {"geomean_vs_sdpa_default": geo([r.get("vs_sdpa_default") for r in rows])}
    doc = {"benchmark": "suite", "environment": environment(), "max_sm_mhz": top, "rows": rows, "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"\n{'key':58s} {'plan':14s} {'attntune':>9s} {'sdpa':>9s} {'vsSDPA':>7s} {'vsBest':>7s} {'vsFlex':>7s}")
    for r in rows:
        ms = r["ms"]
        print(f"{r['key'][:58]:58s} {str(r.get('plan'))[:14]:14s} {ms.get('attntune', math.nan):9.4f} "
              f"{ms.get('sdpa_default', math.nan):9.4f} {r.get('vs_sdpa_default', math.nan):7.2f} "
              f"{r.get('vs_best_sdpa', math.nan):7.2f} {r.get('vs_flex', math.nan):7.2f}")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
