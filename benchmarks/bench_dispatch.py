"""Host overhead of attntune's dispatch, and (on a GPU) a CUDA-graph capture check.

Overhead = per-call time of a route through attntune minus the per-call time of calling the chosen
implementation directly (``plan.impl.run(q, k, v, plan.problem, plan.config)`` — the same variant and
config). Inputs are tiny so that the host side dominates. The routes are timed in interleaved rounds
(order rotated every round, so drift and other load hit all of them alike); each round gives a per-call
time per route. Two overheads are reported: ``overhead_us_min``, the difference of the routes' fastest
rounds (the least disturbed measurement of a deterministic cost, as ``timeit`` recommends; the headline
number), and ``overhead_us_median``, the median over rounds of the per-round difference (includes the
noise of a shared machine; the load average at start and end is recorded with the environment).

    python benchmarks/bench_dispatch.py --out benchmarks/results/dispatch_cpu.json --device cpu
    python benchmarks/bench_dispatch.py --out benchmarks/results/dispatch_gpu.json --device cuda

Target: <= 3 us per call. On a GPU the kernels are asynchronous, so the per-call time is the host's
(launch) time as long as the host is the bottleneck — true for these sizes; each round ends with a
synchronize so queued work is paid inside the round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

TARGET_US = 3.0


def environment(device: torch.device) -> Dict[str, object]:
    import attntune

    env: Dict[str, object] = {
        "python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
        "attntune": attntune.__version__, "torch_threads": torch.get_num_threads(), "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        env["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, cuda=torch.version.cuda, hip=torch.version.hip,
                   sm_count=props.multi_processor_count, driver=_driver())
    return env


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg():
    try:
        return os.getloadavg()
    except OSError:
        return None


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except Exception:  # noqa: BLE001
        return None


def _time_round(fn: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    """Per-call microseconds of ``calls`` back-to-back calls (synchronised at the end)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def measure(routes: Dict[str, Callable[[], object]], baseline: str, calls: int, rounds: int,
            sync: Callable[[], None]) -> Dict[str, Dict[str, float]]:
    names = list(routes)
    for fn in routes.values():  # warm-up: plans resolved, kernels compiled, caches hot
        for _ in range(max(50, calls // 10)):
            fn()
    per: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            per[n].append(_time_round(routes[n], calls, sync))
    out: Dict[str, Dict[str, float]] = {}
    for n in names:
        diffs = [a - b for a, b in zip(per[n], per[baseline])]
        q = statistics.quantiles(diffs, n=4) if len(diffs) >= 4 else [min(diffs), 0, max(diffs)]
        out[n] = {"median_us_per_call": statistics.median(per[n]), "min_us_per_call": min(per[n]),
                  "overhead_us_min": min(per[n]) - min(per[baseline]),
                  "overhead_us_median": statistics.median(diffs), "overhead_us_q1": q[0], "overhead_us_q3": q[-1]}
    return out


def bench_device(device: torch.device, calls: int, rounds: int) -> Dict[str, object]:
    import attntune
    from attntune.policies.dispatch import original_sdpa

    attntune.reset()
    if device.type == "cuda":
        b, h, s, d, dtype = 1, 8, 16, 64, torch.float16
        sync = torch.cuda.synchronize
    else:
        b, h, s, d, dtype = 1, 2, 8, 16, torch.float32
        sync = lambda: None  # noqa: E731
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(device=device, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        plan = attntune.explain(q, k, v, causal=True)
        impl, problem, config = plan.impl, plan.problem, plan.config
        routes = {
            "direct variant.run": lambda: impl.run(q, k, v, problem, config, None),
            "attntune.attention": lambda: attntune.attention(q, k, v, causal=True),
            "attntune.scaled_dot_product_attention": lambda: attntune.scaled_dot_product_attention(
                q, k, v, is_causal=True),
            "torch F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        }
        res = measure(routes, "direct variant.run", calls, rounds, sync)
        # The patched route: F.sdpa itself inside attntune.dispatch(), against torch's own SDPA.
        orig = original_sdpa()
        with attntune.dispatch():
            patched = {"torch F.sdpa (unpatched)": lambda: orig(q, k, v, is_causal=True),
                       "F.sdpa patched": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
            pres = measure(patched, "torch F.sdpa (unpatched)", calls, rounds, sync)
    noop = dispatch_only(q, k, v, calls, rounds, sync)
    return {
        "device": str(device), "shape": {"B": b, "H": h, "S": s, "D": d, "dtype": str(dtype).replace("torch.", ""),
                                         "causal": True},
        "plan": {"variant": plan.variant, "config": plan.config, "source": plan.source},
        "calls_per_round": calls, "rounds": rounds, "routes": res, "patched_routes": pres,
        "dispatch_only": noop,
        "overhead_us": res["attntune.attention"]["overhead_us_min"],
        "overhead_us_median": res["attntune.attention"]["overhead_us_median"],
        "target_us": TARGET_US, "meets_target": res["attntune.attention"]["overhead_us_min"] <= TARGET_US,
    }


def dispatch_only(q, k, v, calls: int, rounds: int, sync) -> Dict[str, object]:
    """attntune's own host work alone: the plan is a variant whose run() returns q untouched, so the
    per-call difference is the signature, the look-up, the counters and the call — no kernel time and
    none of its noise. (Forced with ATTNTUNE_POLICY=fixed:NAME, restored afterwards.)"""
    import attntune
    from attntune.kernels import registry
    from attntune.kernels.base import Variant

    class _Noop(Variant):
        name = "bench_noop"
        family = "bench"
        description = "returns q (measures dispatch overhead only)"

        def supports(self, problem):
            return []

        def run(self, q, k, v, problem, config, kv_lens=None):
            return q

    impl = registry.register(_Noop())
    old = os.environ.get("ATTNTUNE_POLICY")
    os.environ["ATTNTUNE_POLICY"] = "fixed:bench_noop"
    attntune.reset()
    try:
        with torch.no_grad():
            plan = attntune.explain(q, k, v, causal=True)
            assert plan.variant == "bench_noop", plan
            problem, config = plan.problem, plan.config
            routes = {"direct noop.run": lambda: impl.run(q, k, v, problem, config, None),
                      "attntune.attention -> noop": lambda: attntune.attention(q, k, v, causal=True),
                      "attntune.scaled_dot_product_attention -> noop": lambda: attntune.scaled_dot_product_attention(
                          q, k, v, is_causal=True)}
            res = measure(routes, "direct noop.run", calls, rounds, sync)
    finally:
        registry.unregister("bench_noop")
        if old is None:
            os.environ.pop("ATTNTUNE_POLICY", None)
        else:
            os.environ["ATTNTUNE_POLICY"] = old
        attntune.reset()
    return {"routes": res, "overhead_us": res["attntune.attention -> noop"]["overhead_us_min"],
            "dropin_overhead_us": res["attntune.scaled_dot_product_attention -> noop"]["overhead_us_min"]}


def cuda_graph_check(device: torch.device) -> Dict[str, object]:
    """Capture ``attntune.attention`` in a CUDA graph after warm-up, replay it on new inputs copied into
    the static tensors, and compare with eager calls on the same inputs."""
    import attntune

    results = []
    cases = [
        dict(name="prefill causal", shape=(2, 8, 2, 256, 256, 64), kw=dict(causal=True), lens=False),
        dict(name="decode kv_lens", shape=(4, 32, 8, 1, 1024, 128), kw=dict(), lens=True),
        dict(name="window", shape=(1, 8, 8, 512, 512, 64), kw=dict(causal=True, window=(128, 0)), lens=False),
    ]
    for c in cases:
        b, hq, hkv, sq, skv, d = c["shape"]
        mk = lambda *s: torch.randn(*s, device=device, dtype=torch.float16)  # noqa: E731
        q, k, v = mk(b, hq, sq, d), mk(b, hkv, skv, d), mk(b, hkv, skv, d)
        kv_lens = torch.randint(skv // 2, skv + 1, (b,), device=device, dtype=torch.int32) if c["lens"] else None
        kw = dict(c["kw"], kv_lens=kv_lens)
        entry: Dict[str, object] = {"case": c["name"], "shape": c["shape"]}
        try:
            with torch.no_grad():
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        attntune.attention(q, k, v, **kw)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = attntune.attention(q, k, v, **kw)
                errs = []
                for _ in range(3):
                    q.copy_(mk(b, hq, sq, d))
                    k.copy_(mk(b, hkv, skv, d))
                    v.copy_(mk(b, hkv, skv, d))
                    graph.replay()
                    eager = attntune.attention(q, k, v, **kw)
                    torch.cuda.synchronize()
                    errs.append(float((out.float() - eager.float()).abs().max()))
                plan = attntune.explain(q, k, v, **kw)
            entry.update(ok=max(errs) <= 4e-3, max_abs_err=max(errs), variant=plan.variant, source=plan.source)
        except Exception as e:  # noqa: BLE001 — report, do not hide
            entry.update(ok=False, error=f"{type(e).__name__}: {e}")
        results.append(entry)
    return {"cases": results, "ok": all(r.get("ok") for r in results)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--device", default="auto", help="cpu, cuda, or auto (cuda when available, and cpu)")
    ap.add_argument("--calls", type=int, default=2000, help="calls per timed round")
    ap.add_argument("--rounds", type=int, default=31, help="timed rounds per route")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: host overhead, not BLAS)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    # The runtime must not read or write the user's cache while measuring its overhead.
    os.environ.setdefault("ATTNTUNE_CACHE", "sqlite://")
    if args.device == "auto":
        devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    else:
        devices = [torch.device(args.device)]
    report: Dict[str, object] = {"benchmark": "dispatch_overhead", "environment": environment(devices[-1]),
                                 "results": []}
    report["environment"]["loadavg_start"] = _loadavg()
    for dev in devices:
        r = bench_device(dev, args.calls, args.rounds)
        report["results"].append(r)
        print(f"{dev}: attention overhead {r['overhead_us']:.2f} us/call (fastest rounds; median of per-round "
              f"differences {r['overhead_us_median']:.2f}) over {r['plan']['variant']}.run "
              f"(target {TARGET_US} us: {'met' if r['meets_target'] else 'NOT met'}); dispatch alone "
              f"{r['dispatch_only']['overhead_us']:.2f} us")
        for name, m in r["routes"].items():
            print(f"  {name:46s} min {m['min_us_per_call']:7.2f} median {m['median_us_per_call']:7.2f} us/call  "
                  f"overhead min {m['overhead_us_min']:+.2f} median {m['overhead_us_median']:+.2f}")
        for name, m in r["patched_routes"].items():
            print(f"  {name:46s} min {m['min_us_per_call']:7.2f} median {m['median_us_per_call']:7.2f} us/call  "
                  f"overhead min {m['overhead_us_min']:+.2f} median {m['overhead_us_median']:+.2f}")
        for name, m in r["dispatch_only"]["routes"].items():
            print(f"  {name:46s} min {m['min_us_per_call']:7.2f} median {m['median_us_per_call']:7.2f} us/call  "
                  f"overhead min {m['overhead_us_min']:+.2f} median {m['overhead_us_median']:+.2f}")
        if dev.type == "cuda":
            cg = cuda_graph_check(dev)
            r["cuda_graph"] = cg
            print(f"  CUDA graph capture: {'ok' if cg['ok'] else 'FAILED'} {cg['cases']}")
    report["environment"]["loadavg_end"] = _loadavg()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
