"""Compiling a batch of Triton configs in parallel before the sweep times them one by one.

A Triton config's first trial pays its compile (about 1-3 s a flash or decode config on a GPU host: LLVM and
ptxas, one core), far more than its gate and timing, and the sweep measures configs one after another. The
sweep knows several configs ahead at two points: its start (warm start, defaults, a small grid) and each
incumbent of the refinement (its one-step moves and sibling configs). :func:`precompile` runs one call of
each such config inside :func:`attntune.kernels.triton_launch.precompiling`: the variant's host path runs
as the timed call would (same shapes, strides, constexprs, so the same specializations), every Triton launch
becomes a compile on a thread pool, and nothing runs on the device. The trials that follow find their
kernels compiled. Timing is never concurrent with compiling: the batch finishes before the next trial.

Only variants that declare :attr:`~attntune.kernels.base.Variant.precompiles` take part (their Triton
launches all go through ``FastKernel``); any other variant's call would run for real.
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Optional, Tuple

from attntune.autotune.timing import make_call
from attntune.kernels.base import Config, Variant
from attntune.kernels.triton_launch import precompiling

#: most compile threads by default: a flash config takes one core; more threads than configs in a batch idle
MAX_DEFAULT_WORKERS = 16


def default_workers(processes: int = 1) -> int:
    """Compile threads for one tuning process: the host's cores (one left for the process itself) shared
    by ``processes`` tuning processes, at most :data:`MAX_DEFAULT_WORKERS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(1, min(MAX_DEFAULT_WORKERS, cores // max(1, processes) - 1))


def precompile(pairs: Iterable[Tuple[Variant, Config]], inputs, grads: bool, workers: int) -> Optional[dict]:
    """Compile the Triton kernels of ``pairs`` ((variant, config) of one key) for the key's ``inputs``
    (:func:`attntune.autotune.gate.prepare`) on ``workers`` threads; ``grads``: the key is ``fwd_bwd`` (the
    backward's kernels too). Returns ``{"configs": n, "seconds": s}``, or None when nothing was compiled
    here (no precompiling variant among ``pairs``, a CPU key, ``workers < 1``, or a Triton without async
    compiles). Never raises: a config whose call fails here fails the same way in its trial, which records
    the reason."""
    todo = [(v, c) for v, c in pairs if getattr(v, "precompiles", False)]
    if workers < 1 or not todo or inputs.device.type != "cuda":
        return None
    t0 = time.perf_counter()
    n = 0
    try:
        with precompiling(workers) as active:
            if not active:
                return None
            for variant, config in todo:
                try:
                    fn, _ = make_call(variant, config, inputs, grads)
                    fn()
                    n += 1
                except Exception:  # noqa: BLE001 — the trial reports it
                    continue
    except Exception:  # noqa: BLE001 — an older Triton re-raises a failed compile here; its trial meets it again
        pass
    return {"configs": n, "seconds": time.perf_counter() - t0}
