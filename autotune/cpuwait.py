"""How long this process's threads waited for a CPU: Linux's per-thread run-queue delay.

``/proc/self/task/<tid>/schedstat`` holds three numbers per thread; the second is the time (ns) the
thread spent runnable but not running — waiting for a CPU that another process held. The CPU timer
(:mod:`attntune.autotune.timing`) reads it around every timed call: a call during which any thread of
ours waited is disturbed (its wall time holds someone else's work) and is set aside.

Why not a plain clock: on the 2-core development machine, with another torch process running two
threads beside the tuner, every 0.16 ms SDPA call took 2.8-11 ms of wall time (a scheduler tick or two:
the call's intra-op worker thread waited for a core) — and the process CPU time was as large, because
OpenMP threads spin while they wait. The run-queue delay of the same calls was 2.8-14 ms, while a quiet
machine shows 0 for 196 of 200 calls (``benchmarks/cpu_clock_noise.py``). No statistic of wall times
tells these apart; the delay does.

Unavailable (not Linux, no schedstat in the kernel, a restricted /proc): :func:`total_s` returns None
and the timer times every call as before.
"""

from __future__ import annotations

import os
from typing import Optional

_TASKS = "/proc/self/task"


def _read(tid: str) -> Optional[int]:
    try:
        fd = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY)
    except OSError:  # the thread exited between listdir and open
        return None
    try:
        fields = os.read(fd, 128).split()
    finally:
        os.close(fd)
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def total_s() -> Optional[float]:
    """Seconds the threads of this process have waited for a CPU so far (summed over the live threads),
    or None where the kernel does not say. The timer takes the difference around a call (clamped at 0:
    a thread that ended in between takes its share with it)."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    ns, seen = 0, False
    for tid in tids:
        v = _read(tid)
        if v is not None:
            ns, seen = ns + v, True
    return ns * 1e-9 if seen else None


__all__ = ["total_s"]
