"""The layered cache (as MIOpen's): the writable user cache first, then the shipped read-only system
``cache.db``. A layer that cannot be opened or read is skipped with one warning — never a crash."""

from __future__ import annotations

import os
import sys
import sysconfig
import warnings
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

from sqlalchemy.engine import make_url

from attntune.cache.models import CachedRow, judge
from attntune.cache.store import CacheStore, display_url, normalize_url

_WARNED: set = set()


def warn_once(tag: str, msg: str) -> None:
    if tag in _WARNED:
        return
    _WARNED.add(tag)
    warnings.warn(f"attntune: {msg}", RuntimeWarning, stacklevel=3)


def _missing_file(url: str) -> bool:
    """True when ``url`` (path or URL) names an SQLite file that does not exist yet."""
    try:
        u = make_url(normalize_url(url))
    except Exception:  # noqa: BLE001 — a bad URL is for the store to report
        return False
    return u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:") \
        and not Path(u.database).exists()


def user_cache_url() -> str:
    """``ATTNTUNE_CACHE`` (path or URL), else ``$XDG_CACHE_HOME/attntune/cache.db`` (~/.cache/…)."""
    env = (os.environ.get("ATTNTUNE_CACHE") or "").strip()  # " " is unset, not a file named " "
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "attntune", "cache.db")


def system_cache_path() -> Optional[Path]:
    """The shipped ``cache.db`` (``ATTNTUNE_SYSTEM_CACHE`` overrides; empty string disables it)."""
    env = os.environ.get("ATTNTUNE_SYSTEM_CACHE")
    if env is not None:
        return Path(env) if env else None
    for path in shipped_cache_candidates():
        if path.exists():
            return path
    return None


def shipped_cache_candidates() -> List[Path]:
    """Where the shipped ``cache.db`` may be, in order: the source tree's top level (a checkout or an
    editable install), then the install's data directory, where wheels put it (``share/attntune``)."""
    out = [Path(__file__).resolve().parent.parent.parent / "cache.db"]  # repo root next to attntune/
    # base_prefix: attntune installed outside a --system-site-packages venv
    for root in (sysconfig.get_path("data"), sys.prefix, sys.base_prefix):
        p = Path(root) / "share" / "attntune" / "cache.db"
        if p not in out:
            out.append(p)
    return out


class LayerFailure(NamedTuple):
    """A configured cache layer that could not be opened or read, and why (for ``doctor`` and warnings)."""

    label: str
    url: str
    reason: str


def open_store(url: str, readonly: bool, label: str, timeout_s: Optional[float] = None,
               failures: Optional[List[LayerFailure]] = None) -> Optional[CacheStore]:
    """``CacheStore(url)``, or None with one warning (and a :class:`LayerFailure` appended to
    ``failures``) when it cannot be used. ``timeout_s`` (None: the store's long default) bounds the
    wait for a locked database; with a short one, the WAL switch is tried once."""
    kw = {} if timeout_s is None else {"timeout_s": timeout_s, "lock_attempts": 1}
    try:
        return CacheStore(url, readonly=readonly, **kw)
    except Exception as e:  # noqa: BLE001 — includes CacheError, sqlite DatabaseError, driver errors
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if failures is not None:
            failures.append(LayerFailure(label, display_url(normalize_url(url)), reason))
        warn_once(f"open:{url}", f"{label} cache {display_url(url)} is unusable ({reason}); ignoring it")
        return None


class LayeredCache:
    """Ordered layers ``[(label, store)]``; earlier layers win for the same key. ``failures`` lists the
    configured layers that could not be opened (or, once read, could not be read): they are skipped,
    never fatal."""

    def __init__(self, layers: List[Tuple[str, CacheStore]], failures: Optional[List[LayerFailure]] = None,
                 variants=None):
        self.layers = layers
        self.failures: List[LayerFailure] = list(failures or [])
        self.variants = variants  # what judge() checks rows against (see attntune.cache.models.judge)

    @classmethod
    def open_default(cls, user_url: Optional[str] = None, system: bool = True, timeout_s: Optional[float] = None,
                     user_readonly: bool = False, variants=None) -> "LayeredCache":
        """The user cache (``user_url`` or :func:`user_cache_url`), then the shipped system cache.

        ``user_readonly``: open the user cache read-only and only if it exists (the runtime reads it
        this way; it writes misses through a store of its own, off the hot path). ``timeout_s``: see
        :func:`open_store`."""
        layers: List[Tuple[str, CacheStore]] = []
        failures: List[LayerFailure] = []
        url = user_url or user_cache_url()
        if not (user_readonly and _missing_file(url)):
            st = open_store(url, readonly=user_readonly, label="user", timeout_s=timeout_s, failures=failures)
            if st is not None:
                layers.append(("user", st))
        sys_path = system_cache_path() if system else None
        if sys_path is not None:
            st = open_store(str(sys_path), readonly=True, label="system", timeout_s=timeout_s, failures=failures)
            if st is not None:
                layers.append(("system", st))
        return cls(layers, failures, variants)

    @property
    def user(self) -> Optional[CacheStore]:
        """The writable layer (None if it could not be opened)."""
        for label, st in self.layers:
            if not st.readonly:
                return st
        return None

    def _raw(self, label: str, st: CacheStore) -> List[dict]:
        try:
            return st.raw_winners()
        except Exception as e:  # noqa: BLE001 — corrupted pages, a dropped table, a lock, …
            reason = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
            if not any(f.url == st.shown for f in self.failures):
                self.failures.append(LayerFailure(label, st.shown, f"cannot be read: {reason}"))
            warn_once(f"read:{st.url}", f"{label} cache {st.shown} could not be read ({reason}); ignoring it")
            return []

    def all_rows(self) -> List[CachedRow]:
        """Every row of every layer, judged (shadowed rows of lower layers included)."""
        out = []
        for label, st in self.layers:
            out.extend(judge(raw, label, self.variants) for raw in self._raw(label, st))
        return out

    def effective(self) -> Dict[str, CachedRow]:
        """key_id -> the row that applies: the first *valid* row across layers, else the first row
        seen (stale/rejected, for reporting)."""
        chosen: Dict[str, CachedRow] = {}
        for row in self.all_rows():
            cur = chosen.get(row.key_id)
            if cur is None or (cur.status != "valid" and row.status == "valid"):
                chosen[row.key_id] = row
        return chosen

    def valid_records(self):
        return [r.record for r in self.effective().values() if r.status == "valid"]

    def hint_records(self):
        """Records of keys without a valid row whose applying row is a hint (stale by versions only)."""
        return [r.record for r in self.effective().values() if r.status == "stale" and r.hint]

    def close(self) -> None:
        for _, st in self.layers:
            st.dispose()
