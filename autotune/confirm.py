"""The confirmation round: before a key's winner is stored, its best candidates and the baseline (torch
SDPA's own choice) are re-timed side by side, in interleaved rounds, and the winner must beat the
baseline by more than the noise.

Why: a sweep times each candidate once, at a different moment. On a busy CPU a preempted measurement
reads as 4-8 ms where the call takes 0.75 ms (scheduler ticks), and on a GPU µs-scale kernels drift with
clocks and neighbours — so the sweep's order can be noise, and a noisy slow baseline makes a bogus
"6x faster than SDPA" row. Interleaving puts every candidate under the same conditions in every round.

Statistic per candidate, over its round measurements ``r_1 <= … <= r_n``:

* **CPU: the minimum of the round medians**; noise ``(r_2 - r_1) / r_1``, how reproducible that minimum
  is. Preemption only ever adds time, so the smallest round median is the one least disturbed. Measured
  on the 2-core development machine with two busy processes beside it
  (``benchmarks/cpu_clock_noise.py``, ``benchmarks/results/cpu_clock_noise.json``; a 0.97 ms SDPA call,
  12 repeats): the plain median of 50 calls varied with a coefficient of variation of 9.9 % (up to
  1.40 ms), the median of 5 round medians 36.6 %, their minimum 3.2 % (0.99-1.11 ms). With a test suite
  running beside it instead, 119 % against 1.4 % (an earlier run of the same measurement).
* **GPU: the median of the round medians**; noise half their range over the median. Device time is not
  preempted the way a CPU thread is; the median does not reward a lucky round.

Decision: the fastest statistic wins, except that a candidate whose margin over the baseline is within the
noise (the larger of the two candidates' noises, and at least :data:`MIN_MARGIN`) ties with it, and ties
go to the baseline: attntune never stores a winner it cannot tell apart from what SDPA does anyway.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

#: how many of the sweep's best candidates (distinct configs) are re-timed beside the baseline
CONFIRM_TOP = 3
#: rounds of the confirmation (each about 1/rounds of a full measurement)
CPU_ROUNDS = 5
GPU_ROUNDS = 3
#: below this relative margin two candidates tie whatever their measured noise
MIN_MARGIN = 0.02


@dataclass
class Candidate:
    """One (variant, config) to re-time: ``fn`` runs it, ``grads`` are the tensors whose ``.grad`` the
    timer resets (forward+backward)."""

    name: str
    config: dict
    fn: Callable[[], None]
    grads: list = field(default_factory=list)
    baseline: bool = False
    rounds: List[float] = field(default_factory=list)
    ms: float = float("inf")
    noise: float = 0.0


def summarize(rounds: Sequence[float], robust_min: bool) -> tuple:
    """``(statistic, noise)`` of one candidate's round medians (module docstring).

    >>> summarize([1.0, 1.02, 8.0, 4.0, 1.01], robust_min=True)
    (1.0, 0.01)
    >>> summarize([2.0, 2.2, 1.8], robust_min=False)
    (2.0, 0.1)
    """
    r = sorted(rounds)
    if robust_min:
        stat = r[0]
        noise = (r[1] - r[0]) / r[0] if len(r) > 1 else 0.0
    else:
        stat = statistics.median(r)
        noise = (r[-1] - r[0]) / 2 / stat
    return stat, round(noise, 6)


def confirm(candidates: Sequence[Candidate], measure: Callable[[Callable, list, int], float], rounds: int,
            robust_min: bool) -> Optional[Candidate]:
    """Re-time ``candidates`` in ``rounds`` interleaved rounds (the order rotates every round, so no
    candidate always runs first or right after a given other) with ``measure(fn, grads, rounds)`` — one
    round's milliseconds, e.g. :meth:`attntune.autotune.timing.Timer.round` — fill each candidate's
    ``rounds``, ``ms`` and ``noise``, and return the winner (None when there are no candidates). A
    candidate whose measurement raises is dropped."""
    live = list(candidates)
    for r in range(rounds):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for c in order:
            try:
                c.rounds.append(float(measure(c.fn, c.grads, rounds)))
            except Exception:  # noqa: BLE001 — it ran in the sweep; a failure now disqualifies it
                c.rounds.clear()
                live = [x for x in live if x is not c]
    timed = [c for c in live if c.rounds and all(x > 0 for x in c.rounds)]
    for c in timed:
        c.ms, c.noise = summarize(c.rounds, robust_min)
    return decide(timed)


def decide(timed: Sequence[Candidate]) -> Optional[Candidate]:
    """The fastest candidate, unless the baseline is within the noise of it (then the baseline)."""
    if not timed:
        return None
    best = min(timed, key=lambda c: c.ms)
    base = next((c for c in timed if c.baseline), None)
    if base is None or best is base:
        return best
    margin = max(MIN_MARGIN, best.noise, base.noise)
    return base if best.ms > base.ms * (1 - margin) else best


__all__ = ["Candidate", "confirm", "decide", "summarize", "CONFIRM_TOP", "CPU_ROUNDS", "GPU_ROUNDS", "MIN_MARGIN"]
