"""The in-memory index of tuned winners: loaded once, consulted only when a plan is resolved.

Exact lookup is a dict by ``TuneKey.key_id``. Nearest lookup searches the key's family (same device,
dtype, heads, head dims, causal/alignment, window class, kv_lens, mode, approx: ``TuneKey.family()``)
for the smallest ``TuneKey.distance`` — the log2 distance over the bucketed sizes — and refuses
neighbours farther than :data:`MAX_NEAREST_DISTANCE`. Sibling lookup (:meth:`CacheIndex.siblings`) does the
same over the rows of the other devices of this device's architecture (``TuneKey.arch_family()``), for a
device that has no usable row of the key's family itself (a GH200 served by the shipped H100/H200 rows).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Tuple

from attntune.cache import CachedRow, CacheStore, LayeredCache, WinnerRecord
from attntune.cache.layered import user_cache_url, warn_once
from attntune.kernels import registry
from attntune.key import TuneKey
from attntune.policies.config import LOG

#: Farthest neighbour (``TuneKey.distance``, log2 units) whose winner may stand in for an untuned key.
#: 2.0 is e.g. a 4x change of one sequence length, or 2x of both, or 16x of the batch (weighted 0.5).
#: Farther than that the winner's tiling/split choices were made for a different regime; the
#: heuristic policy is then the more honest answer.
MAX_NEAREST_DISTANCE = 2.0


class CacheIndex:
    """Valid winners of the layered cache, by key id and by key family.

    ``rows`` are the records the layered cache judged ``valid`` (stale and rejected rows never get
    here). ``user`` is the writable store misses are flushed to (None when it could not be opened).
    """

    def __init__(self, records: Iterable[WinnerRecord] = (), layers: Optional[LayeredCache] = None,
                 error: Optional[str] = None, user_url: Optional[str] = None, timeout_s: float = 0.1):
        self.by_id: Dict[str, WinnerRecord] = {}
        self.by_family: Dict[tuple, List[WinnerRecord]] = defaultdict(list)
        #: the same rows by ``TuneKey.arch_family()`` (every device of one architecture)
        self.by_arch_family: Dict[tuple, List[WinnerRecord]] = defaultdict(list)
        self.layers = layers
        self.error = error
        self.user_url = user_url
        self.timeout_s = timeout_s
        self._user: Optional[CacheStore] = None
        #: why the online policy stopped tuning in this process (its first failure), or None
        self.online_off: Optional[str] = None
        #: key_id -> the stale-by-versions row of keys without a valid one (see CachedRow.hint)
        self.hints: Dict[str, CachedRow] = {}
        self._lock = threading.Lock()
        for rec in records:
            self.add(rec)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def load(cls, timeout_s: float = 0.1) -> "CacheIndex":
        """Open the default layers (``ATTNTUNE_CACHE`` then the shipped cache) read-only, waiting at
        most ``timeout_s`` for a locked database, and index their valid rows. Never raises: an unusable
        or locked layer is skipped with one warning (the layered cache warns per layer; anything else
        that goes wrong is reported here, once) and dispatch uses what is left, down to heuristics."""
        url = user_cache_url()
        try:
            layers = LayeredCache.open_default(timeout_s=timeout_s, user_readonly=True, variants=registry)
        except Exception as e:  # noqa: BLE001 — a broken cache must never take the application down
            warn_once("index:open", f"tuning cache could not be opened ({type(e).__name__}: {e}); "
                                    "using heuristic dispatch")
            return cls(error=str(e), user_url=url, timeout_s=timeout_s)
        try:
            rows = list(layers.effective().values())
        except Exception as e:  # noqa: BLE001
            warn_once("index:read", f"tuning cache could not be read ({type(e).__name__}: {e}); "
                                    "using heuristic dispatch")
            return cls(layers=layers, error=str(e), user_url=url, timeout_s=timeout_s)
        idx = cls([r.record for r in rows if r.status == "valid"], layers=layers, user_url=url, timeout_s=timeout_s)
        idx.hints = {r.key_id: r for r in rows if r.status == "stale" and r.hint}
        LOG.debug("cache index: %d valid rows, %d hints from %s", len(idx.by_id), len(idx.hints),
                  ", ".join(f"{label}={st.shown}" for label, st in layers.layers) or "no layer")
        if idx.hints:  # one line for the process, never per call
            LOG.info("%d cached rows were tuned under other torch/triton/CUDA versions and serve as hints; "
                     "`attntune tune --revalidate` re-times them for this software", len(idx.hints))
        return idx

    def add(self, rec: WinnerRecord) -> None:
        """Index one record (used at load time and by the online policy after tuning a key)."""
        with self._lock:
            old = self.by_id.get(rec.key_id)
            fams = (self.by_family[rec.key.family()], self.by_arch_family[rec.key.arch_family()])
            for fam in fams:
                if old is not None:
                    fam[:] = [r for r in fam if r.key_id != rec.key_id]
                fam.append(rec)
            self.by_id[rec.key_id] = rec

    @property
    def user(self) -> Optional[CacheStore]:
        """The writable user cache (misses, online tuning), opened on first need with the short
        timeout; after a failure (locked, read-only, broken) tried again at the next need, so a lock
        that goes away loses nothing. Needed off the hot path (the miss flusher, every few seconds) or
        by the online policy, which tunes on the call path by design."""
        if self._user is not None or self.user_url is None:
            return self._user
        with self._lock:
            if self._user is None:
                try:
                    self._user = CacheStore(self.user_url, timeout_s=self.timeout_s, lock_attempts=1)
                except Exception as e:  # noqa: BLE001 — the reading side has already warned if it is broken
                    LOG.debug("user cache %s not writable now: %s", self.user_url, e)
        return self._user

    def __len__(self) -> int:
        return len(self.by_id)

    # ---- lookups ----------------------------------------------------------------------------------
    def exact(self, key: TuneKey) -> Optional[WinnerRecord]:
        return self.by_id.get(key.key_id)

    def hint(self, key: TuneKey) -> Optional[CachedRow]:
        """The key's row tuned under other versions of torch/triton/CUDA (same variant source), if any."""
        return self.hints.get(key.key_id)

    def nearest(self, key: TuneKey, max_distance: float = MAX_NEAREST_DISTANCE
                ) -> List[Tuple[float, WinnerRecord]]:
        """Rows of ``key``'s family within ``max_distance``, nearest first (ties: faster row first),
        excluding ``key`` itself. The caller takes the first one whose variant can run the problem."""
        out = []
        for rec in self.by_family.get(key.family(), ()):
            if rec.key_id == key.key_id:
                continue
            d = key.distance(rec.key)
            if d <= max_distance:
                out.append((d, rec))
        out.sort(key=lambda t: (t[0], t[1].median_ms))
        return out

    def siblings(self, key: TuneKey, max_distance: float = MAX_NEAREST_DISTANCE
                 ) -> List[Tuple[float, WinnerRecord]]:
        """Rows of ``key``'s family tuned on *other* devices of its architecture, within ``max_distance``
        (``TuneKey.sibling_distance``: the sizes' distance plus the log2 ratio of the unit counts), nearest
        first (ties: faster row first). Their configs were measured elsewhere: a plan from them is a
        better first guess than the rule table, not a measurement of this device."""
        out = []
        for rec in self.by_arch_family.get(key.arch_family(), ()):
            d = key.sibling_distance(rec.key)
            if d <= max_distance:
                out.append((d, rec))
        out.sort(key=lambda t: (t[0], t[1].median_ms))
        return out

    # ---- misses -----------------------------------------------------------------------------------
    def flush_misses(self, pending: Dict[str, Tuple[TuneKey, int]]) -> Dict[str, Tuple[TuneKey, int]]:
        """Write ``pending`` miss counts to the user cache; return what could not be written (the
        caller keeps it for the next flush: nothing is lost while a lock is held elsewhere). Never
        raises; waits at most the short timeout per statement."""
        left = dict(pending)
        if not left:
            return left
        store = self.user
        if store is None:
            return left
        for kid, (key, count) in list(left.items()):
            try:
                store.record_miss(key, count)
            except Exception as e:  # noqa: BLE001 — read-only FS, locked DB, …: telemetry, not a failure
                LOG.debug("could not record a miss in %s: %s", store.url, e)
                return left
            del left[kid]
        return left

    def close(self) -> None:
        for closer in ((self.layers.close if self.layers is not None else None),
                       (self._user.dispose if self._user is not None else None)):
            if closer is None:
                continue
            try:
                closer()
            except Exception:  # noqa: BLE001
                pass
