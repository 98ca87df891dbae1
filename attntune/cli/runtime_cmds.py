"""Runtime commands: ``attntune explain`` (the plan a call gets, and why) and ``attntune bench``
(latency through dispatch; ``--stress`` for sustained load with P50/P95/P99 and peak memory)."""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from attntune.cli import app
from attntune.cli.common import console, fmt_config
from attntune.cli.common import parse_device as _device
from attntune.cli.tune_cmd import SHAPE_HELP


def _problems(shapes: List[str], dev, dtype: Optional[str], mode: Optional[str] = None):
    from attntune.autotune.shapes import ShapeSpecError, parse_shape
    from attntune.problem import DTYPES

    if dtype is not None and dtype not in DTYPES:
        raise typer.BadParameter(f"expected one of {sorted(DTYPES)}", param_hint="--dtype")
    default = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    out = []
    for spec in shapes:
        try:
            out.append(parse_shape(spec, device_type=dev.type, dtype=default, mode=mode))
        except ShapeSpecError as e:
            raise typer.BadParameter(f"{spec!r}: {e}", param_hint="--shape") from None
    return out


@app.command()
def explain(
    shape: List[str] = typer.Option(..., "--shape", help=SHAPE_HELP),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="float32, float16, bfloat16 (default: float32 on "
                                        "the CPU, bfloat16 on a GPU) unless the shape sets dtype=."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: cuda if available)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="fwd or fwd_bwd (default fwd) unless the shape sets it."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Which implementation a call with this shape gets, and why.

    The plan under the current policy, where the decision came from (tuned / nearest / heuristic /
    fixed / fallback), expected time, runner-up, why — and every variant with the reasons it cannot run
    the problem. Uses the caches and ATTNTUNE_* switches as a program would; records nothing."""
    from attntune.policies import runtime
    from attntune.policies.policy import candidates_table

    if mode is not None and mode not in ("fwd", "fwd_bwd"):
        raise typer.BadParameter("expected fwd or fwd_bwd", param_hint="--mode")
    dev = _device(device)
    rt = runtime.get()
    reports = []
    for problem in _problems(shape, dev, dtype, mode):
        plan = rt.plan_for(problem, dev, dry=True)
        reports.append((plan, candidates_table(problem)))
    if as_json:
        print(json.dumps([dict(plan.to_dict(), policy=rt.config.policy_label, candidates=cands)
                          for plan, cands in reports], indent=2, default=str))
        return
    for plan, cands in reports:
        console.print(f"[bold]policy[/bold]    {rt.config.policy_label}")
        console.print(plan.describe(), markup=False, highlight=False)
        t = Table(title="candidates")
        for c in ("variant", "family", "exact", "can run", "why not"):
            t.add_column(c, overflow="fold")
        for c in cands:
            t.add_row(escape(c["variant"]), c["family"], "yes" if c["exact"] else "no",
                      "[green]yes[/green]" if not c["reasons"] else "[red]no[/red]",
                      escape("; ".join(c["reasons"])))
        console.print(t)


def _peak_rss_mb() -> float:
    # ru_maxrss is KiB on Linux (bytes on macOS): the process's peak resident set so far.
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024 / (1024 if sys.platform == "darwin" else 1)


@app.command()
def bench(
    shape: Optional[List[str]] = typer.Option(None, "--shape", help=SHAPE_HELP + " Repeatable: --stress "
                                              "cycles through the shapes."),
    stress: bool = typer.Option(False, "--stress", help="Sustained load through dispatch for --seconds."),
    seconds: float = typer.Option(10.0, "--seconds", min=0.1, help="Duration of --stress."),
    iters: int = typer.Option(200, "--iters", min=1, help="Calls per shape without --stress."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Default dtype of the shapes."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: cuda if available)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Latency of attention calls through attntune's dispatch: P50/P95/P99, peak memory.

    Peak memory: on a GPU, device memory allocated by torch; on the CPU, the process's peak RSS.
    Without --stress: --iters calls per shape; with --stress: calls cycle through the shapes for
    --seconds. GPU latencies are CUDA-event times of each call; CPU latencies are host times."""
    import torch

    import attntune
    from attntune.policies.telemetry import percentile

    dev = _device(device)
    specs = shape or (["b=1,hq=32,hkv=8,sq=1,skv=4096,d=128,kv_lens=1", "b=4,hq=16,sq=1024,d=64,causal=1"]
                      if dev.type == "cuda" else ["b=1,hq=8,hkv=2,sq=1,skv=512,d=64", "b=2,hq=4,sq=128,d=64,causal=1"])
    problems = _problems(specs, dev, dtype)
    gen = torch.Generator(device="cpu").manual_seed(0)
    inputs = []
    for p in problems:
        def rnd(*s, p=p):
            return torch.randn(*s, generator=gen).to(device=dev, dtype=p.torch_dtype)
        q = rnd(p.batch, p.heads_q, p.seqlen_q, p.head_dim)
        k = rnd(p.batch, p.heads_kv, p.seqlen_kv, p.head_dim)
        v = rnd(p.batch, p.heads_kv, p.seqlen_kv, p.head_dim_v)
        lens = (torch.randint(max(1, p.seqlen_kv // 2), p.seqlen_kv + 1, (p.batch,), generator=gen).to(dev)
                if p.kv_lens else None)
        kw = dict(causal=p.causal, window=p.window, kv_lens=lens, approx=p.approx, scale=p.scale)
        inputs.append((p, q, k, v, kw))
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    lat = {i: [] for i in range(len(inputs))}
    with torch.no_grad():
        for _, q, k, v, kw in inputs:  # warm-up: plans resolved, kernels compiled
            for _ in range(3):
                attntune.attention(q, k, v, **kw)
        if cuda:
            torch.cuda.synchronize(dev)
        pending = []
        t_end = time.perf_counter() + seconds
        n = 0
        while (time.perf_counter() < t_end) if stress else (n < iters * len(inputs)):
            i = n % len(inputs)
            _, q, k, v, kw = inputs[i]
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                attntune.attention(q, k, v, **kw)
                e.record()
                pending.append((i, s, e))
                if len(pending) >= 256:  # read events in batches: no per-call synchronisation
                    pending[-1][2].synchronize()
                    lat_extend(lat, pending)
                    pending = []
            else:
                t0 = time.perf_counter()
                attntune.attention(q, k, v, **kw)
                lat[i].append((time.perf_counter() - t0) * 1e3)
            n += 1
        if pending:
            pending[-1][2].synchronize()
            lat_extend(lat, pending)
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else _peak_rss_mb()
    rows = []
    for i, (p, q, k, v, kw) in enumerate(inputs):
        s = sorted(lat[i])
        plan = attntune.explain(q, k, v, **kw)
        rows.append({"problem": p.short(), "variant": plan.variant, "config": plan.config, "source": plan.source,
                     "calls": len(s), "p50_ms": percentile(s, 50), "p95_ms": percentile(s, 95),
                     "p99_ms": percentile(s, 99)})
    result = {"device": str(dev), "stress": stress, "seconds": seconds if stress else None, "calls": n,
              "peak_memory_mb": peak, "peak_memory_kind": "torch.cuda.max_memory_allocated" if cuda else "peak RSS",
              "shapes": rows}
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    t = Table(title=f"attntune bench{' --stress' if stress else ''} on {dev} ({n} calls)")
    for c in ("problem", "variant", "config", "source", "calls", "P50", "P95", "P99"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(escape(r["problem"]), escape(r["variant"]), escape(fmt_config(r["config"])), r["source"],
                  str(r["calls"]),
                  *(f"{r[x]:.4f} ms" if r[x] is not None else "-" for x in ("p50_ms", "p95_ms", "p99_ms")))
    console.print(t)
    console.print(f"peak memory: {peak:.1f} MiB ({result['peak_memory_kind']})")


def lat_extend(lat, pending) -> None:
    for i, s, e in pending:
        lat[i].append(s.elapsed_time(e))
