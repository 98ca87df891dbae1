"""Retrying database calls that SQLite refuses with ``database is locked``.

Several tuner processes write one SQLite file (the cache and the optuna storage). The busy timeout makes
most writers wait their turn, but SQLite still returns SQLITE_BUSY at once in some cases (a read
transaction that must become a write transaction after another process committed; switching a file
into WAL while a neighbour does the same), so every write of the tuner, and the WAL switch of every
connection, goes through :func:`retry_locked`. Both the driver's own ``sqlite3.OperationalError``
(raw connections, connect-time pragmas) and SQLAlchemy's wrapper of it count.
"""

from __future__ import annotations

import random
import sqlite3
import time
from typing import Callable, TypeVar

from sqlalchemy.exc import OperationalError

T = TypeVar("T")


def is_locked(e: BaseException) -> bool:
    msg = str(e).lower()
    return isinstance(e, (OperationalError, sqlite3.OperationalError)) and ("locked" in msg or "busy" in msg)


def retry_locked(fn: Callable[..., T], *args, attempts: int = 8, **kwargs) -> T:
    """Call ``fn(*args, **kwargs)``; on a lock error wait (exponential backoff with jitter) and retry."""
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except (OperationalError, sqlite3.OperationalError) as e:
            if not is_locked(e) or i == attempts - 1:
                raise
            time.sleep(0.05 * (2**i) * (0.5 + random.random()))
    raise AssertionError("unreachable")
