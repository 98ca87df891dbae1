"""Running a tune: keys → claims → :class:`KeyTuner`, in this process or in one worker process per GPU.

Entry points:

* :func:`tune` — the Python API (``attntune.autotune.tune``): problems in, winners out.
* :func:`run_tuning` — the same, returning a :class:`KeyResult` per key (the CLI's summary table).
* :func:`tune_one` — one missed key in place under a small budget (the runtime's online policy).

Workers: with ``workers > 1`` or several GPUs, one process per worker (multiprocessing *spawn*: a
forked CUDA context is unusable), each with ``CUDA_VISIBLE_DEVICES`` set to its GPU before it starts.
Every worker walks the whole key list and takes keys through claims (:mod:`claims`), so each key is
tuned once, whichever worker gets there first; a worker that dies leaves a claim that expires, and a
surviving worker retakes the key. All write one cache; events (progress) and results come back to the
parent over a queue.
"""

from __future__ import annotations

import contextlib
import os
import queue as queue_mod
import signal
import time
import traceback
from datetime import datetime, timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from attntune.autotune import claims
from attntune.cache.retry import is_locked, retry_locked
from attntune.autotune.study import MEMORY, default_storage_url, open_storage
from attntune.autotune.sweep import Event, FatalDeviceError, KeyResult, KeyTuner, SweepOptions
from attntune.autotune.timing import TimingOptions
from attntune.cache.layered import system_cache_path, user_cache_url
from attntune.kernels import registry
from attntune.cache.models import WinnerRecord, judge, utcnow
from attntune.cache.store import CacheStore, display_url
from attntune.device import device_fingerprint
from attntune.key import TuneKey
from attntune.problem import AttentionProblem

DEFAULT_TRIALS = {"cuda": 24, "cpu": 12}
# the hill climb after the budget (sweep step 5): on the H200 it took the two window keys' regret from
# 14.5 % to 0.0-0.1 % at 2-3x their tuning time (benchmarks/results/regret_h200_2026-12-04_refine.json)
DEFAULT_REFINE = 12
CLAIM_TTL_S = 120.0
POLL_S = 0.5


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a tune. ``results`` holds what finished before it (finished keys are already in
    the cache; the key in progress was released and resumes from its optuna study)."""

    def __init__(self, results: List[KeyResult]):
        super().__init__("tuning interrupted")
        self.results = results


def resolve_keys(problems: Sequence[AttentionProblem], device: torch.device) -> List[TuneKey]:
    """The distinct keys of ``problems`` on ``device``, in order."""
    fp = device_fingerprint(device)
    out, seen = [], set()
    for p in problems:
        if p.device_type != device.type:
            raise ValueError(f"problem {p.short()} is for {p.device_type}, the tuner runs on {device.type}")
        k = TuneKey.from_problem(p, fp)
        if k.key_id not in seen:
            seen.add(k.key_id)
            out.append(k)
    return out


#: how far in the future a row's timestamp may be and still count as this run's (clocks of a fleet differ)
_CLOCK_SKEW = timedelta(minutes=10)


def _needs_tuning(
    raw: Optional[dict], force: bool, run_start: datetime
) -> Tuple[bool, Optional[WinnerRecord], bool]:
    """(tune it?, the valid existing record, must the upsert be forced?). A stale or rejected row is
    replaced (forced); a valid one is re-tuned when ``force`` or when it was measured on a busy CPU
    (``WinnerRecord.measured_busy``: its times are inflated), if it predates this run, and replaced only
    by a faster result (not forced: ``--force`` never stores a slower winner over a valid row)."""
    if raw is None:
        return True, None, False
    verdict = judge(raw, "user", registry)
    if verdict.status != "valid":
        return True, None, True
    # "predates this run": written before it started — or dated in the future (a skewed clock, an imported
    # row): this run cannot have written it, and taking it for another worker's fresh result kept such a row
    # from `--force` and from the busy-CPU re-time for good (audit: created_at 2099)
    created = verdict.record.created_at
    if (force or verdict.record.measured_busy) and (created < run_start or created > utcnow() + _CLOCK_SKEW):
        return True, verdict.record, False
    return False, verdict.record, False


def _open_cache(cache: Union[str, CacheStore, None]) -> CacheStore:
    if isinstance(cache, CacheStore):
        return cache
    return CacheStore(cache or user_cache_url())


def _warm_stores(store: CacheStore, use_system: bool) -> List[CacheStore]:
    out = [store]
    path = system_cache_path() if use_system else None
    if path is not None:
        try:
            out.append(CacheStore(str(path), readonly=True))
        except Exception:  # noqa: BLE001 — the shipped cache only seeds warm starts
            pass
    return out


def run_worker(
    problems: Sequence[AttentionProblem],
    *,
    cache: Union[str, CacheStore, None],
    storage: Optional[str],
    options: SweepOptions,
    run_start: datetime,
    worker: int = 0,
    claim_ttl: float = CLAIM_TTL_S,
    wait_for_others: bool = True,
    on_event: Optional[Event] = None,
    use_system_cache: bool = True,
) -> List[KeyResult]:
    """Tune every key of ``problems`` that needs it, in this process. Keys claimed by another live
    worker are revisited until that worker finishes them or its claim expires (``wait_for_others``).
    Raises :class:`Interrupted` on Ctrl-C (claims released) and :class:`FatalDeviceError`."""
    emit = on_event or (lambda ev: None)
    device = torch.device(problems[0].device_type) if problems else torch.device("cpu")
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    keys = resolve_keys(problems, device)
    store = _open_cache(cache)
    optuna_storage = open_storage(storage)
    warm = _warm_stores(store, use_system_cache)
    owner = claims.owner_id(worker)
    results: Dict[str, KeyResult] = {}
    pending = list(keys)
    told: set = set()
    try:
        while pending:
            waiting = False
            for key in list(pending):
                if _TERMINATED:
                    # SIGTERM's handler raises KeyboardInterrupt wherever the main thread is, and Python
                    # swallows it inside a finalizer or weakref callback ("Exception ignored in ...",
                    # seen in a SQLAlchemy pool cleanup): the flag it set still stops the run here.
                    raise KeyboardInterrupt
                if options.time_up():
                    for k in pending:
                        results.setdefault(
                            k.key_id, KeyResult(key=k, status="unfinished", reason="time limit reached")
                        )
                    return [results[k.key_id] for k in keys if k.key_id in results]
                kid = key.key_id
                need, existing, _ = _needs_tuning(
                    retry_locked(store.raw_winner, kid), options.force, run_start
                )
                if not need:
                    results[kid] = KeyResult(
                        key=key, status="skipped", record=existing, reason="valid winner in cache"
                    )
                    pending.remove(key)
                    emit({"type": "key_skipped", "key_id": kid, "key": key.short(), "worker": worker})
                    continue
                if not claims.try_claim(store, kid, owner, claim_ttl, run_start):
                    st = claims.claim_state(store, kid)
                    if st is not None and st["done"]:
                        results[kid] = KeyResult(
                            key=key, status="done-elsewhere", reason=f"finished by {st['owner']}"
                        )
                        pending.remove(key)
                        emit({"type": "key_skipped", "key_id": kid, "key": key.short(), "worker": worker})
                    elif wait_for_others:
                        waiting = True
                        if kid not in told:  # say once what this worker waits for, and until when
                            told.add(kid)
                            emit({"type": "key_waiting", "key_id": kid, "key": key.short(), "worker": worker,
                                  "owner": st["owner"] if st else "?",
                                  "until": str(st["expires_at"]) if st else "?"})
                    else:
                        results[kid] = KeyResult(
                            key=key, status="unfinished", reason="claimed by another worker"
                        )
                        pending.remove(key)
                    continue
                results[kid] = _tune_claimed(
                    key, store, optuna_storage, options, warm, owner, claim_ttl, run_start, worker, emit
                )
                pending.remove(key)
            if pending and waiting:
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        # The interrupt may have landed anywhere, e.g. between taking a claim and the try block that
        # releases it: release every live claim of this worker (finished keys keep their done claims).
        try:
            with interrupts_deferred():
                release_quickly(store, [k.key_id for k in keys], owner)
        except KeyboardInterrupt:
            pass  # another interrupt while releasing: already stopping
        raise Interrupted([results[k.key_id] for k in keys if k.key_id in results]) from None
    finally:
        if not isinstance(cache, CacheStore):
            store.dispose()
    return [results[k.key_id] for k in keys if k.key_id in results]


def _tune_claimed(
    key: TuneKey,
    store: CacheStore,
    storage,
    options: SweepOptions,
    warm,
    owner: str,
    claim_ttl: float,
    run_start: datetime,
    worker: int,
    emit: Event,
) -> KeyResult:
    """Tune a key this worker has claimed; finish (done) or release the claim however it ends."""
    kid = key.key_id
    finished = False
    try:
        # Another worker may have finished the key between our check and our claim.
        need, existing, force_upsert = _needs_tuning(
            retry_locked(store.raw_winner, kid), options.force, run_start
        )
        if not need:
            finished = True
            emit({"type": "key_skipped", "key_id": kid, "key": key.short(), "worker": worker})
            return KeyResult(key=key, status="skipped", record=existing, reason="valid winner in cache")
        emit({"type": "key_start", "key_id": kid, "key": key.short(), "worker": worker})
        with claims.Heartbeat(store, kid, owner, claim_ttl) as hb:
            try:
                res = KeyTuner(
                    key,
                    store,
                    storage,
                    options,
                    warm_stores=warm,
                    on_event=emit,
                    force_upsert=force_upsert,
                    lost=hb.lost.is_set,
                ).run()
            except (KeyboardInterrupt, FatalDeviceError):
                raise
            except Exception as e:  # noqa: BLE001 — a tuner bug or a lost database: report, go on
                res = KeyResult(
                    key=key,
                    status="error",
                    reason=f"{_key_error(e, storage)}\n{traceback.format_exc(limit=4)}",
                )
        finished = res.status not in ("unfinished", "error")
        emit(
            {
                "type": "key_done",
                "key_id": kid,
                "key": key.short(),
                "worker": worker,
                "status": res.status,
                "variant": res.record.variant if res.record else None,
                "ms": res.record.median_ms if res.record else None,
                "reason": res.reason,
            }
        )
        return res
    finally:
        # A second Ctrl-C / SIGTERM while the claim is being settled must not leave it live.
        with interrupts_deferred():
            try:
                if finished:
                    claims.finish(store, kid, owner)
                elif _TERMINATED:  # stopping: never wait long on a lock (held signals wait with us)
                    release_quickly(store, [kid], owner)
                else:
                    retry_locked(store.release_claim, kid, owner)
            except Exception:  # noqa: BLE001 — the claim then simply expires
                pass
        if key.device.device_type == "cuda" and torch.cuda.is_initialized():
            # Keys differ wildly in size: hand the last key's cached blocks back before the next one.
            torch.cuda.empty_cache()


def _key_error(e: BaseException, storage) -> str:
    """A key's failure as one line. optuna wraps a locked storage as StorageInternalError "invalid data in
    the commit, e.g. exceeding max length" (audit: a locked optuna.db read as a data bug): a lock anywhere in
    the cause chain is named as such, with the storage."""
    seen, c = set(), e
    while c is not None and id(c) not in seen:
        seen.add(id(c))
        if is_locked(c):
            url = getattr(storage, "url", None)
            where = f"optuna storage {display_url(url)}" if isinstance(url, str) else "the tuner's storage"
            return (f"{where}: locked by another process ({str(c).splitlines()[0]}); run again when it is "
                    "done, or pass another --storage")
        c = c.__cause__ or c.__context__
    return f"{type(e).__name__}: {e}"


# ---- termination ----------------------------------------------------------------------------------

def release_quickly(store: CacheStore, key_ids: List[str], owner: str) -> None:
    """Give back this worker's live claims on ``key_ids`` while stopping: through a connection that waits at
    most a second for another process's lock, and no further once one release meets a lock (every other
    would wait as long). A claim left behind is harmless — a claim of a process that is gone is retaken —
    while waiting the cache's 30 s busy timeout per key, with Ctrl-C and SIGTERM held back meanwhile, kept a
    stopped `tune` alive for many minutes on a locked cache (audit)."""
    quick = store
    if store.dialect == "sqlite":
        try:
            quick = CacheStore(store.url, timeout_s=1.0, lock_attempts=1)
        except Exception:  # noqa: BLE001 — cannot even open it: the claims expire
            return
    try:
        for kid in key_ids:
            try:
                retry_locked(quick.release_claim, kid, owner, attempts=2, budget_s=2.0)
            except Exception as e:  # noqa: BLE001 — the claim then simply expires
                if is_locked(e):
                    break
    finally:
        if quick is not store:
            quick.dispose()


#: a stop signal arrived (Ctrl-C or SIGTERM): the tuning loop checks it before each key, because Python
#: swallows the KeyboardInterrupt its handler raises when it lands inside a finalizer or weakref callback
#: ("Exception ignored in ...": Ctrl-C was lost in 5 of 10 runs, which then tuned every key and exited 0)
_TERMINATED = False
#: ... and it was SIGTERM, which reaches this process alone (the workers must be sent it)
_BY_SIGTERM = False


def _raise_interrupt(signum, frame) -> None:
    global _TERMINATED, _BY_SIGTERM
    _TERMINATED = True
    _BY_SIGTERM = _BY_SIGTERM or signum == signal.SIGTERM
    raise KeyboardInterrupt


def _raise_interrupt_once(signum, frame) -> None:
    """A worker's handler: the first stop signal interrupts, later ones are ignored. The parent passes every
    stop signal on to its workers (a ``kill -INT`` of the parent alone reaches no worker), so a worker that
    also got the terminal's Ctrl-C sees two; the second must not break its claim release."""
    if _TERMINATED:
        return
    _raise_interrupt(signum, frame)


@contextlib.contextmanager
def interrupts_deferred():
    """Hold Ctrl-C and SIGTERM back during a short critical section (settling a claim in the database):
    a signal that arrives inside is sent again when the section ends, to the handler it would have met
    (``KeyboardInterrupt`` for Ctrl-C and the tuner's SIGTERM), so the section itself always completes.
    Off the main thread Python delivers no signals: nothing to hold."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []

    def hold(signum, frame):
        got.append(signum)

    old = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(got):  # delivered again, now to the handler that was held back
            os.kill(os.getpid(), sig)


def stop_signals_as_interrupt(once: bool = False) -> Dict[int, Any]:
    """Ctrl-C and SIGTERM (``timeout``, a batch scheduler, ``kill``) stop a tune alike: finished keys are
    kept and the key in progress releases its claim at once instead of when the claim expires; both set
    :data:`_TERMINATED`, so a KeyboardInterrupt Python swallowed still stops the run at the next key.
    Returns the previous handlers ``{signal: handler}`` (to restore), empty off the main thread, where
    Python delivers no signals. ``once``: only the first signal interrupts (a worker's handler)."""
    import threading

    global _TERMINATED, _BY_SIGTERM
    _TERMINATED = _BY_SIGTERM = False
    if threading.current_thread() is not threading.main_thread():
        return {}
    handler = _raise_interrupt_once if once else _raise_interrupt
    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


# ---- multi-process --------------------------------------------------------------------------------


def _worker_entry(payload: Dict[str, Any], worker: int, q) -> None:
    """Body of a spawned worker process. Everything crosses the process boundary as JSON. It starts with
    Ctrl-C and SIGTERM blocked (:func:`_start_blocked`); one sent meanwhile is delivered once the handlers
    below are in place, and stops the worker as an interrupt."""
    stop_signals_as_interrupt(once=True)  # the parent's terminate() then releases this worker's claim
    problems = [AttentionProblem.model_validate_json(s) for s in payload["problems"]]
    opts = SweepOptions(
        trials=payload["trials"],
        deadline=payload["deadline"],
        force=payload["force"],
        seed=payload["seed"],
        timing=TimingOptions(**payload["timing"]),
        refine=payload.get("refine", 0),
    )

    def emit(ev: Dict[str, Any]) -> None:
        q.put({**ev, "worker": worker})

    try:
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        res = run_worker(
            problems,
            cache=payload["cache"],
            storage=payload["storage"],
            options=opts,
            run_start=datetime.fromisoformat(payload["run_start"]),
            worker=worker,
            claim_ttl=payload["claim_ttl"],
            on_event=emit,
        )
        q.put({"type": "results", "worker": worker, "results": [r.model_dump_json() for r in res]})
    except Interrupted as e:
        q.put(
            {
                "type": "results",
                "worker": worker,
                "results": [r.model_dump_json() for r in e.results],
                "interrupted": True,
            }
        )
    except KeyboardInterrupt:  # stopped before run_worker's own handling began: nothing claimed yet
        q.put({"type": "results", "worker": worker, "results": [], "interrupted": True})
    except BaseException as e:  # noqa: BLE001 — report, then die with a non-zero code
        q.put(
            {
                "type": "error",
                "worker": worker,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(),
            }
        )
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        raise SystemExit(1)


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _start_blocked(p) -> None:
    """Start worker process ``p`` with Ctrl-C and SIGTERM blocked: a child inherits the signal mask of
    the thread that starts it. A worker takes seconds to import torch before :func:`_worker_entry` can
    install its handlers; Ctrl-C (it reaches the whole terminal's process group) or the SIGINT that
    ``tune`` passes on for SIGTERM arriving meanwhile killed it with a KeyboardInterrupt traceback from
    multiprocessing's bootstrap, and the parent reported "worker N died". Blocked, the signal waits
    until the worker unblocks it, and then stops it as an interrupt."""
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX
        p.start()
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        p.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _run_processes(
    problems, assignments: List[Optional[str]], base: Dict[str, Any], emit: Event
) -> List[KeyResult]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = []
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    results: Dict[str, KeyResult] = {}
    errors: List[str] = []
    reported = set()
    interrupted = False

    def drain(timeout: float) -> None:
        nonlocal interrupted
        try:
            ev = q.get(timeout=timeout)
        except queue_mod.Empty:
            return
        if ev["type"] == "results":
            reported.add(ev["worker"])
            interrupted = interrupted or bool(ev.get("interrupted"))
            for s in ev["results"]:
                r = KeyResult.model_validate_json(s)
                cur = results.get(r.key_id)
                # The worker that tuned a key speaks for it; the others only saw it skipped.
                if cur is None or (r.status == "tuned" and cur.status != "tuned"):
                    results[r.key_id] = r
        elif ev["type"] == "error":
            reported.add(ev["worker"])
            errors.append(f"worker {ev['worker']}: {ev['error']}\n{ev.get('traceback', '')}")
        else:
            emit(ev)

    try:
        # Started inside the try: a Ctrl-C while the workers start still stops the ones started.
        try:
            for i, gpu in enumerate(assignments):
                # The child reads its environment at start: set its GPU before start(), restore after.
                if gpu is not None:
                    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
                p = ctx.Process(target=_worker_entry, args=(base, i, q), name=f"attntune-tune-{i}")
                _start_blocked(p)
                procs.append(p)
        finally:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
        while any(p.is_alive() for p in procs) or not q.empty():
            drain(0.2)
    except KeyboardInterrupt:
        interrupted = True
        # Passed on as Ctrl-C to every live worker: SIGTERM, and a SIGINT sent to this process alone (kill
        # -INT, a supervisor), reach no worker — they tuned on until terminated 35 s later, their claims left
        # live. A worker that got the terminal's Ctrl-C too ignores the second (_raise_interrupt_once).
        for p in procs:
            if p.is_alive() and p.pid is not None:
                try:
                    os.kill(p.pid, signal.SIGINT)
                except ProcessLookupError:  # exited meanwhile
                    pass
        # Let them release their claims and report.
        deadline = time.time() + 30
        while (any(p.is_alive() for p in procs) or not q.empty()) and time.time() < deadline:
            try:
                drain(0.2)
            except KeyboardInterrupt:
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
    for i, p in enumerate(procs):
        if i not in reported and p.exitcode not in (0, None):
            errors.append(f"worker {i} died with exit code {p.exitcode}")
    ordered = [results[k] for k in dict.fromkeys(results)]
    if interrupted:
        raise Interrupted(ordered)
    if errors:
        emit({"type": "worker_errors", "errors": errors})
    return ordered


# ---- public API -----------------------------------------------------------------------------------


def run_tuning(
    problems: Sequence[AttentionProblem],
    *,
    cache: Union[str, CacheStore, None] = None,
    storage: Optional[str] = None,
    trials: Optional[int] = None,
    time_limit: Optional[float] = None,
    force: bool = False,
    workers: int = 1,
    gpus: Optional[Sequence[int]] = None,
    seed: int = 0,
    claim_ttl: float = CLAIM_TTL_S,
    timing: Optional[TimingOptions] = None,
    on_event: Optional[Event] = None,
    refine: Optional[int] = None,
) -> List[KeyResult]:
    """Tune ``problems`` (concrete: dtype and device_type set, e.g. by :func:`suites.materialize`) into
    ``cache`` (a path/URL or an open :class:`CacheStore`; default the user cache).

    ``storage``: optuna storage URL (default ``optuna.db`` next to a SQLite cache; ``"memory"`` for
    none). ``trials``: measured trials per key (default 24 on GPUs, 12 on the CPU). ``time_limit``:
    wall seconds for the whole run; no trial starts after it, the key in progress is left to a resume.
    ``refine``: extra trials per key for a hill climb from the budget's winner (:mod:`.sweep`, step 5; 0 off;
    default :data:`DEFAULT_REFINE`).
    ``workers``/``gpus``: worker processes (one per listed GPU; ``workers`` processes otherwise).
    Raises :class:`Interrupted` on Ctrl-C, carrying the results of the finished keys."""
    problems = list(problems)
    emit = on_event or (lambda ev: None)
    if not problems:
        return []
    dev_type = problems[0].device_type
    trials = trials or DEFAULT_TRIALS.get(dev_type, 12)
    refine = DEFAULT_REFINE if refine is None else refine
    deadline = time.time() + time_limit if time_limit else None
    opts = SweepOptions(
        trials=trials, deadline=deadline, force=force, seed=seed, timing=timing or TimingOptions(), refine=refine
    )
    run_start = utcnow()
    cache_url = cache.url if isinstance(cache, CacheStore) else (cache or user_cache_url())
    if storage is None:
        storage = default_storage_url(cache_url)
    gpu_list = list(gpus) if gpus is not None else None
    if dev_type == "cuda" and gpu_list is None and workers <= 1 and torch.cuda.device_count() > 1:
        gpu_list = list(range(torch.cuda.device_count()))  # one worker per visible GPU by default
    if gpu_list is not None and len(gpu_list) > 1:
        assignments: List[Optional[str]] = [str(g) for g in gpu_list]
        # ``workers`` larger than the GPU count adds workers round-robin over the GPUs.
        while len(assignments) < workers:
            assignments.append(str(gpu_list[len(assignments) % len(gpu_list)]))
    elif workers > 1:
        assignments = [str(gpu_list[0]) if gpu_list else None] * workers
    else:
        assignments = []
    n_keys = len({k.key_id for k in _keys_for_count(problems, gpu_list)})
    emit({"type": "keys", "total": n_keys, "workers": max(1, len(assignments))})
    if assignments:
        if storage == MEMORY:
            raise ValueError("several workers need a shared optuna storage (a URL), not 'memory'")
        # Create the cache's tables and the optuna storage here, once, before the workers start: an
        # unusable cache is then one clear error in the parent instead of one per worker, and the
        # workers do not all race to create the same schema (which they also survive).
        CacheStore(cache_url).dispose()
        open_storage(storage)
        base = {
            "problems": [p.model_dump_json() for p in problems],
            "cache": cache_url,
            "storage": storage,
            "trials": trials,
            "deadline": deadline,
            "force": force,
            "seed": seed,
            "refine": refine,
            "timing": opts.timing.__dict__,
            "run_start": run_start.isoformat(),
            "claim_ttl": claim_ttl,
        }
        return _run_processes(problems, assignments, base, emit)
    if gpu_list and dev_type == "cuda":
        torch.cuda.set_device(gpu_list[0])
    return run_worker(
        problems,
        cache=cache,
        storage=storage,
        options=opts,
        run_start=run_start,
        claim_ttl=claim_ttl,
        on_event=emit,
    )


def _keys_for_count(problems, gpu_list) -> List[TuneKey]:
    dev = torch.device(problems[0].device_type)
    if dev.type == "cuda":
        dev = torch.device("cuda", gpu_list[0] if gpu_list else torch.cuda.current_device())
    return resolve_keys(problems, dev)


def tune(problems: Sequence[AttentionProblem], **kwargs: Any) -> List[WinnerRecord]:
    """Tune ``problems`` and return the winner of every key that has one after the run (newly tuned
    or kept from the cache), in problem order. Keyword arguments are :func:`run_tuning`'s."""
    return [r.record for r in run_tuning(problems, **kwargs) if r.record is not None]


def tune_one(
    problem: AttentionProblem,
    store: CacheStore,
    trials: int = 6,
    time_limit: float = 5.0,
    storage: Optional[str] = MEMORY,
) -> Optional[WinnerRecord]:
    """Tune the key of one missed ``problem`` in place (the runtime's online policy), under ``trials``
    measured trials and ``time_limit`` seconds; writes the winner into ``store`` and returns it (None when
    nothing passed the gate, or another process holds the key's claim — it does not wait for it).
    Called off the hot path, on the caller's device; a key cut short by the time limit still gets the
    best of what was measured. No optuna storage by default (in-memory study)."""
    opts = SweepOptions(trials=trials, deadline=time.time() + time_limit, partial_ok=True)
    res = run_worker(
        [problem],
        cache=store,
        storage=storage,
        options=opts,
        run_start=utcnow(),
        wait_for_others=False,
        use_system_cache=False,
    )
    return res[0].record if res else None
