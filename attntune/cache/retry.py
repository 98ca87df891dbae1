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


#: How long :func:`retry_locked` keeps retrying, in all. The retries are for SQLITE_BUSY returned at once
#: (resolved in milliseconds); an attempt that failed after waiting out the busy timeout (30 s in the CLI and
#: the tuner) met a lock another process *holds*, and seven more such waits turned one write into 4 minutes
#: during which `tune` ignored its --time-limit and, inside a claim's release, Ctrl-C (audit: 251 s, and a
#: run still going 12 minutes after Ctrl-C and SIGTERM). Below the busy timeout, so that an attempt which
#: waited it out is never retried: past this budget the lock error is raised.
LOCK_BUDGET_S = 20.0


def retry_locked(fn: Callable[..., T], *args, attempts: int = 8, budget_s: float = LOCK_BUDGET_S,
                 **kwargs) -> T:
    """Call ``fn(*args, **kwargs)``; on a lock error wait (exponential backoff with jitter) and retry — at
    most ``attempts`` times and while less than ``budget_s`` seconds have passed since the first call."""
    start = time.monotonic()
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except (OperationalError, sqlite3.OperationalError) as e:
            if not is_locked(e) or i == attempts - 1 or time.monotonic() - start >= budget_s:
                raise
            time.sleep(0.05 * (2**i) * (0.5 + random.random()))
    raise AssertionError("unreachable")
