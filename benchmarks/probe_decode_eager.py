"""Probe (GPU): what an eager decode call costs through attntune against SDPA, and where one split wins.

Three questions behind the eager decode path (results in ``benchmarks/results/probe_decode_eager_h200.json``):

1. ``hf_call``: host µs per call of a decode step's attention through transformers' two attention
   functions — ``"sdpa"`` (``sdpa_attention_forward``) and ``"attntune"`` (:func:`attntune.hf.attention_forward`)
   — at one KV length (repeat calls: the steady state of the seven layers after a step's first), B=1/8,
   GQA 32/8, D=64, bf16. Each timed call is one Python call; the device is never waited for except every
   ``chunk`` calls (the host runs ahead as in a generate step that is host-bound).
2. ``eager_loop``: µs per step of a pure-attention decode loop (8 calls a step, the same KV length) with
   ``triton_decode`` at auto splits — the reduction fused into the split kernel (one launch) or as a second
   kernel — or one split, with and without ``kv_lens``, against SDPA default, the flash backend pinned and
   (for ``kv_lens``) SDPA with the equivalent boolean mask; B 1/8/32, KV 1k-16k, D 64/128.
3. ``new_length``: cProfile of 200 first calls at never-seen KV lengths against 200 repeat calls;
   ``new_length_parts``: the same first call piece by piece, unprofiled.

Usage: python benchmarks/probe_decode_eager.py --out probe.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

DT = torch.bfloat16
HQ, HKV = 32, 8
_SAVE = lambda: None  # noqa: E731 — main() sets it to write the results file
BATCHES = (1, 8, 32)  # eager_loop's batch sizes (--batches)


class _Mod(torch.nn.Module):
    is_causal = True
    num_key_value_groups = HQ // HKV


def _interleaved(fns: dict, warmup: int, rounds: int, calls: int, per: int, sync_after: bool = False) -> dict:
    """µs per ``calls / per`` of each function over ``rounds`` rounds, the order alternating between rounds
    (ABAB / BABA) so that a slow stretch of the host hits every function alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    out = {n: [] for n in fns}
    for r in range(rounds):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            fn = fns[n]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            if sync_after:
                torch.cuda.synchronize()
            out[n].append((time.perf_counter() - t0) / per * 1e6)
    torch.cuda.synchronize()
    return out


def hf_call(out: dict, dev: str) -> None:
    import attntune.hf
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mod = _Mod()
    res = {}
    for B in (1, 8):
        for L in (1024, 4096):
            q = torch.randn(B, HQ, 1, 64, device=dev, dtype=DT)
            k = torch.randn(B, HKV, L, 64, device=dev, dtype=DT)
            v = torch.randn_like(k)
            fns = {"sdpa": lambda: sdpa_attention_forward(mod, q, k, v, None, scaling=0.125),
                   "attntune": lambda: attntune.hf.attention_forward(mod, q, k, v, None, scaling=0.125)}
            # host µs a call: the device is waited for only between rounds (the host runs ahead)
            rounds = _interleaved(fns, warmup=50, rounds=15, calls=200, per=200)
            res[f"B{B}_L{L}"] = {n: {"host_us_median": statistics.median(x), "host_us_min": min(x)}
                                 for n, x in rounds.items()}
            print(f"hf_call B={B} L={L}: " + "  ".join(f"{n} {statistics.median(x):.1f} us" for n, x in rounds.items()),
                  flush=True)
    out["hf_call"] = res


def eager_loop(out: dict, dev: str) -> None:
    """µs a step of 8 eager decode calls: ``triton_decode`` launched from prepared launches (as the runtime's
    bound plan does) with auto splits — fused reduction (one launch) and the two-kernel path — and with one
    split, against SDPA default and the flash backend pinned; plus each Triton form's device time alone
    (one CUDA graph of 8 calls)."""
    from attntune.kernels.triton_decode import launch as L_
    from attntune.kernels.triton_decode.launch import DecodeConfig, prepare_decode

    res = out["eager_loop"] = {}
    for D in (64, 128):
        for B in BATCHES:
            for L in (1024, 4096, 16384):
                q = torch.randn(B, HQ, 1, D, device=dev, dtype=DT)
                k = torch.randn(B, HKV, L, D, device=dev, dtype=DT)
                v = torch.randn_like(k)
                o = torch.empty_like(q)
                scale = D ** -0.5

                lens = torch.full((B,), L, device=dev, dtype=torch.int32)
                mask = torch.ones(B, 1, 1, L, device=dev, dtype=torch.bool)

                def tri(cfg, fused=True, kv_lens=None):
                    L_.FUSED_REDUCE = fused
                    try:
                        lp = prepare_decode(q, k, v, kv_lens, o, False, scale, cfg)
                    finally:
                        L_.FUSED_REDUCE = True
                    return lambda: lp.launch(q, k, v, kv_lens, q.new_empty(lp.out_shape), 0)

                def sd(backend):
                    if backend is None:
                        return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

                    def f():
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    return f

                fns = {"split_fused": tri(DecodeConfig()), "split_unfused": tri(DecodeConfig(), fused=False),
                       "one_split": tri(DecodeConfig(num_splits=1)),
                       "split_fused_lens": tri(DecodeConfig(), kv_lens=lens),
                       "sdpa_default": sd(None), "sdpa_flash": sd(SDPBackend.FLASH_ATTENTION),
                       "sdpa_masked": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                             enable_gqa=True)}
                ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).float()
                err = {n: (fns[n]().float() - ref).abs().max().item() for n in ("split_fused", "split_unfused", "split_fused_lens")}
                # µs a step of 8 calls (40 steps a round), device waited for at the end of each round
                rounds = _interleaved(fns, warmup=20, rounds=7, calls=320, per=40, sync_after=True)
                # device time alone: one CUDA graph of 8 calls per impl (the GPU-bound limit)
                dev_us = {}
                for n in ("split_fused", "split_unfused", "one_split", "sdpa_flash"):
                    fns[n]()
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        for _ in range(8):
                            fns[n]()
                    g.replay()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(50):
                        g.replay()
                    torch.cuda.synchronize()
                    dev_us[n] = (time.perf_counter() - t0) / 50 * 1e6
                kvb = L * 2 * D * 2  # K+V bytes per (b, kv head) program
                rec = {n: statistics.median(x) for n, x in rounds.items()}
                rec.update({"graph_" + n: t for n, t in dev_us.items()}, kv_bytes_per_program=kvb,
                           max_abs_err_vs_sdpa=err)
                res[f"D{D}_B{B}_L{L}"] = rec
                print(f"eager D={D} B={B} L={L} ({kvb >> 10} KiB/prog): " +
                      "  ".join(f"{n} {t:.0f}" for n, t in rec.items() if isinstance(t, float)) + f" us/step err {err}",
                      flush=True)
                _SAVE()  # a timeout keeps every shape measured so far


def new_length(out: dict, dev: str) -> None:
    import attntune

    B, D, base = 2, 64, 3000
    q = torch.randn(B, HQ, 1, D, device=dev, dtype=DT)
    k = torch.randn(B, HKV, base + 600, D, device=dev, dtype=DT)
    for L in range(base - 20, base):
        attntune.attention(q, k[:, :, :L], k[:, :, :L], causal=True)
    torch.cuda.synchronize()
    first, again = cProfile.Profile(), cProfile.Profile()
    tf, ta = [], []
    for L in range(base, base + 200):
        kk = k[:, :, :L]
        first.enable()
        t0 = time.perf_counter()
        attntune.attention(q, kk, kk, causal=True)
        t1 = time.perf_counter()
        first.disable()
        again.enable()
        t2 = time.perf_counter()
        attntune.attention(q, kk, kk, causal=True)
        t3 = time.perf_counter()
        again.disable()
        tf.append((t1 - t0) * 1e6)
        ta.append((t3 - t2) * 1e6)
    torch.cuda.synchronize()

    def top(p):
        buf = io.StringIO()
        pstats.Stats(p, stream=buf).sort_stats("tottime").print_stats(22)
        return buf.getvalue()
    out["new_length"] = {"first_us_median_profiled": statistics.median(tf),
                         "repeat_us_median_profiled": statistics.median(ta),
                         "first_top": top(first), "repeat_top": top(again)}
    print(f"new_length (profiled): first {statistics.median(tf):.1f} us, repeat {statistics.median(ta):.1f} us")
    print(top(first))
    print(top(again))


def new_length_parts(out: dict, dev: str) -> None:
    """The first call at a never-seen KV length, piece by piece (unprofiled, host clock), against the
    repeat call: family signature, family reuse (problem copy, the variant's checks, bind), the bound
    call's first run (prepares its launch) and a repeat run; each with and without a device sync before
    (an idle GPU may make the first launch slower on its own)."""
    import attntune
    from attntune.policies import dispatch as D

    B, D_, base = 2, 64, 5000
    q = torch.randn(B, HQ, 1, D_, device=dev, dtype=DT)
    k = torch.randn(B, HKV, base + 2000, D_, device=dev, dtype=DT)
    for L in range(base - 20, base):
        attntune.attention(q, k[:, :, :L], k[:, :, :L], causal=True)
    res = {}
    for synced in (True, False):
        parts = {"family_sig": [], "reuse": [], "first_run": [], "repeat_run": [], "attention_first": [],
                 "attention_repeat": []}
        lo = base + (0 if synced else 900)
        for L in range(lo, lo + 400, 2):
            kk = k[:, :, :L]
            if synced:
                torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            fam = D._family_sig("attention", q, kk, kk, None, True, "bottom_right", None, None, None, False)
            t1 = time.perf_counter_ns()
            slot = D._reuse(("probe", L), fam, q, kk)
            t2 = time.perf_counter_ns()
            slot.fn(q, kk, kk, slot.problem, slot.config, None)
            t3 = time.perf_counter_ns()
            slot.fn(q, kk, kk, slot.problem, slot.config, None)
            t4 = time.perf_counter_ns()
            kk = k[:, :, :L + 1]
            if synced:
                torch.cuda.synchronize()
            t5 = time.perf_counter_ns()
            attntune.attention(q, kk, kk, causal=True)
            t6 = time.perf_counter_ns()
            attntune.attention(q, kk, kk, causal=True)
            t7 = time.perf_counter_ns()
            for name, a, b in (("family_sig", t0, t1), ("reuse", t1, t2), ("first_run", t2, t3),
                               ("repeat_run", t3, t4), ("attention_first", t5, t6), ("attention_repeat", t6, t7)):
                parts[name].append((b - a) / 1e3)
        res["synced" if synced else "busy"] = {n: statistics.median(x) for n, x in parts.items()}
        print(f"new_length_parts ({'synced' if synced else 'busy'}): " +
              "  ".join(f"{n} {statistics.median(x):.1f}" for n, x in parts.items()) + " us", flush=True)
    out["new_length_parts"] = res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="hf_call,eager_loop,new_length,new_length_parts")
    ap.add_argument("--batches", default="1,8,32", help="eager_loop's batch sizes")
    a = ap.parse_args()
    global BATCHES, _SAVE
    BATCHES = tuple(int(x) for x in a.batches.split(","))
    out = {"environment": environment()}
    _SAVE = lambda: Path(a.out).write_text(json.dumps(out, indent=1))  # noqa: E731
    for part in a.parts.split(","):
        globals()[part](out, "cuda")
        _SAVE()


if __name__ == "__main__":
    main()
