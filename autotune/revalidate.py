"""``attntune tune --revalidate``: turn *hints* into valid rows for the software running now.

A hint is a cached row of this device whose variant source is unchanged but which was measured under
other torch / triton / CUDA versions (:attr:`attntune.cache.CachedRow.hint`): the shipped ``cache.db``
after a torch upgrade. Re-tuning every key from scratch would take minutes; instead each hint's winner is
re-timed beside its runner-up and the SDPA baseline in a confirmation round
(:mod:`attntune.autotune.confirm`: interleaved rounds, ties to the baseline) after passing the
correctness gate again, and the confirmed winner is written to the target cache with today's
fingerprint. About a second a key on a GPU.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

import torch

from attntune.autotune import gate
from attntune.autotune.confirm import CPU_ROUNDS, GPU_ROUNDS, Candidate, busy_share, confirm
from attntune.autotune.sweep import BASELINE, KeyResult, baseline_config, key_seed
from attntune.autotune.timing import Timer, TimingOptions, graph_timed, make_call
from attntune.cache import CacheStore, LayeredCache, WinnerRecord, utcnow
from attntune.device import device_fingerprint, software_fingerprint
from attntune.kernels import registry


def hints_for(layers: LayeredCache, device: torch.device) -> List[WinnerRecord]:
    """The hint records of ``device`` (keys without a valid row anywhere in ``layers``)."""
    fp = device_fingerprint(device)
    return [rec for rec in layers.hint_records() if rec.key.device == fp]


def _candidates(rec: WinnerRecord, inputs, problem) -> List[Candidate]:
    """The hint's winner, its runner-up and the baseline — each still registered, able to run the key, with
    a config inside today's space, and passing the gate."""
    wanted = [(rec.variant, rec.config)]
    if rec.runner_up and rec.runner_up_config is not None:
        wanted.append((rec.runner_up, rec.runner_up_config))
    out, seen = [], set()
    for name, cfg in wanted:
        key = (name, tuple(sorted(cfg.items())))
        if key in seen or not registry.exists(name):
            continue
        seen.add(key)
        variant = registry.get(name)
        if registry.reasons(variant, problem) or variant.space(problem).validate(cfg):
            continue
        if not gate.check(variant, cfg, inputs).ok:
            continue
        fn, grads = make_call(variant, cfg, inputs, grads=problem.mode == "fwd_bwd")
        out.append(Candidate(name, cfg, fn, grads, baseline=name == BASELINE))
    if not any(c.baseline for c in out):
        cfg = baseline_config(problem, inputs)
        if cfg is not None:
            fn, grads = make_call(registry.get(BASELINE), cfg, inputs, grads=problem.mode == "fwd_bwd")
            out.append(Candidate(BASELINE, cfg, fn, grads, baseline=True))
    return out


def revalidate_one(rec: WinnerRecord, device: torch.device, timing: Optional[TimingOptions] = None,
                   seed: int = 0) -> KeyResult:
    """Re-time one hint; the result's record (when ``tuned``) carries today's fingerprint."""
    with gate.key_numerics(rec.key.representative()):
        return _revalidate_one(rec, device, timing, seed)


def _revalidate_one(rec: WinnerRecord, device: torch.device, timing: Optional[TimingOptions],
                    seed: int) -> KeyResult:
    t0 = time.time()
    problem = rec.key.representative()
    inputs = gate.prepare(problem, device, key_seed(rec.key_id, seed))
    cands = _candidates(rec, inputs, problem)
    if not cands:
        return KeyResult(key=rec.key, status="no-winner", reason="no candidate of the hint passes today's gate",
                         seconds=time.time() - t0)
    cpu = device.type == "cpu"
    timer = Timer(device, timing, graphs=graph_timed(problem))
    win = confirm(cands, timer.round, CPU_ROUNDS if cpu else GPU_ROUNDS, robust_min=cpu,
                  contention=lambda: timer.last_contention)
    if win is None:
        return KeyResult(key=rec.key, status="no-winner", reason="nothing could be timed", seconds=time.time() - t0)
    timed = [c for c in cands if c.rounds]
    base = next((c for c in timed if c.baseline), None)
    other = min((c for c in timed if c is not win), key=lambda c: c.ms, default=None)
    g = gate.check(registry.get(win.name), win.config, inputs)
    tflops, tbps = problem.rates(win.ms)
    new = WinnerRecord(
        key=rec.key, variant=win.name, config=win.config, median_ms=win.ms, spread=win.noise,
        busy=busy_share(timed, win, known=timer.contention is not None),
        tflops=tflops, tbps=tbps,
        runner_up=other.name if other else None, runner_up_config=other.config if other else None,
        runner_up_ms=other.ms if other else None, sdpa_default_ms=base.ms if base else None,
        max_error=g.max_error, rel_error=g.rel_error,
        fingerprint=software_fingerprint(registry.get(win.name).source_hash(), device.type),
        trials=len(timed), tuning_seconds=round(time.time() - t0, 3), created_at=utcnow(),
    )
    return KeyResult(key=rec.key, status="tuned", record=new, trials=len(timed), seconds=time.time() - t0,
                     reason=f"revalidated hint ({rec.variant} before)")


def revalidate(recs: List[WinnerRecord], store: CacheStore, device: torch.device,
               timing: Optional[TimingOptions] = None, on_event: Optional[Callable[[Dict], None]] = None
               ) -> List[KeyResult]:
    """Revalidate the hint records ``recs`` (:func:`hints_for`) into ``store`` (replacing the stale row
    when the hint came from ``store`` itself)."""
    emit = on_event or (lambda ev: None)
    emit({"type": "keys", "total": len(recs), "workers": 1})
    out = []
    for rec in recs:
        emit({"type": "key_start", "key_id": rec.key_id, "key": rec.key.short(), "worker": 0})
        res = revalidate_one(rec, device, timing)
        if res.record is not None:
            store.upsert_winner(res.record, force=True)  # what it replaces is stale (or absent)
        emit({"type": "key_done", "key_id": rec.key_id, "key": rec.key.short(), "worker": 0})
        out.append(res)
    return out


__all__ = ["hints_for", "revalidate", "revalidate_one"]
