"""What a database error's text says went wrong, for the advice printed with it.

SQLite (and the drivers above it) report a full disk, a read-only file and a damaged file each in a few
wordings; the fix differs — free space, make it writable, restore or delete the file — and deleting is the
wrong advice for the first two (it throws a good file away). Plain string matching on the first line of
the message; no database module is imported here (the CLI's error path uses it).
"""

from __future__ import annotations

from typing import Optional

#: cause -> lower-case fragments of the messages that show it
_NEEDLES = (
    ("full", ("disk is full", "no space left")),
    ("readonly", ("readonly", "read-only", "permission denied", "unable to open")),
    # SQLite's "disk I/O error" when it cannot create or grow the -wal/-shm files next to a database: in
    # practice a full disk or a directory it may not write
    ("io", ("disk i/o error",)),
    ("damaged", ("malformed", "not a database", "file is encrypted")),
)

#: advice for a cause, for any database the user points attntune at (the cache or the optuna storage)
ADVICE = {
    "full": "the disk is full: free space and run again",
    "readonly": "it cannot be written here: make the file and its directory writable, or use another path",
    "io": "SQLite could not use the files next to it (-wal/-shm): the disk may be full, or the directory "
          "read-only",
}


def cause_of(message: str) -> Optional[str]:
    """``"full"``, ``"readonly"``, ``"io"``, ``"damaged"`` or None for an error message."""
    low = message.lower()
    for cause, needles in _NEEDLES:
        if any(n in low for n in needles):
            return cause
    return None
