"""Probe: where the host time of a decode step goes on this machine (GPU only).

Answers three questions before the decode launch path is redesigned (results in
``benchmarks/results/probe_host_h200.json``):

1. SDPA at q_len 1 (B=2, GQA 32/8, D=64, bf16): which backend torch picks, and what the *first* call at a
   never-seen KV length costs per backend (cuDNN builds an execution graph per shape), for K/V that are
   fresh contiguous tensors (HF's DynamicCache concatenates) and for views into a longer buffer (a
   serving KV cache). Host wall time with a synchronize after the call, first call vs an immediate repeat.
2. Triton's launch path: host µs per launch of a 30-argument kernel (the decode kernel's arity) through
   ``kernel[grid](...)`` against calling the cached ``CompiledKernel`` directly, plus the cost of the
   pieces a launcher needs (``torch.empty``, the current stream).
3. Which argument layout ``CompiledKernel.run`` takes in this Triton (constexprs included or not).

Usage: python benchmarks/probe_host.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402


def _med(xs):
    return statistics.median(xs)


def sdpa_first_call(out: dict) -> None:
    dev = "cuda"
    B, Hq, Hkv, D = 2, 32, 8, 64
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    buf_k = torch.randn(B, Hkv, 8192, D, device=dev, dtype=torch.bfloat16)
    buf_v = torch.randn(B, Hkv, 8192, D, device=dev, dtype=torch.bfloat16)
    try:
        choice = torch._fused_sdp_choice(q, buf_k[:, :, :1000], buf_v[:, :, :1000], None, 0.0, False,
                                         enable_gqa=True)
        out["default_choice"] = str(SDPBackend(choice))
    except Exception as e:  # noqa: BLE001
        out["default_choice"] = f"unknown ({type(e).__name__}: {e})"
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    res = {}
    base = 1000
    for name, be in backends.items():
        for layout in ("contiguous", "view"):
            firsts, repeats = [], []
            err = None
            for i in range(24):
                L = base + i
                base_next = L
                if layout == "view":
                    k, v = buf_k[:, :, :L], buf_v[:, :, :L]
                else:
                    k, v = buf_k[:, :, :L].contiguous(), buf_v[:, :, :L].contiguous()
                torch.cuda.synchronize()
                try:
                    ts = []
                    for _ in range(2):
                        t0 = time.perf_counter()
                        if be is None:
                            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        else:
                            with sdpa_kernel(be):
                                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        torch.cuda.synchronize()
                        ts.append((time.perf_counter() - t0) * 1e6)
                except Exception as e:  # noqa: BLE001
                    err = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    break
                firsts.append(ts[0])
                repeats.append(ts[1])
            base = base_next + 1
            res[f"{name}/{layout}"] = ({"error": err} if err else
                                       {"first_us_median": _med(firsts), "first_us_max": max(firsts),
                                        "repeat_us_median": _med(repeats)})
            print(f"sdpa {name:10s} {layout:10s} {res[f'{name}/{layout}']}", flush=True)
    out["sdpa_new_length"] = res
    # Host-only cost (no sync) of a steady call per backend: launches are async, so this is the CPU price.
    host = {}
    k, v = buf_k[:, :, :4000], buf_v[:, :, :4000]
    for name, be in backends.items():
        if name == "math":
            continue
        try:
            for _ in range(20):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            torch.cuda.synchronize()
            n = 2000
            if be is None:
                t0 = time.perf_counter()
                for _ in range(n):
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                t1 = time.perf_counter()
            else:
                with sdpa_kernel(be):
                    t0 = time.perf_counter()
                    for _ in range(n):
                        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host[name] = {"host_us_per_call": (t1 - t0) / n * 1e6, "wall_us_per_call": (t2 - t0) / n * 1e6}
        except Exception as e:  # noqa: BLE001
            host[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        print(f"sdpa steady {name}: {host[name]}", flush=True)
    out["sdpa_steady_kv4000"] = host


@triton.jit(do_not_specialize=["n", "a3", "a4"])
def k30(X, Y, Z, W, O,
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        n, a3, a4, scale,
        C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, BLOCK: tl.constexpr, C5: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs * s3, mask=m, other=0.0)
    tl.store(O + offs, x * scale + C1, mask=m)


def triton_launch(out: dict) -> None:
    dev = "cuda"
    x = torch.randn(4096, device=dev)
    o = torch.empty_like(x)
    strides = [1] * 16
    args = [x, x, x, x, o] + strides + [4096, 3, 5, 2.0]
    consts = dict(C1=1, C2=2, C3=3, BLOCK=1024, C5=False)
    grid = (4, 1, 1)
    kern = k30[grid](*args, **consts, num_warps=4, num_stages=2)
    torch.cuda.synchronize()
    ref = o.clone()
    n = 5000

    def timeit(fn):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / n * 1e6

    res = {"jit_getitem_us": timeit(lambda: k30[grid](*args, **consts, num_warps=4, num_stages=2))}
    res["kernel_type"] = type(kern).__name__
    res["has_packed_metadata"] = hasattr(kern, "packed_metadata")
    res["has_function"] = hasattr(kern, "function")
    stream = torch.cuda.current_stream().cuda_stream
    layouts = {"all_params": args + list(consts.values()), "no_constexpr": args}
    for name, a in layouts.items():
        o.zero_()
        try:
            def direct(a=a):
                kern.run(4, 1, 1, stream, kern.function, kern.packed_metadata, None, None, None, *a)
            direct()
            torch.cuda.synchronize()
            ok = bool(torch.equal(o, ref))
            res[f"direct_{name}"] = {"works": ok, "us": timeit(direct) if ok else None}
        except Exception as e:  # noqa: BLE001
            res[f"direct_{name}"] = {"works": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    try:
        runner = kern[grid]
        o.zero_()
        runner(*args, *consts.values())
        torch.cuda.synchronize()
        res["compiled_getitem"] = {"works": bool(torch.equal(o, ref)),
                                   "us": timeit(lambda: runner(*args, *consts.values()))}
    except Exception as e:  # noqa: BLE001
        res["compiled_getitem"] = {"works": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    res["torch_empty_us"] = timeit(lambda: torch.empty(2, 32, 1, 64, device=dev, dtype=torch.bfloat16))
    res["current_stream_us"] = timeit(lambda: torch.cuda.current_stream().cuda_stream)
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        res["raw_stream_us"] = timeit(lambda: raw(0))
    from triton.runtime import driver
    res["triton_get_stream_us"] = timeit(lambda: driver.active.get_current_stream(0))
    res["data_ptr_us"] = timeit(lambda: x.data_ptr())
    res["stride_us"] = timeit(lambda: x.stride())
    for k, v in res.items():
        print(f"triton {k}: {v}", flush=True)
    out["triton_launch"] = res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="probe_host.json")
    args = ap.parse_args()
    out = {"environment": environment()}
    for fn in (triton_launch, sdpa_first_call):
        try:
            fn(out)
        except Exception as e:  # noqa: BLE001
            out[fn.__name__ + "_error"] = f"{type(e).__name__}: {e}"
            print("FAILED", fn.__name__, e, flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
