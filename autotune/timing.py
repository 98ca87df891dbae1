"""Timing one (variant, config) on a key's inputs: median milliseconds.

GPU: CUDA events around each call, median, L2 flushed before every rep, gradients reset for
forward+backward — ``triton.testing.do_bench``'s method, with one change: before each rep the device is
held back (``torch.cuda._sleep``) for longer than the host takes to enqueue the call, so the events time
the device's work alone. Without it a call whose host launch outlasts the flush (a Triton launch from a
slow process, a backward's many launches) is billed for the host's gaps: one chunked-prefill key was
stored at 75.6 µs and re-timed at 144.4 µs in another process of the same H200 (regret_h200_partial.json).
CPU: ``time.perf_counter`` around each call, a few warm-up calls, median of
repeated calls — of the undisturbed calls only, where Linux says how long this process's threads waited
for a CPU (:mod:`attntune.autotune.cpuwait`): a call during which they waited more than
:data:`WAIT_SHARE` of its wall time holds another process's work and is set aside, and the timer keeps
calling until it has enough undisturbed ones (within a bounded budget). When the CPU stays too busy for
that, the measurement is the median of every call and says so (:attr:`Timer.last_contention`): the
confirmation then counts the contention as noise, and the stored row as measured on a busy CPU.
Both run the call exactly as the runtime does (``variant.run``); the gate has already run it
once, so compilation (Triton JIT) never lands in a measurement.

Early stop: :meth:`Timer.cheap` is a quick first measurement; the sweep drops a config whose cheap time
is already more than ``PRUNE_RATIO`` times the best full time of the key (recorded as ``pruned``).

Decode keys (GPU, forward only, ``seqlen_q <= 16``) are ranked by device time under CUDA graphs, as
serving frameworks capture decode: an eager measurement of a ~10 µs kernel is mostly Python and driver
launch cost on the host (H200 VM: 30-90 µs), which would rank configs by how few launches they make
rather than by what the GPU does. Each replayed call is preceded by an L2 flush inside the graph, and
the flush's own time (a flush-only graph) is subtracted, so K/V come from device memory as in serving.
A variant that cannot be captured (host synchronisation inside) falls back to eager events. A timer
captures a call once (its cheap timing, full timing and confirmation rounds replay that graph), and the
flush-only graph is captured once per device.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from attntune.autotune import cpuwait
from attntune.kernels.base import Config, Variant

PRUNE_RATIO = 1.5
#: the CPU timer's default clock (seconds); a module global so that tests can inject a noisy one
CLOCK = time.perf_counter
#: seconds this process's threads have waited for a CPU so far, or None (unknown); injectable as CLOCK
WAITED = cpuwait.total_s
#: a timed CPU call is disturbed when our threads waited for a CPU longer than this share of its wall
#: time (and than WAIT_FLOOR_S: waking an intra-op worker on an idle core takes a few µs)
WAIT_SHARE = 0.05
WAIT_FLOOR_S = 10e-6
#: fewer undisturbed calls than this (or than the measurement's minimum) and a measurement is contended
MIN_CLEAN = 3
#: how long past its target a CPU measurement keeps calling for undisturbed calls (at least)
CONTENDED_EXTRA_S = 0.05
# Larger than any GPU's L2 (H200: 60 MB; MI300X: 256 MB of Infinity Cache).
L2_FLUSH_BYTES = 256 << 20


@dataclass(frozen=True)
class TimingOptions:
    """Budgets of one measurement. GPU values are warm-up and repetition wall times in milliseconds (as
    do_bench's); CPU values are
    warm-up calls, call counts and a target wall time."""

    gpu_warmup_ms: float = 10.0
    gpu_rep_ms: float = 60.0
    gpu_cheap_reps: int = 3
    cpu_warmup: int = 2
    cpu_min_reps: int = 5
    cpu_max_reps: int = 50
    cpu_target_s: float = 0.15
    cpu_cheap_reps: int = 3

    @classmethod
    def quick(cls) -> "TimingOptions":
        """Few repetitions: smoke tests and CI, where ranking precision does not matter."""
        return cls(
            gpu_warmup_ms=2.0,
            gpu_rep_ms=10.0,
            gpu_cheap_reps=2,
            cpu_warmup=1,
            cpu_min_reps=3,
            cpu_max_reps=10,
            cpu_target_s=0.02,
            cpu_cheap_reps=2,
        )


def make_call(variant: Variant, config: Config, inp, grads: bool) -> tuple[Callable[[], None], list]:
    """The function to time and the tensors whose ``.grad`` the timer resets between reps.

    Forward: the variant's bound call (:meth:`~attntune.kernels.base.Variant.bind`: what the runtime
    calls) under no_grad. Forward+backward: run, then ``backward`` with the key's fixed ``dout``
    [B, Hq, Sq, Dv] (the gradient of a typical loss; its values do not change the cost). With ``kv_lens``
    the call uses the key's seed-free timing lengths (:func:`~attntune.autotune.gate.timing_kv_lens`), not
    the gate's random draw."""
    p = inp.problem
    kv_lens = inp.timing_kv_lens if p.kv_lens else None
    q, k, v = inp.leaves()
    if not grads:
        run = variant.bind(p, config)  # what the runtime keeps per call signature and calls

        scales = getattr(inp, "scales", ())  # FP8 K/V keys: (k_scale, v_scale)

        def fwd() -> None:
            with torch.no_grad():
                run(q, k, v, p, config, kv_lens, *scales)

        return fwd, []
    dout = inp.dout

    def fwd_bwd() -> None:
        for t in (q, k, v):
            t.grad = None
        variant.run(q, k, v, p, config, kv_lens).backward(dout)

    return fwd_bwd, [q, k, v]


#: the device hold before each timed call: this many times the call's host enqueue time, plus HOLD_MIN_S
#: (the host's jitter: an allocation, a GC pause), at most HOLD_MAX_S (a call that synchronises inside has
#: an enqueue time of its whole run: no hold can cover it, and its events time the device alone anyway)
HOLD_FACTOR, HOLD_MIN_S, HOLD_MAX_S = 2.0, 50e-6, 5e-3
_SLEEP_CYCLES_PER_S: dict = {}


def hold_cycles(device: torch.device, host_s: float) -> int:
    """``torch.cuda._sleep`` cycles that keep ``device`` busy for about ``HOLD_FACTOR * host_s +
    HOLD_MIN_S`` seconds (capped at HOLD_MAX_S). The spin's rate is measured once per device (clock
    cycles per second; the SM clock varies by GPU and boost state, and an over-long hold only costs time)."""
    rate = _SLEEP_CYCLES_PER_S.get(device)
    if rate is None:
        n = 1 << 20
        torch.cuda._sleep(n)  # first call: module load
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(n)
        b.record()
        b.synchronize()
        rate = _SLEEP_CYCLES_PER_S.setdefault(device, n / max(a.elapsed_time(b) * 1e-3, 1e-6))
    return int(rate * min(HOLD_MAX_S, HOLD_FACTOR * host_s + HOLD_MIN_S))


GRAPH_FLUSH_BYTES = 64 << 20  # > H200's 60 MB L2; small enough that subtracting it stays precise
GRAPH_CALLS = 20  # calls per captured graph
GRAPH_REPLAYS = 15
GRAPH_KEEP = 4  # captured graphs a timer keeps: a confirmation interleaves CONFIRM_TOP (3) configs and the baseline
#: per device index: the flush buffer and its flush-only graph, captured once per process (they do not depend on
#: the call timed; 64 MB kept for the tuning process's life)
_FLUSH_GRAPHS: dict = {}


def _flush_graph(device: torch.device):
    """``(flush, graph)``: the GRAPH_FLUSH_BYTES buffer every graph-timed call flushes L2 with, and a graph of
    GRAPH_CALLS flushes alone (the part :meth:`Timer._gpu_graph` subtracts)."""
    index = device.index if device.index is not None else torch.cuda.current_device()  # cuda == cuda:N
    hit = _FLUSH_GRAPHS.get(index)
    if hit is None:
        flush = torch.empty(GRAPH_FLUSH_BYTES, dtype=torch.int8, device=device)
        flush.zero_()
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                flush.zero_()
        hit = _FLUSH_GRAPHS.setdefault(index, (flush, graph))
    return hit


def graph_timed(problem) -> bool:
    """Whether a key is ranked under CUDA graphs (see module docstring): GPU decode, forward only."""
    return problem.device_type == "cuda" and problem.mode == "fwd" and problem.seqlen_q <= 16


class Timer:
    """Measures calls on one device. Created once per key by the sweep; ``graphs`` selects CUDA-graph
    timing (decode keys, :func:`graph_timed`)."""

    def __init__(self, device: torch.device, options: Optional[TimingOptions] = None, graphs: bool = False,
                 clock: Optional[Callable[[], float]] = None,
                 waited: Optional[Callable[[], Optional[float]]] = None):
        self.device = device
        self.opt = options or TimingOptions()
        self.graphs = graphs and device.type == "cuda"
        self.clock = clock or CLOCK  # the CPU path's clock (seconds)
        self.waited = waited or WAITED  # the CPU path's run-queue delay (seconds so far)
        #: CPU: the share of the last measurement's wall time our threads waited for a CPU when it had too
        #: few undisturbed calls (0.0 when it had enough; None when the delay is unknown or not a CPU)
        self.last_contention: Optional[float] = None
        #: the largest :attr:`last_contention` of this timer's measurements (None: never known)
        self.contention: Optional[float] = None
        #: graph timing: id(fn) -> (fn, its captured graph or None), :meth:`_work_graph`
        self._graphs: Dict[int, Tuple[Callable[[], None], Optional["torch.cuda.CUDAGraph"]]] = {}

    def round(self, fn: Callable[[], None], grad_to_none: list, rounds: int) -> float:
        """One round of a confirmation (:mod:`attntune.autotune.confirm`): a ``1/rounds`` share of a full
        measurement, so that ``rounds`` rounds cost about one :meth:`full`."""
        if self.graphs:
            return self._gpu_graph(fn, replays=max(3, GRAPH_REPLAYS // rounds))
        if self.device.type == "cuda":
            o = self.opt
            return self._gpu(fn, grad_to_none, warmup=o.gpu_warmup_ms / rounds, rep=max(1.0, o.gpu_rep_ms / rounds))
        o = self.opt
        return self._cpu(fn, warmup=1, min_reps=max(3, o.cpu_min_reps), max_reps=max(3, o.cpu_max_reps // rounds),
                         target_s=o.cpu_target_s / rounds)

    def cheap(self, fn: Callable[[], None], grad_to_none: list) -> float:
        """A quick estimate (ms) for early stopping: a handful of calls (the gate already warmed the call
        up). Not do_bench: its runtime estimate alone costs 6 calls, seconds for a slow eager variant."""
        if self.graphs:
            return self._gpu_graph(fn, replays=3)
        if self.device.type == "cuda":
            return self._gpu_events(fn, grad_to_none, reps=self.opt.gpu_cheap_reps)
        return self._cpu(
            fn, warmup=1, min_reps=self.opt.cpu_cheap_reps, max_reps=self.opt.cpu_cheap_reps, target_s=0.0
        )

    def full(self, fn: Callable[[], None], grad_to_none: list) -> float:
        """The recorded measurement (ms): median over many calls."""
        if self.graphs:
            return self._gpu_graph(fn, replays=GRAPH_REPLAYS)
        if self.device.type == "cuda":
            return self._gpu(fn, grad_to_none, warmup=self.opt.gpu_warmup_ms, rep=self.opt.gpu_rep_ms)
        o = self.opt
        return self._cpu(
            fn, warmup=o.cpu_warmup, min_reps=o.cpu_min_reps, max_reps=o.cpu_max_reps, target_s=o.cpu_target_s
        )

    def _gpu(self, fn, grad_to_none, warmup: float, rep: float) -> float:
        """do_bench's budget (``warmup`` and ``rep`` in ms of wall time) spent on :meth:`_gpu_events`."""
        dev = self.device
        # Finish whatever the gate or the previous trial left queued, so it is not billed to this one.
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        self._gpu_events(fn, grad_to_none, reps=3)
        per_rep_ms = (time.perf_counter() - t0) * 1e3 / 3  # wall per rep: flush, hold and call included
        for _ in range(min(1000, int(warmup / max(per_rep_ms, 1e-3)))):
            fn()
        reps = max(5, min(1000, int(rep / max(per_rep_ms, 1e-3))))
        return self._gpu_events(fn, grad_to_none, reps=reps)

    def _gpu_graph(self, fn, replays: int) -> float:
        """Median per-call device time (ms) of ``fn`` captured GRAPH_CALLS times in one CUDA graph, each
        call after an L2 flush, minus the flush alone. Falls back to eager events if capture fails.

        The timer keeps what it captured (:meth:`_work_graph`, :func:`_flush_graph`): the cheap timing,
        the full one and a confirmation's rounds of the same call replay one capture instead of capturing
        anew. Each capture empties the allocator's cache (``torch.cuda.graph``) and costs a warm-up, a
        capture and an instantiation — host time a decode key paid four times per config before."""
        dev = self.device
        torch.cuda.synchronize(dev)
        with torch.cuda.device(dev):
            try:
                flush, flush_only = _flush_graph(dev)
                work = self._work_graph(fn, flush)
            except Exception:  # noqa: BLE001 — not capturable: measure eagerly instead
                work = None
            if work is None:
                torch.cuda.synchronize(dev)
                return self._gpu_events(fn, [], reps=max(3, self.opt.gpu_cheap_reps))

            def per_replay(g) -> List[float]:
                g.replay()  # warm: the first replay of a graph uploads it; later ones warm the caches
                out = []
                for _ in range(replays):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    g.replay()
                    b.record()
                    b.synchronize()
                    out.append(a.elapsed_time(b))
                return out

            total = statistics.median(per_replay(work))
            base = statistics.median(per_replay(flush_only))
        return max(total - base, 1e-6) / GRAPH_CALLS

    def _work_graph(self, fn, flush: torch.Tensor):
        """The CUDA graph of GRAPH_CALLS ``(flush, fn)`` pairs, captured on the first call for ``fn`` and
        kept for this timer's later calls with the same ``fn`` (up to GRAPH_KEEP of them, oldest dropped
        first); None when ``fn`` cannot be captured (remembered too: a second attempt would fail again)."""
        key = id(fn)
        hit = self._graphs.get(key)
        if hit is not None and hit[0] is fn:  # the function itself is kept, so its id is never reused
            return hit[1]
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture stream, as torch requires
                for _ in range(2):
                    flush.zero_()
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            work = torch.cuda.CUDAGraph()
            with torch.cuda.graph(work):
                for _ in range(GRAPH_CALLS):
                    flush.zero_()
                    fn()
        except Exception:  # noqa: BLE001 — host synchronisation inside, an unsupported op, ...
            work = None
        while len(self._graphs) >= GRAPH_KEEP:
            self._graphs.pop(next(iter(self._graphs)))
        self._graphs[key] = (fn, work)
        return work

    def _gpu_events(self, fn, grad_to_none, reps: int) -> float:
        """Median device ms of ``reps`` calls, each timed by events after an L2 flush (as do_bench does: K/V
        come from device memory) and a hold (:func:`hold_cycles`) long enough that the host has enqueued
        the whole call before the device reaches the start event."""
        dev = self.device
        torch.cuda.synchronize(dev)
        with torch.cuda.device(dev):
            flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=dev)
            t0 = time.perf_counter()
            fn()  # its enqueue time (no sync): the host work the hold must cover
            cycles = hold_cycles(dev, time.perf_counter() - t0)
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            for i in range(reps):
                for t in grad_to_none:
                    t.grad = None
                flush.zero_()
                torch.cuda._sleep(cycles)
                starts[i].record()
                fn()
                ends[i].record()
            torch.cuda.synchronize(dev)
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))

    def _cpu(self, fn, warmup: int, min_reps: int, max_reps: int, target_s: float) -> float:
        """Median ms of the undisturbed calls (module docstring): at least ``min_reps`` of them and until
        ``max_reps`` calls or ``target_s`` — as many calls as before on a quiet machine. Disturbed calls
        are retried up to ``2 * max_reps`` calls or :data:`CONTENDED_EXTRA_S` (at least ``target_s``) past
        the target; short of :data:`MIN_CLEAN` undisturbed calls, the median of all and a contention."""
        clock, waited = self.clock, self.waited
        for _ in range(warmup):
            fn()
        times: List[float] = []
        clean: List[float] = []
        lost = 0.0  # seconds waited for a CPU, over every timed call
        known = True
        deadline = clock() + target_s
        give_up = deadline + max(target_s, CONTENDED_EXTRA_S)
        while True:
            n, now = len(times), clock()
            if len(clean) >= min_reps and (n >= max_reps or now >= deadline):
                break  # enough undisturbed calls: exactly the old rule on a quiet machine
            if n >= 2 * max_reps or (n >= min_reps and now >= give_up):
                break  # the CPU stays busy
            w0 = waited() if known else None
            t0 = clock()
            fn()
            dt = clock() - t0
            w1 = waited() if known else None
            times.append(dt * 1e3)
            if w0 is None or w1 is None:
                known = False
                clean.append(dt * 1e3)
                continue
            w = max(0.0, w1 - w0)
            lost += w
            if w <= max(WAIT_SHARE * dt, WAIT_FLOOR_S):
                clean.append(dt * 1e3)
        if not known:
            self.last_contention = None
            return statistics.median(times)
        if len(clean) >= min(MIN_CLEAN, min_reps):
            self.last_contention = 0.0
            ms = statistics.median(clean)
        else:
            wall = sum(times) / 1e3
            self.last_contention = round(min(1.0, lost / wall), 6) if wall > 0 else 0.0
            ms = statistics.median(times)
        self.contention = max(self.contention or 0.0, self.last_contention)
        return ms
