"""Compile a known list of (problem, variant, config) candidates ahead, in parallel worker processes, so that
the process that times them finds every kernel in the on-disk compile caches.

Why: a cold ``attntune tune`` spends ~55 % of its time compiling (``bench_tune_time.py``: 0.75 s a trial
cold against 0.25 s warm; a new forward+backward config 1.2-4.7 s), and ``regret.py``'s reference search
compiled its configs one by one in the timing process, so within one GPU call it measured only 2-11 of a
key's ~55 listed configs and left the rest unmeasured (H100, 2026-12-06: 15 of 16 keys cut short). The
reference grid is known before it is measured (unlike the tuner's next trial, which depends on the last
measurement — why compile-ahead batches did not pay inside the tuner), so it can be compiled in parallel.

How: each worker (spawned, so it has its own CUDA context) runs the candidate once through the gate
(:func:`attntune.autotune.gate.check`) and once through the timed call (:func:`make_call`), on inputs of
the same shapes, dtypes and alignments as the timing process's: Triton writes the compiled kernels to its
cache directory (``TRITON_CACHE_DIR``, default ``~/.triton/cache``) and inductor (FlexAttention) to its FX
graph and kernel caches, both shared by every process of the user. Only variants of families that compile
(:data:`COMPILED_FAMILIES`) are sent. The timing process does not read anything the workers return except
counts: a failed or missing precompile only costs it the compile it would have done anyway.

Interference: the workers run kernels on the GPU, so :meth:`Precompiler.compile` returns only when no
task runs: when its deadline passes it cancels the tasks not yet started and waits for the running ones
(terminating the pool if they outlast :attr:`Precompiler.DRAIN_S`). The pool lives across calls: its start
(imports, a CUDA context per worker) is paid once. A first version terminated it at every deadline and
restarted it for the next key: in a 120 s regret run (shares of 1-3 s) no task ever ran.

Memory: each running task holds its key's inputs and reference (:func:`attntune.autotune.gate.prepare`: a
B32 x 8192 decode task peaked at 21 GiB). Twelve workers running B32 decode tasks at once ran the H100 out of
memory (2026-12-07: 31 of 33 tasks failed, and one reference config of the timing process after them), so
:meth:`Precompiler.compile` runs at most :func:`parallel_limit` tasks of a problem at once — what fits in
``MEMORY_SHARE`` of the device's free memory at the peak a task of that problem was measured to allocate, or,
before one was, at an estimate (:func:`footprint_estimate`; one task first where the estimate already limits) —
and a worker drops inputs larger than ``KEEP_INPUTS_BYTES`` after each task instead of holding them while idle
(the timing process needs that memory once ``compile`` returns).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

#: this module's folder: spawned workers unpickle their functions as ``precompile._task``, so they import this
#: module by name from the sys.path they inherit (:meth:`Precompiler.start` puts it there)
_HERE = str(Path(__file__).resolve().parent)

#: variant families whose first call compiles (Triton kernels; FlexAttention through inductor)
COMPILED_FAMILIES = ("triton", "flex")

Task = Tuple[object, str, dict]  # (AttentionProblem, variant name, config)

_worker_device = None
_worker_error: Optional[str] = None  # why this worker could not start: each of its tasks fails with it
_worker_inputs: Optional[tuple] = None  # (problem, GateInputs) of the last task's problem
_worker_cancel = None  # the pool's cancel event: set, a task not yet started returns at once


def default_workers() -> int:
    """Worker processes on this host: the cores less two (the timing process and the OS), at most 12
    (each holds a CUDA context and one key's inputs: ~0.5-3 GB of GPU memory)."""
    return max(1, min(12, (os.cpu_count() or 2) - 2))


def compiled_tasks(problem, configs: Sequence[Tuple[str, dict]]) -> List[Task]:
    """The tasks of ``configs`` (``(variant name, config)`` pairs of ``problem``) whose variant compiles."""
    from attntune.kernels import registry

    return [(problem, name, cfg) for name, cfg in configs
            if registry.exists(name) and registry.get(name).family in COMPILED_FAMILIES]


def stop_starting(now: float, deadline: float, mean_task_s: float) -> bool:
    """Whether to start no more tasks: one started now would end past ``deadline`` (by the mean duration of
    this call's tasks so far). The running tasks are waited for, so cancelling only at the deadline let FP32
    and forward+backward compiles of 3-8 s each overrun a 4 s deadline by 8 s (H100, 2026-12-06).

    >>> stop_starting(10.0, 12.0, 0.0)    # nothing done yet: no estimate, run up to the deadline
    False
    >>> stop_starting(10.0, 12.0, 3.0)    # a task would end at 13 s
    True
    >>> stop_starting(10.0, 12.0, 1.5)
    False
    """
    return now + mean_task_s >= deadline


def footprint_estimate(problem) -> int:
    """Bytes one worker may allocate for a task of ``problem`` before any was measured: 48 bytes an element of
    its tensors (q, k, v, the output; for ``fwd_bwd`` also dout and the three gradients), plus 256 MiB.
    Measured peaks replace it (:meth:`Precompiler.compile`); the factor is theirs: the gate's reference runs
    in float64 where that is cheap (decode) on float64 copies of K/V chunks, and a decode task peaked at
    40-43 bytes a K/V element (H100, 2026-12-07: 21.3 GiB for B32 x 8192 x 8 heads x D128, 5.3 GiB for B8;
    an estimate of 16 let 4 B32 tasks start at once, and 3 of them ran out of memory).

    >>> from attntune.problem import AttentionProblem
    >>> p = AttentionProblem(batch=32, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_kv=8192, head_dim=128,
    ...                      head_dim_v=128, dtype="bfloat16", kv_lens=True)
    >>> round(footprint_estimate(p) / 2**30, 1)   # GiB
    24.3
    """
    b, hq, hkv = problem.batch, problem.heads_q, problem.heads_kv
    q = b * hq * problem.seqlen_q * (problem.head_dim + problem.head_dim_v)  # q and the output
    kv = b * hkv * problem.seqlen_kv * (problem.head_dim + problem.head_dim_v)
    elems = (q + kv) * (2 if problem.mode == "fwd_bwd" else 1)  # gradients mirror the inputs
    return int(elems * 48) + (256 << 20)


def parallel_limit(free_bytes: Optional[int], footprint: int, workers: int, share: float) -> int:
    """Tasks of one problem to run at once: as many as fit in ``share`` of ``free_bytes`` (the device's free
    memory; None: not bounded, e.g. a CPU) at ``footprint`` bytes each, at least 1, at most ``workers``.

    >>> parallel_limit(None, 10 << 30, 12, 0.5)
    12
    >>> parallel_limit(75 << 30, 6 << 30, 12, 0.5)    # a B8 x 8192 decode key on an H100
    6
    >>> parallel_limit(75 << 30, 24 << 30, 12, 0.5)   # B32: even two do not fit; one by one
    1
    """
    if free_bytes is None:
        return workers
    return max(1, min(workers, int(free_bytes * share) // max(1, footprint)))


def _init(device: str, cancel) -> None:
    """Set the worker up: the device, its CUDA context and the imports every task needs (paid once per worker,
    while the pool starts, not by the first key's tasks). Never raises: a pool whose initializer raises
    respawns its workers forever (it did, on the first GPU run: ``set_device`` of an index-less ``cuda``);
    the error is kept and every task fails with it."""
    global _worker_device, _worker_error, _worker_cancel
    _worker_cancel = cancel
    try:
        import torch

        from attntune.autotune import gate, timing  # noqa: F401 — imported here, once
        from attntune.kernels import registry  # noqa: F401

        _worker_device = torch.device(device)
        if _worker_device.type == "cuda":
            if _worker_device.index is not None:
                torch.cuda.set_device(_worker_device)
            torch.cuda.init()
    except Exception as e:  # noqa: BLE001
        _worker_error = f"worker start: {type(e).__name__}: {e}"[:300]


def _ping() -> Optional[str]:
    """A started worker's answer: None, or why it could not set up."""
    return _worker_error


def _inputs(problem):
    """The gate's inputs for ``problem`` in this worker, kept while its tasks share the problem."""
    global _worker_inputs
    import torch

    from attntune.autotune import gate

    if _worker_inputs is None or _worker_inputs[0] != problem:
        _worker_inputs = None
        if _worker_device.type == "cuda":
            torch.cuda.empty_cache()
        _worker_inputs = (problem, gate.prepare(problem, _worker_device, seed=7))
    return _worker_inputs[1]


def _held_bytes() -> int:
    """Bytes of the inputs this worker keeps between tasks (0: none)."""
    if _worker_inputs is None:
        return 0
    import torch

    def nbytes(x) -> int:
        if isinstance(x, torch.Tensor):
            return x.nbytes
        return sum(map(nbytes, x)) if isinstance(x, (tuple, list)) else 0

    return sum(map(nbytes, vars(_worker_inputs[1]).values()))


def _task(job: Tuple[Task, int]) -> dict:
    """Run one candidate (``job``: the task and the most input bytes the worker may keep after it) once
    through the gate and once through its timed call. Returns ``name``, ``ok`` (None for a task cancelled
    before it started), ``seconds``, ``error``, ``peak_bytes`` (the most the device allocator held during the
    task, the kept inputs included; 0 off CUDA)."""
    import torch

    from attntune.autotune import gate
    from attntune.autotune.timing import make_call
    from attntune.kernels import registry

    global _worker_inputs
    (problem, name, cfg), keep_bytes = job
    res = {"name": name, "ok": False, "seconds": 0.0, "error": None, "peak_bytes": 0}
    if _worker_cancel is not None and _worker_cancel.is_set():
        return {**res, "ok": None}  # cancelled: the caller's deadline passed before it started
    if _worker_error:
        return {**res, "error": _worker_error}
    cuda = _worker_device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(_worker_device)
    t0 = time.perf_counter()
    try:
        variant = registry.get(name)
        with gate.key_numerics(problem):  # as the timing process prepares and runs it
            inp = _inputs(problem)
            res["ok"] = gate.check(variant, cfg, inp).ok
            if res["ok"]:
                fn, _ = make_call(variant, cfg, inp, grads=problem.mode == "fwd_bwd")
                fn()
        if cuda:
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 — the timing process compiles (and judges) it again
        res.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
    finally:
        res["seconds"] = time.perf_counter() - t0
        if cuda:
            res["peak_bytes"] = int(torch.cuda.max_memory_allocated(_worker_device))
        if _held_bytes() > keep_bytes:
            _worker_inputs = None  # too large to hold while idle (see the module doc)
        # Give the allocator's cached blocks back (the reference's chunks, the candidate's temporaries): 12
        # idle workers each holding them (6-7 GB each on an H100) ran the timing process out of memory.
        if cuda:
            torch.cuda.empty_cache()
    return res


class Precompiler:
    """A pool of ``workers`` spawned processes on ``device`` that compile candidates ahead
    (:meth:`compile`). The pool starts with :meth:`start` (or the first :meth:`compile`) and lives until
    :meth:`close`; use it as a context manager."""

    #: seconds the tasks already started when a deadline passes may take to finish before the pool is
    #: terminated (a forward+backward Triton config compiles in 1.2-4.7 s; FlexAttention's in ~4 s)
    DRAIN_S = 60.0

    #: seconds :meth:`start` waits for a first worker to answer
    START_S = 120.0

    #: share of the device's free memory (read when :meth:`compile` starts) the running tasks may take: the
    #: rest is the timing process's and the allocators' slack
    MEMORY_SHARE = 0.5

    #: a worker keeps a problem's inputs between tasks only up to this size (see the module doc)
    KEEP_INPUTS_BYTES = 512 << 20

    def __init__(self, device, workers: int):
        if workers < 1:
            raise ValueError(f"workers: {workers} (at least 1)")
        self.device, self.workers = str(device), workers
        self._pool = self._cancel = None
        self.disabled: Optional[str] = None  # why the workers could not start
        self._peaks: Dict[object, int] = {}  # problem -> the largest peak a task of it allocated

    def free_bytes(self) -> Optional[int]:
        """The device's free memory now (None off CUDA: not bounded)."""
        import torch

        dev = torch.device(self.device)
        if dev.type != "cuda":
            return None
        return int(torch.cuda.mem_get_info(dev)[0])

    def _limit(self, problem, free: Optional[int]) -> int:
        """Tasks of ``problem`` to run at once: :func:`parallel_limit` at its measured peak; before one is
        measured, at the estimate — or just one where the estimate already bounds it (memory is short for
        this problem, and an estimate can be off: the first one was, by 2.6x)."""
        if problem in self._peaks:
            return parallel_limit(free, self._peaks[problem], self.workers, self.MEMORY_SHARE)
        n = parallel_limit(free, footprint_estimate(problem), self.workers, self.MEMORY_SHARE)
        return n if n == self.workers else 1

    def start(self) -> "Precompiler":
        """Start the workers and wait until one answers (~5-10 s of imports and a CUDA context). A pool whose
        workers cannot start is closed and this precompiler disabled (:attr:`disabled` says why; every
        :meth:`compile` then returns at once): a worker dying while it starts is respawned forever, and
        each call would wait out its deadline."""
        if self._pool is None and not self.disabled:
            if _HERE not in sys.path:
                sys.path.insert(0, _HERE)
            ctx = mp.get_context("spawn")  # a forked CUDA context is unusable; spawn starts clean
            self._cancel = ctx.Event()
            self._pool = ctx.Pool(self.workers, initializer=_init, initargs=(self.device, self._cancel))
            try:
                err = self._pool.apply_async(_ping).get(timeout=self.START_S)
            except mp.TimeoutError:
                err = f"no worker answered within {self.START_S:.0f} s"
            if err:
                self.close()
                self.disabled = err
        return self

    def compile(self, tasks: Sequence[Task], deadline: float) -> Dict[str, object]:
        """Run ``tasks`` (in order, grouped by problem so that a worker prepares each problem's inputs
        once; at most :meth:`_limit` of a problem at once) until all are done or ``deadline``
        (``time.time()``) passes. Then the tasks not yet started are cancelled and those running finish (the
        pool is terminated if they take over :data:`DRAIN_S`), so that nothing runs on the device when this
        returns, and the pool is kept for the next call. Counts: ``tasks``, ``ok``, ``failed``, ``done``
        (ok + failed), ``cancelled``, ``seconds`` (wall), ``task_seconds`` (summed over tasks),
        ``complete``, ``errors`` (the first three), ``most_at_once`` (tasks that ran at once at most),
        ``peak_gib`` (the largest task's allocation); ``disabled`` when the workers could not start."""
        t0 = time.time()
        out: Dict[str, object] = {"tasks": len(tasks), "ok": 0, "failed": 0, "done": 0, "cancelled": 0,
                                  "task_seconds": 0.0, "complete": True, "errors": [], "most_at_once": 0,
                                  "peak_gib": 0.0}
        if tasks and self.start().disabled:
            out.update(complete=False, disabled=self.disabled)
        elif tasks:
            self._run(list(tasks), deadline, out)
        out["seconds"] = time.time() - t0
        return out

    def _run(self, tasks: List[Task], deadline: float, out: Dict[str, object]) -> None:
        """:meth:`compile`'s loop: submit while the memory limit and the deadline allow, collect results."""
        free, results = self.free_bytes(), queue.Queue()
        running: Dict[int, object] = {}  # submission index -> its task's problem
        nxt, until = 0, deadline

        def failed(i, name):  # a task whose worker raised past _task's own guard (a pickling error, say)
            return lambda e: results.put((i, {"name": name, "ok": False, "seconds": 0.0, "peak_bytes": 0,
                                              "error": f"{type(e).__name__}: {e}"[:300]}))

        while nxt < len(tasks) or running:
            mean_s = out["task_seconds"] / out["done"] if out["done"] else 0.0
            if out["complete"] and stop_starting(time.time(), deadline, mean_s):
                out["complete"] = False
                out["cancelled"] += len(tasks) - nxt
                nxt = len(tasks)
                self._cancel.set()
                until = time.time() + self.DRAIN_S
            while nxt < len(tasks) and len(running) < self._limit(tasks[nxt][0], free):
                i, task = nxt, tasks[nxt]
                self._pool.apply_async(_task, ((task, self.KEEP_INPUTS_BYTES),),
                                       callback=lambda r, i=i: results.put((i, r)),
                                       error_callback=failed(i, task[1]))
                running[i], nxt = task[0], nxt + 1
                out["most_at_once"] = max(out["most_at_once"], len(running))
            if not running:
                break
            wait = until - time.time() - (mean_s if out["complete"] else 0.0)
            try:
                i, r = results.get(timeout=max(0.01, wait))
            except queue.Empty:
                if not out["complete"]:  # a started task outlived the drain: stop every worker
                    out["terminated"] = True
                    self.close()
                    break
                continue
            problem = running.pop(i)
            if r["peak_bytes"]:
                self._peaks[problem] = max(self._peaks.get(problem, 0), r["peak_bytes"])
                out["peak_gib"] = max(out["peak_gib"], round(r["peak_bytes"] / 2**30, 2))
            if r["ok"] is None:
                out["cancelled"] += 1
                continue
            out["done"] += 1
            out["ok" if r["ok"] else "failed"] += 1
            out["task_seconds"] += r["seconds"]
            if r["error"] and len(out["errors"]) < 3:
                out["errors"].append(f"{r['name']}: {r['error']}")
        if self._cancel is not None:
            self._cancel.clear()  # every task has returned: the next call's tasks run

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = self._cancel = None

    def __enter__(self) -> "Precompiler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
