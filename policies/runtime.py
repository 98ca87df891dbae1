"""The process-wide runtime state: switches, the cache index, plans, slots, quarantine, misses.

Two caches of decisions:

* ``Runtime.plans``: ``(AttentionProblem, device)`` → :class:`Plan` — what :func:`attntune.policies.plan`
  returns; resolved under a lock, once per problem.
* :data:`SLOTS`: the hot path's cache, keyed by a cheap tuple signature of a call (shapes, dtypes,
  devices, flags) so that a repeated call never builds a pydantic problem. A :class:`Slot` holds exactly
  what the call needs (the bound ``run``, the problem, the config) plus its counters.
* :data:`FAMILIES`: bucket-level decisions for never-seen shapes. A call whose exact signature is new but
  whose *family signature* (the canonical mask, exact heads/head dims/dtypes/devices/flags, bucketed
  batch and lengths — exactly what its :class:`TuneKey` is made of) has been planned before reuses that
  plan once the variant accepts the exact shape (:meth:`Runtime.reuse_reasons`): one problem model
  built, no index look-up, no database. A decode loop sees a new KV length every step; this keeps it cheap.

Misses (calls without an exact tuned row) are counted in memory and written to the user cache *off the
hot path*: by a background thread a few seconds after the first one, at ``reset()``/``flush_misses()``
and at exit — never while a call waits.

Lock discipline: the hot path only reads ``SLOTS`` (a dict ``get``, atomic in CPython) and bumps its
slot's counters; everything that writes (resolution, quarantine, reset) holds ``Runtime.lock``. Slots
are never mutated to point at another variant: a changed decision is a new slot stored under the same
signature, so a thread that already holds the old slot finishes a consistent call.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import warnings
from collections import deque
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from attntune.device import device_fingerprint
from attntune.key import TuneKey
from attntune.policies.config import LOG, RuntimeConfig
from attntune.policies.index import CacheIndex
from attntune.policies.plan import Plan
from attntune.policies.policy import fallback_plan, resolve, usable
from attntune.problem import AttentionProblem

#: most latency samples kept per slot (a ring: the percentiles describe the recent past)
MAX_SAMPLES = 4096
#: most call signatures kept. A workload whose shapes never repeat (e.g. decode over a growing KV
#: tensor without kv_lens) would otherwise grow the slot and plan dicts without bound; past this many,
#: both are emptied (misses flushed first) and refill from the per-key decisions, which are kept.
MAX_SLOTS = 65536


class Slot:
    """One call signature's decision and counters (see the module docstring)."""

    __slots__ = ("fn", "problem", "config", "plan", "calls", "every", "miss", "reported", "samples",
                 "events", "device", "generic")

    def __init__(self, plan: Optional[Plan], fn: Callable, problem: Optional[AttentionProblem],
                 config: Any, every: int, device: Optional[torch.device], miss: bool = False,
                 reported: int = 0, generic: bool = False):
        self.plan = plan          # None: a pass-through to torch SDPA (drop-in inputs we do not cover)
        self.fn = fn              # fn(q, k, v, problem, config, kv_lens) -> out
        self.problem = problem
        self.config = config
        # Counted on the hot path without a lock (a lock and a method call cost ~180 ns there): between
        # the read and the write of ``calls`` there is no call and no backward jump, the points where
        # CPython's GIL build switches threads. Counts were lost only when a slot that had served calls
        # was replaced by another thread's for the same signature — slots are stored once (dispatch._put_once).
        self.calls = 0
        self.every = every        # sample latency every Nth call (0 = never)
        self.miss = miss          # served without an exact tuned row (counted for --from-misses)
        self.reported = reported  # calls already written to the misses table
        # Created on the first sampled call: a decode loop makes a slot per KV length, and every object a
        # slot holds is one more for the garbage collector to walk (Python's full collections grow with
        # the number of live objects).
        self.samples: Optional[deque] = None  # milliseconds (deque(maxlen=MAX_SAMPLES))
        self.events: Optional[list] = None    # CUDA event pairs not yet read (read in stats(), never per call)
        self.device = device
        # True: ``fn`` serves every shape of the plan's family (Variant.family_generic) and this one slot
        # is stored under each of their signatures; ``problem`` is then the family's first shape, and
        # the exact problem of a call is built only where one is needed (a failure's fallback)
        self.generic = generic


#: the hot path's signature → Slot dict (one object for the life of the process; reset() clears it)
SLOTS: Dict[tuple, Slot] = {}
#: family signature → the Slot whose plan other shapes of that family reuse (see the module docstring)
FAMILIES: Dict[tuple, Slot] = {}
#: seconds between background writes of misses (the first write happens this long after the first miss)
MISS_FLUSH_SECONDS = 5.0
#: the online policy's tuner, ``tune_one(problem, store, trials=, time_limit=) -> WinnerRecord | None``;
#: set by the layer above (:mod:`attntune.api`) so that the policies never import the tuner themselves
ONLINE_TUNER: Optional[Callable] = None


def _fp8_unloaded(*args, **kwargs):
    raise RuntimeError("FP8 K/V calls need attntune.policies.fp8 (imported by attntune.api, hence by attntune)")


#: ``attention()``'s path for FP8 K/V calls (``k_scale``/``v_scale``): set by :mod:`attntune.policies.fp8`
#: when imported (dispatch cannot import it: it imports dispatch)
FP8_ATTENTION = _fp8_unloaded
#: ``explain()``'s counterpart for FP8 K/V calls, set by the same module
FP8_EXPLAIN = _fp8_unloaded

#: ``ATTNTUNE_CHECK`` of the current runtime (a module global: the hot path reads it without a call)
CHECK = False
#: calls with no slot: drop-in calls with a mask or dropout, handed to torch before any look-up
COUNTS: Dict[str, int] = {"passthrough": 0}


def _device_key(problem: AttentionProblem, device: Optional[torch.device | str]) -> torch.device:
    if device is not None:
        d = torch.device(device)
        if d.type == "cuda" and d.index is None and torch.cuda.is_available():
            d = torch.device("cuda", torch.cuda.current_device())
        return d
    if problem.device_type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(problem.device_type)


def _fingerprint(dev: torch.device):
    # Devices other than cpu/cuda (meta, mps, …) have no tuned rows; the CPU fingerprint keeps keys
    # well-formed, and no CPU row can match their problem's device_type-dependent supports().
    return device_fingerprint(dev if dev.type == "cuda" else "cpu")


class Runtime:
    """Everything one process has decided. Replaced wholesale by :func:`reset`."""

    def __init__(self) -> None:
        global CHECK
        self.config = RuntimeConfig.from_env()
        CHECK = self.config.check
        self.config.apply_logging()
        self._warned: Set[str] = set()
        for w in self.config.warnings:
            self.warn_once(f"config:{w}", w)
        self.lock = threading.RLock()
        self._index: Optional[CacheIndex] = None
        self.plans: Dict[Tuple[AttentionProblem, str], Plan] = {}
        # (key id, device, scale) -> the plan decided for the first problem of that key: other shapes
        # of the bucket reuse the decision (buckets only decide speed, never correctness) after the
        # variant's supports()/space() accept their exact shape — no index look-up, no miss write.
        self.by_key: Dict[Tuple[str, str, Optional[float]], Plan] = {}
        self.missed: Set[str] = set()
        self.quarantine: Set[Tuple[str, str]] = set()
        self.quarantine_why: Dict[Tuple[str, str], str] = {}
        self.pending: Dict[str, Tuple[TuneKey, int]] = {}
        #: variants whose split backward (Variant.backward_saved) raised in the compiled training op: their
        #: calls there recompute the forward from then on (dispatch._splitting), warned once
        self.no_split: Set[str] = set()
        self._flusher: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def warn_once(self, tag: str, msg: str) -> None:
        """One RuntimeWarning per tag for the life of this runtime (``reset()`` starts afresh)."""
        if tag in self._warned:
            return
        self._warned.add(tag)
        warnings.warn(f"attntune: {msg}", RuntimeWarning, stacklevel=4)

    # ---- the cache index (loaded on first need, once) --------------------------------------------
    def index(self) -> CacheIndex:
        if self._index is None:
            with self.lock:
                if self._index is None:
                    self._index = CacheIndex.load(self.config.cache_timeout)
        return self._index

    # ---- plans ------------------------------------------------------------------------------------
    def plan_for(self, problem: AttentionProblem, device: Optional[torch.device | str] = None,
                 dry: bool = False) -> Plan:
        return self.resolve(problem, device, dry)[0]

    def resolve(self, problem: AttentionProblem, device: Optional[torch.device | str] = None,
                dry: bool = False) -> Tuple[Plan, bool]:
        """``(plan, fresh_miss)``: the cached plan, or a new one (``fresh_miss`` when this resolution
        found no exact tuned row and recorded one miss). ``dry`` (explain): nothing is cached,
        recorded or tuned."""
        dev = _device_key(problem, device)
        ck = (problem, str(dev))
        p = self.plans.get(ck)
        if p is not None:
            return p, False
        with self.lock:
            p = self.plans.get(ck)
            if p is not None:
                return p, False
            key = TuneKey.from_problem(problem, _fingerprint(dev))
            kk = (key.key_id, str(dev), problem.scale)
            plan = self._reuse(self.by_key.get(kk), problem, key)
            missed = False
            if plan is None:
                plan, missed = resolve(problem, key, self.config, self.index, self.quarantine, dry=dry,
                                       tuner=ONLINE_TUNER,
                                       warn=self.warn_once)
                if not dry:
                    self.by_key[kk] = plan
            if dry:
                return plan, False
            self.plans[ck] = plan
            if LOG.isEnabledFor(20):
                LOG.info("plan %s -> %s %s (%s)%s", problem.short(), plan.variant, plan.config_json,
                         plan.source, "" if not plan.reasons else ": " + " | ".join(plan.reasons))
            if missed:
                self.missed.add(key.key_id)
                self._add_pending(key, 1)
                self._start_flusher()
            return plan, missed

    def _reuse(self, prev: Optional[Plan], problem: AttentionProblem, key: TuneKey) -> Optional[Plan]:
        """``prev``'s decision for another shape of the same key, if its variant runs this shape."""
        cfg = self.config
        if prev is None or prev.source == "fallback" or cfg.disabled:
            return None  # fallbacks are per problem (quarantine, limits): decided afresh
        if cfg.too_long(problem):
            return None
        if usable(prev.variant, prev.config, problem, self.quarantine):
            return None
        return dataclasses.replace(prev, problem=problem, key=key)

    def reuse_reasons(self, plan: Plan, problem: AttentionProblem) -> List[str]:
        """Why ``plan`` (decided for another shape of ``problem``'s family) cannot serve ``problem``:
        the runtime's length limit and the variant's own :meth:`~attntune.kernels.base.Variant.reuse_reasons`.
        Environment switches, quarantine and the cache were settled when the family's plan was resolved
        (a quarantine drops the family's entry)."""
        cfg = self.config
        if cfg.too_long(problem):
            return [f"longer than ATTNTUNE_MAX_SEQLEN={cfg.max_seqlen}"]
        return plan.impl.reuse_reasons(problem, plan.config)

    def overflow(self) -> None:
        """Empty SLOTS and the per-problem plans (see :data:`MAX_SLOTS`); per-key decisions stay."""
        with self.lock:
            self._collect_slot_misses()
            LOG.info("%d call signatures: dropping per-shape slots and plans (telemetry restarts)", len(SLOTS))
            SLOTS.clear()
            self.plans.clear()

    # ---- misses -----------------------------------------------------------------------------------
    def _add_pending(self, key: TuneKey, n: int) -> None:
        if n <= 0:
            return
        old = self.pending.get(key.key_id)
        self.pending[key.key_id] = (key, n + (old[1] if old else 0))

    def _collect_slot_misses(self) -> None:
        """Move the calls counted on miss slots since the last flush into ``pending`` (holds the lock)."""
        for slot in list(SLOTS.values()):
            if slot.miss and slot.plan is not None and slot.plan.key is not None:
                n = slot.calls - slot.reported
                if n > 0:
                    slot.reported += n
                    self._add_pending(slot.plan.key, n)

    def flush_misses(self) -> None:
        """Write the misses seen so far (one per resolution plus the calls since) to the user cache.
        Called by the background flusher, by reset() and at exit — never on a call's path. The lock is
        held only to take the pending counts; the database write happens outside it, so a slow or locked
        cache never holds up a thread that is resolving a plan."""
        with self.lock:
            self._collect_slot_misses()
            if not self.pending or self._index is None:  # nothing resolved against a cache: nothing to write
                return
            pending, self.pending = self.pending, {}
            index = self._index
        left = index.flush_misses(pending)
        if left:  # the cache is locked or unwritable now: keep the counts for the next flush
            with self.lock:
                for key, n in left.values():
                    self._add_pending(key, n)

    def _start_flusher(self) -> None:
        """Start the background miss writer once (a daemon thread; stopped by close())."""
        if self._flusher is not None or self._stop.is_set():
            return  # running, or closed (reset() in another thread): close() flushed what it had
        t = threading.Thread(target=self._flush_loop, name="attntune-misses", daemon=True)
        t.start()
        self._flusher = t  # published started: close() from another thread joins it (joining an unstarted
        # thread raises)

    def _flush_loop(self) -> None:
        while not self._stop.wait(MISS_FLUSH_SECONDS):
            try:
                self.flush_misses()
            except Exception as e:  # noqa: BLE001 — telemetry; the final flush at close() tries again
                LOG.debug("background flush of misses failed: %s", e)

    # ---- failure handling -------------------------------------------------------------------------
    def resolve_excluding(self, problem: AttentionProblem, device, excluded: Set[Tuple[str, str]]) -> Plan:
        """The plan :meth:`resolve` would decide for ``problem`` with the ``(variant, config_json)`` tags of
        ``excluded`` quarantined too. Nothing is cached, recorded or tuned (the caller keeps the plan in
        its own slot): for calls that cannot use the process's plan (the compiled op, see
        :attr:`~attntune.kernels.base.Variant.runs_in_compiled_op`)."""
        dev = _device_key(problem, device)
        key = TuneKey.from_problem(problem, _fingerprint(dev))
        # no warnings: the resolution for the process's own plan said what there was to say
        plan, _ = resolve(problem, key, self.config, self.index, frozenset(self.quarantine | excluded), dry=True,
                          warn=lambda _tag, _msg: None)
        return plan

    def quarantine_plan(self, plan: Plan, error: BaseException, problem: Optional[AttentionProblem] = None) -> Plan:
        """Quarantine ``plan``'s (variant, config) for this process after it raised ``error``; every
        plan using it is dropped (re-resolved on next use, skipping it), and the failing call's
        ``problem`` (default: ``plan``'s own; another shape of its family when a family-generic slot
        failed) gets the safe fallback, which is returned."""
        problem = plan.problem if problem is None else problem
        tag = (plan.variant, plan.config_json)
        why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        with self.lock:
            if tag not in self.quarantine:
                self.quarantine.add(tag)
                self.quarantine_why[tag] = why
                self.warn_once(f"quarantine:{tag}",
                          f"{plan.variant} {plan.config_json} failed on {problem.short()} ({why}); "
                          "it is quarantined for this process and calls fall back to torch SDPA/eager")
            fb = fallback_plan(problem, plan.key, [f"{plan.variant} failed here: {why}"], self.quarantine)
            for ck, p in list(self.plans.items()):
                if ck[0] == problem:
                    self.plans[ck] = fb  # this problem: the safe fallback from now on
                elif p is plan or (p.variant, p.config_json) == tag:
                    del self.plans[ck]   # other problems: re-resolved on next use, skipping the tag
            for kk, p in list(self.by_key.items()):
                if (p.variant, p.config_json) == tag:
                    del self.by_key[kk]
            for fam, slot in list(FAMILIES.items()):
                if slot.plan is not None and (slot.plan.variant, slot.plan.config_json) == tag:
                    del FAMILIES[fam]
            for sig, slot in list(SLOTS.items()):
                if slot.plan is not None and slot.plan is not fb and (
                        slot.plan.variant, slot.plan.config_json) == tag:
                    del SLOTS[sig]
            return fb

    def close(self) -> None:
        self._stop.set()
        t = self._flusher
        if t is not None and t is not threading.current_thread():
            t.join(timeout=MISS_FLUSH_SECONDS)
        try:
            self.flush_misses()
        except Exception as e:  # noqa: BLE001 — telemetry must not break interpreter exit
            LOG.debug("flushing misses failed: %s", e)
        if self._index is not None:
            self._index.close()


_RT: Optional[Runtime] = None
_RT_LOCK = threading.Lock()
_ATEXIT = False


def get() -> Runtime:
    """The runtime, created on first use (that is when the environment switches are read)."""
    global _RT, _ATEXIT
    rt = _RT
    if rt is not None:
        return rt
    with _RT_LOCK:
        if _RT is None:
            _RT = Runtime()
            if not _ATEXIT:
                atexit.register(_at_exit)
                _ATEXIT = True
        return _RT


def plan(problem: AttentionProblem, device: Optional[torch.device | str] = None) -> Plan:
    """The plan for ``problem`` on ``device`` (default: the problem's device type, current index),
    resolved once per process by the active policy and cached; misses are recorded like a call's.
    Raises ``ValueError`` naming ``problem`` or ``device`` when they are not a problem / a device here."""
    if not isinstance(problem, AttentionProblem):
        raise ValueError(f"problem: expected an attntune.AttentionProblem (attntune.problem_from_tensors makes "
                         f"one), got {type(problem).__name__}")
    dev_type = problem.device_type
    if device is not None:
        try:
            dev_type = torch.device(device).type
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device: {device!r} is not a device this torch can use ({e})") from None
    if dev_type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{'device' if device is not None else 'problem'}: a CUDA/ROCm plan needs a GPU, and "
                         "this torch sees none (plans are resolved against the device's fingerprint)")
    return get().plan_for(problem, device)


def reset() -> None:
    """Flush misses, drop every plan and slot, forget quarantines and re-read the environment on next
    use. For tests and for applications that changed ``ATTNTUNE_*`` or the float32 matmul precision."""
    global _RT
    with _RT_LOCK:
        rt, _RT = _RT, None
        COUNTS["passthrough"] = 0
    # The old runtime is closed and the tables cleared after _RT_LOCK is released: a thread resolving a
    # plan holds rt.lock and may need _RT_LOCK (get()), so waiting for rt.lock while holding _RT_LOCK
    # deadlocked reset() against concurrent calls of new shapes. A runtime another thread creates
    # meanwhile may see its first slots cleared here: they are rebuilt on the next call.
    if rt is not None:
        rt.close()  # not under rt.lock: it joins the flusher thread, which takes that lock
        with rt.lock:
            SLOTS.clear()
            FAMILIES.clear()
    else:
        SLOTS.clear()
        FAMILIES.clear()


def _at_exit() -> None:
    rt = _RT
    if rt is not None:
        rt.close()
