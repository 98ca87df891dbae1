"""Probe (GPU, sm_90+): what programmatic dependent launch (PDL) saves at the boundary of a split-K pair of kernels
under CUDA graphs — the question behind #15's B1 decode target (B1 KV8192 FP8 at 11.8 µs on the H200 against
<= 9: about 16.8 MB to read, ~4 µs at the H200's bandwidth; the rest is fixed cost, two launches among it).

The decode op runs a split kernel (many programs, each streaming a slice of the cache into a partial) and a
reduce kernel (reading the partials). In a CUDA graph the reduce kernel starts only after the split kernel's last
program has ended and its writes are flushed; its launch and ramp-up sit on the critical path. With PDL the split
kernel signals ``griddepcontrol.launch_dependents`` as it starts, the reduce kernel is launched with
``launch_pdl=True`` and runs ``griddepcontrol.wait`` before reading: its launch overlaps the split kernel, the
wait keeps the result exact. Triton 3.6 has both (``triton.language.extra.cuda.gdc_*``, the ``launch_pdl``
launch option).

This probe times stand-ins for the pair, not the decode kernels: ``stream`` — P programs each summing a slice of
an int32 buffer into one partial (16-byte loads, software-pipelined: bandwidth-bound like the decode loop), and
``reduce`` — one program summing the P partials. Each buffer rotates over ``--rotate`` copies so that the reads
come from HBM, as a decode step's do (the other layers' caches evict L2). Modes, each a CUDA graph of ``--pairs``
launches, timed with CUDA events, rounds interleaved (a drift reaches every mode):

* ``stream``: the stream kernel alone (the floor);
* ``pair``: stream then reduce, plain launches;
* ``pair_pdl``: stream then reduce with PDL.

Per size: median µs per pair over the rounds, the spread (max/min - 1 over rounds), and ``pdl_saves_us`` =
pair - pair_pdl. Every mode's last output is checked against torch's sum (the wait must hold).

Usage: python benchmarks/probe_pdl.py --out $OUT/probe_pdl.json   (~20 s on an H100)
       python benchmarks/probe_pdl.py --ptx                        (CPU: compile both kernels for sm_90, count
                                                                    the griddepcontrol instructions)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env import environment  # noqa: E402

#: (MB read per pair, programs of the stream kernel): B1 KV8192 D128 Hkv8 FP8 K+V is 16.8 MB over 8 heads x 16
#: splits; KV2048 is a quarter of it; a short cache
SIZES = ((16, 128), (4, 128), (1, 64))
MODES = ("stream", "pair", "pair_pdl")
BLOCK = 1024  # int32 words per load step: 4 KB a program, 16 bytes a thread at 8 warps


@triton.jit
def stream_kernel(X, WS, words_per_prog, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``WS[pid] = sum(X[pid * words_per_prog : (pid + 1) * words_per_prog])`` (int32 words as float32)."""
    pid = tl.program_id(0)
    if PDL:  # the dependent grid may launch now; its wait still orders it after this grid's end
        gdc_launch_dependents()
    base = X + pid.to(tl.int64) * words_per_prog
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.range(0, words_per_prog, BLOCK, num_stages=3):
        acc += tl.load(base + i + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(WS + pid, tl.sum(acc, 0))


@triton.jit
def reduce_kernel(WS, OUT, P, BLOCK_P: tl.constexpr, PDL: tl.constexpr):
    """``OUT[0] = sum(WS[:P])``."""
    if PDL:  # every write of the stream kernel is visible after this
        gdc_wait()
    offs = tl.arange(0, BLOCK_P)
    tl.store(OUT, tl.sum(tl.load(WS + offs, mask=offs < P, other=0.0), 0))


def _launch(mode: str, x: torch.Tensor, ws: torch.Tensor, out: torch.Tensor, progs: int) -> None:
    pdl = mode == "pair_pdl"
    stream_kernel[(progs,)](x, ws, x.numel() // progs, BLOCK=BLOCK, PDL=pdl, num_warps=8)
    if mode != "stream":
        reduce_kernel[(1,)](ws, out, progs, BLOCK_P=triton.next_power_of_2(progs), PDL=pdl, num_warps=4,
                            launch_pdl=pdl)


def _graph(mode: str, bufs, ws, out, progs: int, pairs: int) -> torch.cuda.CUDAGraph:
    for x in bufs:  # compile and warm outside the capture
        _launch(mode, x, ws, out, progs)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(pairs):
            _launch(mode, bufs[i % len(bufs)], ws, out, progs)
    return g


def measure(mb: int, progs: int, pairs: int, rounds: int, rotate: int) -> dict:
    words = mb * (1 << 20) // 4
    words -= words % (progs * BLOCK)
    bufs = [torch.randint(-8, 8, (words,), dtype=torch.int32, device="cuda") for _ in range(rotate)]
    ws = torch.empty(progs, dtype=torch.float32, device="cuda")
    out = torch.zeros(1, dtype=torch.float32, device="cuda")
    graphs = {m: _graph(m, bufs, ws, out, progs, pairs) for m in MODES}
    times = {m: [] for m in MODES}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        for m in MODES:
            graphs[m].replay()  # warm
            start.record()
            graphs[m].replay()
            end.record()
            end.synchronize()
            times[m].append(start.elapsed_time(end) * 1e3 / pairs)
    # the last pair of each graph read bufs[(pairs - 1) % rotate]: the reduce must have seen every partial
    want = bufs[(pairs - 1) % rotate].double().sum().item()
    checks = {}
    for m in ("pair", "pair_pdl"):
        out.zero_()
        graphs[m].replay()
        torch.cuda.synchronize()
        checks[m] = out.item() == want
    med = {m: statistics.median(v) for m, v in times.items()}
    return {"mb": mb, "programs": progs, "bytes": words * 4, "us": med,
            "spread": {m: max(v) / min(v) - 1 for m, v in times.items()},
            "rounds_us": times, "pdl_saves_us": med["pair"] - med["pair_pdl"],
            "reduce_adds_us": med["pair"] - med["stream"], "reduce_adds_us_pdl": med["pair_pdl"] - med["stream"],
            "stream_tbps": words * 4 / med["stream"] / 1e6, "exact": checks}


def ptx_counts(arch: int = 90) -> dict:
    """Compile both kernels for ``sm_{arch}`` (no GPU needed) and count the grid-dependency instructions."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    out = {}
    for pdl in (False, True):
        s = triton.compile(ASTSource(stream_kernel, {"X": "*i32", "WS": "*fp32", "words_per_prog": "i32",
                                                     "BLOCK": "constexpr", "PDL": "constexpr"},
                                     {"BLOCK": BLOCK, "PDL": pdl}), target=target)
        r = triton.compile(ASTSource(reduce_kernel, {"WS": "*fp32", "OUT": "*fp32", "P": "i32",
                                                     "BLOCK_P": "constexpr", "PDL": "constexpr"},
                                     {"BLOCK_P": 128, "PDL": pdl}), target=target)
        out[f"pdl={int(pdl)}"] = {
            "stream_launch_dependents": s.asm["ptx"].count("griddepcontrol.launch_dependents"),
            "reduce_wait": r.asm["ptx"].count("griddepcontrol.wait")}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--pairs", type=int, default=50, help="launch pairs per CUDA graph")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--rotate", type=int, default=8, help="buffers read in turn (HBM, not L2: 8 x 16 MB > 50 MB)")
    ap.add_argument("--ptx", action="store_true", help="compile for sm_90 and count griddepcontrol (CPU)")
    args = ap.parse_args(argv)
    if args.ptx:
        if os.environ.get("TRITON_INTERPRET") == "1":
            # this process's kernels are the interpreter's (nothing to compile): compile in a clean child
            env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
            r = subprocess.run([sys.executable, __file__, "--ptx"], env=env, capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"compiling failed:\n{r.stderr[-3000:]}")
            print(r.stdout, end="")
            return
        print(json.dumps(ptx_counts(), indent=1))
        return
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (sm_90+); --ptx compiles without one")
    cases = []
    for mb, progs in SIZES:
        c = measure(mb, progs, args.pairs, args.rounds, args.rotate)
        cases.append(c)
        print(f"{mb:3d} MB x{progs:4d}: stream {c['us']['stream']:7.2f} µs ({c['stream_tbps']:.2f} TB/s)  pair "
              f"{c['us']['pair']:7.2f}  pair_pdl {c['us']['pair_pdl']:7.2f}  PDL saves {c['pdl_saves_us']:5.2f} µs  "
              f"exact {c['exact']}", flush=True)
    doc = {"benchmark": "probe_pdl", "environment": environment(), "args": vars(args), "cases": cases}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
