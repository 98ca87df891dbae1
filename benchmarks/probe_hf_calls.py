"""Where a Hugging Face decode step spends its time, per attention implementation (GPU machine).

For each case (model kind, cache, batch, prompt) and implementation (``sdpa``, ``attntune``), on models
built exactly as ``bench_generate.py`` builds them:

* ``attn_host_us`` — host time of each attention call as transformers makes it (the registered attention
  function wrapped in a ``perf_counter`` pair, no sync: what the call costs the Python thread that sets a
  host-bound step's pace), median / p90 over every call of the timed generates;
* ``step_us`` — decode step time (``StepClock``: gaps between logits-processor stamps, median);
* ``probe_us`` — ``host_probe_us`` before each generate (a fixed piece of Python: a slow host shows here);
* ``device_us_per_step`` — from one ``torch.profiler`` generate: CUDA kernel time per step in total and in
  attention kernels (names containing flash/fmha/cudnn/attn/decode/sdpa), so a step can be called
  host-bound (device time well below the step) or device-bound.

Implementations alternate run by run. A diagnostic, not a benchmark: the wrapper itself costs ~0.3 µs.

Usage: python benchmarks/probe_hf_calls.py --out probe_hf_calls.json [--cases llama:dynamic:32:512,...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_generate as bg  # noqa: E402
from env import environment  # noqa: E402

ATTN_WORDS = ("flash", "fmha", "cudnn", "attn", "decode", "sdpa", "softmax")


def _timed(fn, sink: list):
    def wrapper(*a, **kw):
        t0 = time.perf_counter_ns()
        out = fn(*a, **kw)
        sink.append((time.perf_counter_ns() - t0) / 1e3)
        return out

    return wrapper


def _pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))] if xs else None


def device_time(model, ids, mask, tokens, cache) -> dict:
    """CUDA kernel time of one generate of ``tokens`` new tokens, per step: total and attention kernels
    (top attention kernel names listed)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        bg.generate(model, ids, mask, tokens, cache)
        torch.cuda.synchronize()
    total, attn, names = 0.0, 0.0, {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0.0)
        if e.device_type is None or str(e.device_type).endswith("CPU"):
            continue
        total += t
        if any(w in e.key.lower() for w in ATTN_WORDS):
            attn += t
            names[e.key[:80]] = round(t / tokens, 1)
    top = dict(sorted(names.items(), key=lambda kv: -kv[1])[:4])
    return {"total_us_per_step": round(total / tokens, 1), "attn_us_per_step": round(attn / tokens, 1),
            "attn_kernels": top}


def run_case(kind, cache, batch, prompt, args, sinks) -> dict:
    device, dtype = torch.device("cuda"), torch.bfloat16
    models, cfg = bg.build_models(kind, args.impls, device, dtype, False, 8192)
    ids, mask = bg.case_inputs(kind, batch, prompt, cfg.vocab_size, device)
    rec = {"model": kind, "cache": cache, "batch": batch, "prompt": prompt, "impls": {}}
    for impl, m in models.items():  # warm-up: every KV length of the timed runs is seen once
        bg.generate(m, ids, mask, args.new_tokens, cache)
    torch.cuda.synchronize()
    per = {impl: {"attn_host_us": [], "step_us": [], "probe_us": []} for impl in models}
    for r in range(args.repeats):
        order = list(models) if r % 2 == 0 else list(reversed(list(models)))
        for impl in order:
            sinks[impl].clear()
            probe = bg.host_probe_us()
            clock = bg.StepClock()
            bg.generate(models[impl], ids, mask, args.new_tokens, cache, clock=clock)
            torch.cuda.synchronize()
            gaps = [(b - a) * 1e6 for a, b in zip(clock.stamps, clock.stamps[1:])]
            per[impl]["attn_host_us"].extend(sinks[impl])
            per[impl]["step_us"].append(bg._median(gaps))
            per[impl]["probe_us"].append(round(probe, 1))
            per[impl].setdefault("calls_per_step", len(sinks[impl]) / max(1, args.new_tokens))
    for impl, m in models.items():
        d = per[impl]
        hs = d.pop("attn_host_us")
        d["attn_host_us_median"] = round(bg._median(hs), 2)
        d["attn_host_us_p90"] = round(_pct(hs, 0.9), 2)
        d["step_us"] = [round(x, 1) for x in d["step_us"]]
        d["step_us_median"] = round(bg._median(d["step_us"]), 1)
        d["device"] = device_time(m, ids, mask, args.profile_tokens, cache)
        rec["impls"][impl] = d
    s, a = rec["impls"].get("sdpa"), rec["impls"].get("attntune")
    if s and a:
        rec["step_ratio"] = round(s["step_us_median"] / a["step_us_median"], 4)
        rec["attn_host_extra_us_per_step"] = round(
            (a["attn_host_us_median"] - s["attn_host_us_median"]) * a["calls_per_step"], 1)
    del models
    bg._free(device)
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe_hf_calls.json")
    ap.add_argument("--cases", default="llama:dynamic:1:512,llama:dynamic:32:512,mistral:dynamic:1:512,"
                                       "mistral:dynamic:32:512,mistral:dynamic:8:4096,llama:static:1:512")
    ap.add_argument("--impls", default="sdpa,attntune")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--profile-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    args.impls = args.impls.split(",")

    import attntune.hf
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as A

    attntune.hf.register()
    sinks = {impl: [] for impl in args.impls}
    for impl in args.impls:
        A._global_mapping[impl] = _timed(A._global_mapping[impl], sinks[impl])
    cpus = bg.parse_cpus("auto")
    if cpus:
        import os

        os.sched_setaffinity(0, cpus)
    doc = {"benchmark": "probe_hf_calls", "environment": environment(), "args": vars(args),
           "cpu": bg.cpu_state(), "cases": []}
    for spec in args.cases.split(","):
        kind, cache, b, p = spec.split(":")
        t0 = time.perf_counter()
        try:
            rec = run_case(kind, cache, int(b), int(p), args, sinks)
        except Exception as e:  # noqa: BLE001
            rec = {"case": spec, "error": f"{type(e).__name__}: {e}"}
        rec["elapsed_s"] = round(time.perf_counter() - t0, 1)
        doc["cases"].append(rec)
        print(json.dumps(rec), flush=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
