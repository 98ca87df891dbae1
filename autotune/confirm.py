"""The confirmation round: before a key's winner is stored, its best candidates and the baseline (torch
SDPA's own choice) are re-timed side by side, in interleaved rounds, and the winner must beat the
baseline by more than the noise.

Why: a sweep times each candidate once, at a different moment. On a busy CPU a preempted measurement
reads as 4-8 ms where the call takes 0.75 ms (scheduler ticks), and on a GPU µs-scale kernels drift with
clocks and neighbours — so the sweep's order can be noise, and a noisy slow baseline makes a bogus
"6x faster than SDPA" row. Interleaving puts every candidate under the same conditions in every round.

Statistic per candidate, over its round measurements ``r_1 <= … <= r_n``:

* **CPU: the minimum of the round medians**; noise ``(r_2 - r_1) / r_1``, how reproducible that minimum
  is. Preemption only ever adds time, so the smallest round median is the one least disturbed — as long
  as some rounds are undisturbed: with a light load (an earlier run of ``benchmarks/cpu_clock_noise.py``)
  its coefficient of variation was 3.2 % against 9.9 % for a plain median, but once other processes keep
  every core busy it read 6.5-8.0 ms for a 0.5 ms call in 12 of 12 repeats
  (``benchmarks/results/cpu_clock_noise.json``). Hence the timer's run-queue filter and the contention
  rule below.
* **GPU: the median of the round medians**; noise half their range over the median. Device time is not
  preempted the way a CPU thread is; the median does not reward a lucky round.

Contention: a CPU round with too few calls undisturbed by other processes (the timer reads how long our
threads waited for a CPU, :mod:`attntune.autotune.cpuwait`) is contended. A candidate with at least two
undisturbed rounds is judged on those alone; otherwise its noise is at least the share of the time its
rounds spent waiting (:attr:`Candidate.contended`). On a CPU so busy that every call waits a scheduler
tick, round medians bunch at ticks and look reproducible (6.67 against 6.94 ms for a 0.16 ms call: a
"1.07x winner" was stored), so their spread alone would not say that they are noise.

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
    #: per round: the share of its time spent waiting for a CPU when it had too few undisturbed calls
    round_busy: List[float] = field(default_factory=list)
    #: the contention of the rounds that ``ms`` and ``noise`` come from (:func:`_statistic`); part of
    #: ``noise``
    contended: float = 0.0


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


def _statistic(rounds: Sequence[float], busy: Sequence[float], robust_min: bool) -> tuple:
    """``(statistic, noise, contended)`` of one candidate: :func:`summarize` over its undisturbed rounds
    (``busy`` 0) when it has at least two; else over every round, with ``contended`` the contention behind
    the statistic (:func:`_contended`) and the noise at least that share, at most 1 (a figure measured on
    a CPU this busy ties with anything).

    >>> _statistic([1.0, 7.0, 1.01], [0.0, 0.9, 0.0], robust_min=True)
    (1.0, 0.01, 0.0)
    >>> _statistic([7.0, 7.2, 1.0], [0.9, 0.95, 0.0], robust_min=True)
    (1.0, 1.0, 0.9)
    """
    clean = [r for r, b in zip(rounds, busy) if not b]
    if len(busy) == len(rounds) and len(clean) >= 2:
        return (*summarize(clean, robust_min), 0.0)
    stat, noise = summarize(rounds, robust_min)
    contended = round(_contended(rounds, busy, robust_min), 6)
    if contended:
        noise = min(1.0, max(noise, contended))
    return stat, noise, contended


def _contended(rounds: Sequence[float], busy: Sequence[float], robust_min: bool) -> float:
    """The contention behind a statistic over every round: with the robust minimum, that of the two
    smallest rounds (the minimum and the round its noise compares it with); with the median, the largest.

    >>> _contended([7.0, 7.2, 1.0], [0.9, 0.95, 0.0], robust_min=True)
    0.9
    """
    if not busy:
        return 0.0
    if not robust_min:
        return max(busy)
    order = sorted(range(len(rounds)), key=lambda i: rounds[i])[:2]
    return max(busy[i] for i in order)


def confirm(candidates: Sequence[Candidate], measure: Callable[[Callable, list, int], float], rounds: int,
            robust_min: bool, contention: Optional[Callable[[], Optional[float]]] = None) -> Optional[Candidate]:
    """Re-time ``candidates`` in ``rounds`` interleaved rounds (the order rotates every round, so no
    candidate always runs first or right after a given other) with ``measure(fn, grads, rounds)`` — one
    round's milliseconds, e.g. :meth:`attntune.autotune.timing.Timer.round` — fill each candidate's
    ``rounds``, ``ms``, ``noise`` and ``contended``, and return the winner (None when there are no
    candidates). ``contention()``, read after each measurement, is that round's contention (e.g.
    :attr:`~attntune.autotune.timing.Timer.last_contention`). A candidate whose measurement raises is
    dropped."""
    live = list(candidates)
    for r in range(rounds):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for c in order:
            try:
                c.rounds.append(float(measure(c.fn, c.grads, rounds)))
                busy = contention() if contention is not None else None
                c.round_busy.append(float(busy or 0.0))
            except Exception:  # noqa: BLE001 — it ran in the sweep; a failure now disqualifies it
                c.rounds.clear()
                c.round_busy.clear()
                live = [x for x in live if x is not c]
    timed = [c for c in live if c.rounds and all(x > 0 for x in c.rounds)]
    for c in timed:
        c.ms, c.noise, c.contended = _statistic(c.rounds, c.round_busy, robust_min)
    return decide(timed)


def busy_share(timed: Sequence[Candidate], winner: Candidate, known: bool) -> Optional[float]:
    """The contention behind the figures a row stores — the winner's and the baseline's
    (``WinnerRecord.busy``); None when the timer did not know the run-queue delay (``known`` False)."""
    if not known:
        return None
    return max((c.contended for c in timed if c is winner or c.baseline), default=0.0)


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


__all__ = ["Candidate", "busy_share", "confirm", "decide", "summarize", "CONFIRM_TOP", "CPU_ROUNDS", "GPU_ROUNDS", "MIN_MARGIN"]
