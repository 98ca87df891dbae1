"""Device time of each kernel of the flash backward (preprocess, dK/dV, dQ) per launch config (GPU machine).

The two main kernels take one shared config today (:class:`FlashBwdConfig`: the dK/dV kernel keeps
``BWD_BLOCK_N`` keys resident and streams ``BWD_BLOCK_M`` rows, the dQ kernel mirrors the roles). This
diagnostic asks whether each kernel would pick a different config on its own: per case it runs
:func:`launch.backward` over a grid of configs under ``torch.profiler`` and reports every kernel's median
device time per config, the best shared config (sum of both) and the best of each kernel alone — dQ indexed
by *its* tile (rows resident, keys streamed). FlexAttention's backward on the same case (device time of
its backward kernels, same profiler) is the reference of #14's window target.

Usage: python benchmarks/diag_bwd_kernels.py --out diag_bwd.json [--cases window1024-S16384,...] [--reps 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

from attntune.kernels.triton_flash import launch  # noqa: E402
from attntune.kernels.triton_flash.config import FlashBwdConfig, FlashFwdConfig  # noqa: E402

# name: (B, Hq, Hkv, S, D, causal, window)
CASES = {
    "window1024-S16384": (1, 32, 32, 16384, 128, True, (1024, 0)),  # bench_flash's window fwd+bwd case
    "hf-mistral-S4096-D64": (1, 32, 8, 4096, 64, True, (1023, 0)),  # bench_hf_train's layer
    "causal-S8192-D128": (4, 32, 32, 8192, 128, True, None),
    "causal-S4096-D64": (4, 16, 16, 4096, 64, True, None),
    "causal-S1024-D64": (4, 16, 16, 1024, 64, True, None),  # bench_flash's / the regret suite's training key
    "dense-S2048-D64-gqa": (8, 32, 8, 2048, 64, False, None),
    "tiny": (1, 2, 1, 64, 32, True, (16, 0)),  # --smoke on the CPU is not possible: Triton needs a GPU here
}
KERNELS = ("bwd_preprocess_kernel", "bwd_dkdv_kernel", "bwd_dq_kernel")


def grid(full: bool):
    ms = (16, 32, 64, 128) if full else (32, 64, 128)
    ns = (32, 64, 128) if full else (64, 128)
    for bm, bn, w, s in itertools.product(ms, ns, (4, 8), (1, 2, 3, 4) if full else (2, 3)):
        yield FlashBwdConfig(BWD_BLOCK_M=bm, BWD_BLOCK_N=bn, BWD_WARPS=w, BWD_STAGES=s)


def kernel_times(fn, reps: int) -> dict:
    """Median device µs per kernel name over ``reps`` calls of ``fn`` (after one warm-up call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per: dict = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per.setdefault(ev.name, []).append(ev.device_time_total if hasattr(ev, "device_time_total")
                                               else ev.cuda_time_total)
    return {name: statistics.median(v) * len(v) / reps for name, v in per.items()}  # µs per call


def run_case(name: str, spec, reps: int, full: bool, flex: bool) -> dict:
    B, Hq, Hkv, S, D, causal, window = spec
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, Hq, S, D, device=dev, dtype=dt, generator=g)
    k = torch.randn(B, Hkv, S, D, device=dev, dtype=dt, generator=g)
    v = torch.randn(B, Hkv, S, D, device=dev, dtype=dt, generator=g)
    do = torch.randn(B, Hq, S, D, device=dev, dtype=dt, generator=g)
    mask = launch.mask_args(S, S, causal, "bottom_right", window)
    scale = D ** -0.5
    o, lse = launch.forward(q, k, v, mask, scale, FlashFwdConfig())
    ref = launch.backward(do, q, k, v, o, lse, mask, scale, FlashBwdConfig())
    rows = []
    for cfg in grid(full):
        t0 = time.perf_counter()
        try:
            got = launch.backward(do, q, k, v, o, lse, mask, scale, cfg)
            err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, ref))
            times = kernel_times(lambda cfg=cfg: launch.backward(do, q, k, v, o, lse, mask, scale, cfg), reps)
        except Exception as e:  # noqa: BLE001 — out of resources etc.: recorded, not fatal
            rows.append({"config": cfg.as_dict() if hasattr(cfg, "as_dict") else vars(cfg),
                         "error": f"{type(e).__name__}: {str(e)[:160]}"})
            continue
        ks = {kname: next((t for n, t in times.items() if kname in n), None) for kname in KERNELS}
        rows.append({"config": {f: getattr(cfg, f) for f in ("BWD_BLOCK_M", "BWD_BLOCK_N", "BWD_WARPS", "BWD_STAGES")},
                     "us": ks, "max_abs_diff_vs_default": err, "wall_s": round(time.perf_counter() - t0, 2)})
        print(name, rows[-1]["config"], {k: round(v, 1) if v else v for k, v in ks.items()}, flush=True)
    ok = [r for r in rows if "us" in r and all(r["us"][k] for k in KERNELS[1:])]
    out = {"case": name, "shape": {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal, "window": window},
           "rows": rows}
    if ok:
        shared = min(ok, key=lambda r: r["us"]["bwd_dkdv_kernel"] + r["us"]["bwd_dq_kernel"])
        best_dkdv = min(ok, key=lambda r: r["us"]["bwd_dkdv_kernel"])
        best_dq = min(ok, key=lambda r: r["us"]["bwd_dq_kernel"])
        pre = statistics.median(r["us"]["bwd_preprocess_kernel"] for r in ok if r["us"]["bwd_preprocess_kernel"])
        out["summary"] = {
            "preprocess_us": pre,
            "best_shared": {"config": shared["config"], "dkdv_us": shared["us"]["bwd_dkdv_kernel"],
                            "dq_us": shared["us"]["bwd_dq_kernel"]},
            "best_dkdv": {"config": best_dkdv["config"], "us": best_dkdv["us"]["bwd_dkdv_kernel"]},
            # the dQ kernel's own tile: rows resident = BWD_BLOCK_N, keys streamed = BWD_BLOCK_M
            "best_dq": {"rows": best_dq["config"]["BWD_BLOCK_N"], "keys": best_dq["config"]["BWD_BLOCK_M"],
                        "warps": best_dq["config"]["BWD_WARPS"], "stages": best_dq["config"]["BWD_STAGES"],
                        "us": best_dq["us"]["bwd_dq_kernel"]},
        }
        s = out["summary"]
        s["shared_total_us"] = pre + s["best_shared"]["dkdv_us"] + s["best_shared"]["dq_us"]
        s["separate_total_us"] = pre + s["best_dkdv"]["us"] + s["best_dq"]["us"]
        s["separate_gain"] = s["shared_total_us"] / s["separate_total_us"]
    if flex:
        out["flex"] = flex_times(q, k, v, do, causal, window, reps)
    return out


def flex_times(q, k, v, do, causal, window, reps):
    """FlexAttention (compiled, as dispatch runs it) on the same case: device µs of its forward and
    backward kernels per fwd+bwd call, by kernel name."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        return {"error": str(e)}
    S = q.shape[2]
    left = window[0] if window else None

    def mask_mod(b, h, qi, kj):
        ok = kj <= qi
        if left is not None:
            ok = ok & (kj >= qi - left)
        return ok

    bm = create_block_mask(mask_mod, None, None, S, S, device=q.device)
    fa = torch.compile(flex_attention)
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    gqa = q.shape[1] != k.shape[1]

    def step():
        out = fa(qq, kk, vv, block_mask=bm, enable_gqa=gqa)
        out.backward(do)

    try:
        times = kernel_times(step, reps)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return {"kernels_us": times, "total_us": sum(times.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="diag_bwd_kernels.json")
    ap.add_argument("--cases", default="window1024-S16384,hf-mistral-S4096-D64")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--full", action="store_true", help="the wide grid (4x3x2x4 configs) instead of 3x2x2x2")
    ap.add_argument("--no-flex", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("diag_bwd_kernels: needs a CUDA GPU", file=sys.stderr)
        return 2
    doc = {"benchmark": "diag_bwd_kernels", "environment": environment(), "args": vars(args), "cases": []}
    for name in args.cases.split(","):
        doc["cases"].append(run_case(name, CASES[name], args.reps, args.full, not args.no_flex))
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(json.dumps({name: doc["cases"][-1].get("summary"), "flex": doc["cases"][-1].get("flex")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
