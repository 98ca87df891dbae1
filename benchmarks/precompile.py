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
"""

from __future__ import annotations

import multiprocessing as mp
import os
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


def _task(task: Task) -> Tuple[str, Optional[bool], float, Optional[str]]:
    """Run one candidate once through the gate and once through its timed call; ``(variant, ok, seconds,
    error)``; ``ok`` is None for a task cancelled before it started."""
    import torch

    from attntune.autotune import gate
    from attntune.autotune.timing import make_call
    from attntune.kernels import registry

    problem, name, cfg = task
    if _worker_cancel is not None and _worker_cancel.is_set():
        return name, None, 0.0, None  # cancelled: the caller's deadline passed before it started
    if _worker_error:
        return name, False, 0.0, _worker_error
    t0 = time.perf_counter()
    try:
        variant = registry.get(name)
        with gate.key_numerics(problem):  # as the timing process prepares and runs it
            inp = _inputs(problem)
            ok = gate.check(variant, cfg, inp).ok
            if ok:
                fn, _ = make_call(variant, cfg, inp, grads=problem.mode == "fwd_bwd")
                fn()
        if _worker_device.type == "cuda":
            torch.cuda.synchronize()
        return name, ok, time.perf_counter() - t0, None
    except Exception as e:  # noqa: BLE001 — the timing process compiles (and judges) it again
        return name, False, time.perf_counter() - t0, f"{type(e).__name__}: {e}"[:300]
    finally:
        # Give the allocator's cached blocks back (the reference's chunks, the candidate's temporaries): 12
        # idle workers each holding them (6-7 GB each on an H100) ran the timing process out of memory.
        if _worker_device is not None and _worker_device.type == "cuda":
            torch.cuda.empty_cache()


class Precompiler:
    """A pool of ``workers`` spawned processes on ``device`` that compile candidates ahead
    (:meth:`compile`). The pool starts with :meth:`start` (or the first :meth:`compile`) and lives until
    :meth:`close`; use it as a context manager."""

    #: seconds the tasks already started when a deadline passes may take to finish before the pool is
    #: terminated (a forward+backward Triton config compiles in 1.2-4.7 s; FlexAttention's in ~4 s)
    DRAIN_S = 60.0

    #: seconds :meth:`start` waits for a first worker to answer
    START_S = 120.0

    def __init__(self, device, workers: int):
        if workers < 1:
            raise ValueError(f"workers: {workers} (at least 1)")
        self.device, self.workers = str(device), workers
        self._pool = self._cancel = None
        self.disabled: Optional[str] = None  # why the workers could not start

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
        once) until all are done or ``deadline`` (``time.time()``) passes. Then the tasks not yet started
        are cancelled and those running finish (the pool is terminated if they take over :data:`DRAIN_S`),
        so that nothing runs on the device when this returns, and the pool is kept for the next call.
        Counts: ``tasks``, ``ok``, ``failed``, ``done`` (ok + failed), ``cancelled``, ``seconds`` (wall),
        ``task_seconds`` (summed over tasks), ``complete``, ``errors`` (the first three); ``disabled`` when
        the workers could not start."""
        t0 = time.time()
        out: Dict[str, object] = {"tasks": len(tasks), "ok": 0, "failed": 0, "done": 0, "cancelled": 0,
                                  "task_seconds": 0.0, "complete": True, "errors": []}
        if tasks and self.start().disabled:
            out.update(complete=False, disabled=self.disabled)
        elif tasks:
            results = self._pool.imap_unordered(_task, list(tasks), chunksize=1)
            pending, until = len(tasks), deadline
            while pending:
                mean_s = out["task_seconds"] / out["done"] if out["done"] else 0.0
                if out["complete"] and stop_starting(time.time(), deadline, mean_s):
                    out["complete"] = False
                    self._cancel.set()
                    until = time.time() + self.DRAIN_S
                wait = until - time.time() - (mean_s if out["complete"] else 0.0)
                try:
                    name, ok, secs, err = results.next(timeout=max(0.01, wait))
                except mp.TimeoutError:
                    if not out["complete"]:  # a started task outlived the drain: stop every worker
                        out["terminated"] = True
                        self.close()
                        break
                    continue
                pending -= 1
                if ok is None:
                    out["cancelled"] += 1
                    continue
                out["done"] += 1
                out["ok" if ok else "failed"] += 1
                out["task_seconds"] += secs
                if err and len(out["errors"]) < 3:
                    out["errors"].append(f"{name}: {err}")
            if self._cancel is not None:
                self._cancel.clear()  # every task has returned: the next call's tasks run
        out["seconds"] = time.time() - t0
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = self._cancel = None

    def __enter__(self) -> "Precompiler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
