"""Key claims between tuner processes (one per GPU, or many hosts on one database).

Protocol, per key and worker (``owner`` = host:pid:worker):

1. skip the key if the target cache already holds a valid winner (unless ``--force`` asked to redo
   winners written before this run started);
2. :func:`try_claim` — a done claim left by an *earlier* run (it expired before this run started) is
   cleared first; then :meth:`CacheStore.claim` takes the key when nobody holds a live claim and it is not
   done; an expired claim (crashed or killed worker) is taken over;
3. re-check the winner (another worker may have finished the key between 1 and 2), tune, upsert;
4. :func:`finish` marks the key done, winner or not (a key where every candidate failed is not retried
   by every other worker of this run), and stamps the claim's ``expires_at`` with the finishing time, so
   a later run can tell a done claim of its own from one of an earlier run. Interrupted keys are
   released instead (the claim row is deleted).

While a key is tuned a :class:`Heartbeat` thread renews the claim every ``ttl/3`` seconds, so the TTL only
has to cover a dead worker's detection time, not a key's tuning time.
"""

from __future__ import annotations

import os
import socket
import threading
from datetime import datetime, timedelta
from typing import Optional

from sqlalchemy import delete, select, update

from attntune.cache.models import utcnow
from attntune.cache.schema import Claim
from attntune.cache.store import CacheStore
from attntune.cache.retry import retry_locked


def owner_id(worker: int = 0) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{worker}"


def claim_state(store: CacheStore, key_id: str) -> Optional[dict]:
    """The key's claim row as a dict (owner, expires_at, done) or None."""

    def read():
        with store.session() as s:
            r = s.execute(select(Claim.__table__).where(Claim.key_id == key_id)).mappings().first()
        return dict(r) if r else None

    return retry_locked(read)


def finish(store: CacheStore, key_id: str, owner: str) -> None:
    """Mark ``owner``'s claim done, with ``expires_at`` = now (the time it finished)."""

    def done():
        with store.session() as s:
            s.execute(
                update(Claim)
                .where(Claim.key_id == key_id, Claim.owner == owner)
                .values(done=1, expires_at=utcnow())
            )
            s.commit()

    retry_locked(done)


def _clear_old_done(store: CacheStore, key_id: str, run_start: datetime) -> None:
    # Only a *done* claim finished before this run began: never a live claim, never one finished in
    # this run (see finish()).
    def clear():
        with store.session() as s:
            s.execute(
                delete(Claim).where(Claim.key_id == key_id, Claim.done == 1, Claim.expires_at < run_start)
            )
            s.commit()

    retry_locked(clear)


def try_claim(store: CacheStore, key_id: str, owner: str, ttl_s: float, run_start: datetime) -> bool:
    _clear_old_done(store, key_id, run_start)
    if retry_locked(store.claim, key_id, owner, ttl_s):
        return True
    st = claim_state(store, key_id)
    if st is not None and not st["done"] and owner_is_dead(st["owner"]):
        return _take_over(store, key_id, st["owner"], owner, ttl_s)
    return False


def owner_is_dead(claim_owner: str) -> bool:
    """True when ``claim_owner`` (``host:pid:worker``) is a process of *this* host that no longer runs
    (a SIGKILLed tuner): its claim can be taken at once instead of waiting for the TTL. A process of
    another host, an unparsable owner or a live pid (including one reused by another program, or one we
    may not signal) counts as alive."""
    host, _, rest = str(claim_owner).rpartition(":")
    host, _, pid = host.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OSError):
        return False
    return False


def _take_over(store: CacheStore, key_id: str, dead: str, owner: str, ttl_s: float) -> bool:
    """Move the dead owner's live claim to ``owner`` (atomic: only if ``dead`` still holds it)."""

    def take():
        with store.session() as s:
            n = s.execute(
                update(Claim)
                .where(Claim.key_id == key_id, Claim.owner == dead, Claim.done == 0)
                .values(owner=owner, expires_at=utcnow() + timedelta(seconds=ttl_s))
            ).rowcount
            s.commit()
        return n == 1

    return bool(retry_locked(take))


class Heartbeat:
    """Renews ``owner``'s claim on ``key_id`` in a daemon thread while the key is being tuned.
    ``lost`` is set when a renewal fails (the claim expired and another worker took the key)."""

    def __init__(self, store: CacheStore, key_id: str, owner: str, ttl_s: float):
        self.store, self.key_id, self.owner, self.ttl_s = store, key_id, owner, ttl_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"claim-{key_id[:8]}", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not retry_locked(self.store.claim, self.key_id, self.owner, self.ttl_s):
                    self.lost.set()
                    return
            except Exception:  # noqa: BLE001 — a transient DB error; the next beat retries
                pass

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
