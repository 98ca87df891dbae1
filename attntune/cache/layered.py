"""The layered cache (as MIOpen's): the writable user cache first, then the shipped read-only system
``cache.db``. A layer that cannot be opened or read is skipped with one warning — never a crash."""

from __future__ import annotations

import os
import sys
import sysconfig
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from attntune.cache.models import CachedRow, judge
from attntune.cache.store import CacheStore

_WARNED: set = set()


def warn_once(tag: str, msg: str) -> None:
    if tag in _WARNED:
        return
    _WARNED.add(tag)
    warnings.warn(f"attntune: {msg}", RuntimeWarning, stacklevel=3)


def user_cache_url() -> str:
    """``ATTNTUNE_CACHE`` (path or URL), else ``$XDG_CACHE_HOME/attntune/cache.db`` (~/.cache/…)."""
    env = os.environ.get("ATTNTUNE_CACHE")
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


def open_store(url: str, readonly: bool, label: str) -> Optional[CacheStore]:
    try:
        return CacheStore(url, readonly=readonly)
    except Exception as e:  # noqa: BLE001 — includes CacheError, sqlite DatabaseError, driver errors
        warn_once(f"open:{url}", f"{label} cache {url} is unusable ({e}); ignoring it")
        return None


class LayeredCache:
    """Ordered layers ``[(label, store)]``; earlier layers win for the same key."""

    def __init__(self, layers: List[Tuple[str, CacheStore]]):
        self.layers = layers

    @classmethod
    def open_default(cls, user_url: Optional[str] = None, system: bool = True) -> "LayeredCache":
        layers: List[Tuple[str, CacheStore]] = []
        url = user_url or user_cache_url()
        st = open_store(url, readonly=False, label="user")
        if st is not None:
            layers.append(("user", st))
        sys_path = system_cache_path() if system else None
        if sys_path is not None:
            st = open_store(str(sys_path), readonly=True, label="system")
            if st is not None:
                layers.append(("system", st))
        return cls(layers)

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
        except Exception as e:  # noqa: BLE001 — corrupted pages, dropped connection, …
            warn_once(f"read:{st.url}", f"{label} cache {st.url} could not be read ({e}); ignoring it")
            return []

    def all_rows(self) -> List[CachedRow]:
        """Every row of every layer, judged (shadowed rows of lower layers included)."""
        out = []
        for label, st in self.layers:
            out.extend(judge(raw, label) for raw in self._raw(label, st))
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

    def close(self) -> None:
        for _, st in self.layers:
            st.dispose()
