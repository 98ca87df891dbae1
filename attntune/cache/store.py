"""One cache database (SQLite file or any SQLAlchemy URL): open, migrate, read raw rows, upsert.

Reads return raw column dicts; :func:`attntune.cache.models.judge` decides whether a row may be used.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from sqlalchemy import create_engine, delete, event, func, inspect, select, text, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker

from attntune.cache.models import WinnerRecord, record_to_row, utcnow
from attntune.cache.retry import retry_locked
from attntune.cache.schema import SCHEMA_VERSION, Base, Claim, Meta, Miss, Trial, Winner
from attntune.key import TuneKey

BUSY_TIMEOUT_MS = 30_000
SCHEMA_LOCK_KEY = 0x617474756E65  # PostgreSQL advisory lock id of schema creation ("attune")


class CacheError(RuntimeError):
    """The database cannot be used (not a database, newer schema, unreachable)."""


def normalize_url(target: str | os.PathLike) -> str:
    """A filesystem path becomes ``sqlite:///<absolute path>``; URLs pass through."""
    s = str(target)
    if "://" in s:
        return s
    return f"sqlite:///{Path(s).expanduser().resolve()}"


def _upsert_stmt(dialect: str, table, values: Dict[str, Any], force: bool):
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        return None
    stmt = insert(table).values(**values)
    cols = {c: stmt.excluded[c] for c in values if c != "key_id"}
    # Keep the faster row. A stored row that is stale or rejected is replaced by ``force`` (the tuner
    # forces when it re-tunes such a key); the comparison happens inside the database, atomically.
    where = None if force else (stmt.excluded.median_ms < table.c.median_ms)
    return stmt.on_conflict_do_update(index_elements=["key_id"], set_=cols, where=where)


class CacheStore:
    """A tuning cache at ``url`` (path or SQLAlchemy URL). ``readonly`` stores never write or migrate."""

    def __init__(self, url: str | os.PathLike, readonly: bool = False, create: bool = True):
        self.url = normalize_url(url)
        self.readonly = readonly
        u = make_url(self.url)
        self.dialect = u.get_backend_name()
        kwargs: Dict[str, Any] = {}
        if self.dialect == "sqlite":
            path = u.database
            if path and path != ":memory:":
                if readonly and not Path(path).exists():
                    raise CacheError(f"{path}: no such cache file")
                if not readonly:
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                if readonly:
                    u = u.set(database=f"file:{path}?mode=ro", query={"uri": "true"})
            kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
        else:
            kwargs["pool_pre_ping"] = True
        self.engine: Engine = create_engine(u, **kwargs)
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", self._sqlite_pragmas)
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        self._check_schema(create and not readonly)

    # ---- setup ----------------------------------------------------------------------------------
    def _sqlite_pragmas(self, dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if not self.readonly:
            # WAL: readers never block the writer, so dispatching processes can read while tuning.
            # Switching a fresh file into WAL needs an exclusive lock and SQLite answers "database is
            # locked" at once (the busy handler is not consulted) while a neighbour does the same, as
            # fleet workers opening one new cache do.
            retry_locked(cur.execute, "PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    def _check_schema(self, create: bool) -> None:
        try:
            tables = set(inspect(self.engine).get_table_names())
        except Exception as e:  # noqa: BLE001 — "file is not a database", connection refused, …
            raise CacheError(f"{self.url}: cannot read ({type(e).__name__}: {str(e).splitlines()[0]})") from e
        if "attntune_meta" not in tables:
            if not create:
                if tables or self.readonly:
                    raise CacheError(f"{self.url}: not an attntune cache (no attntune_meta table)")
                return
            self._create_tables()
            with self.session() as s:
                try:
                    s.add(Meta(name="schema_version", value=str(SCHEMA_VERSION)))
                    s.commit()
                except IntegrityError:  # another process created it first
                    s.rollback()
            return
        with self.session() as s:
            row = s.get(Meta, "schema_version")
        version = int(row.value) if row else 0
        if version > SCHEMA_VERSION:
            raise CacheError(f"{self.url}: schema version {version} is newer than this attntune ({SCHEMA_VERSION})")
        if version < SCHEMA_VERSION and not self.readonly:
            self._migrate(version)

    def _create_tables(self, attempts: int = 5) -> None:
        """Create the tables this database lacks. Safe when several processes open a fresh cache at
        once: PostgreSQL serialises on an advisory lock; SQLite's DDL runs outside a transaction under
        the pysqlite driver, so between create_all's existence check and its CREATE TABLE another
        worker may win — the loser sees "already exists" and checks again (the next pass skips the
        tables that now exist)."""
        for attempt in range(attempts):
            try:
                with self.engine.begin() as conn:
                    if self.dialect == "postgresql":
                        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEMA_LOCK_KEY})
                    Base.metadata.create_all(conn)
                return
            except (OperationalError, ProgrammingError) as e:
                if "already exists" not in str(e) or attempt == attempts - 1:
                    raise

    def _migrate(self, version: int) -> None:
        """Bring an older schema up to SCHEMA_VERSION, one step per version."""
        self._create_tables()  # tables added since (claims, …)
        cols = {c["name"] for c in inspect(self.engine).get_columns("winners")}
        if version < 2 and "rel_error" not in cols:
            try:
                with self.engine.begin() as c:
                    c.execute(text("ALTER TABLE winners ADD COLUMN rel_error FLOAT"))
            except (OperationalError, ProgrammingError) as e:
                # Two processes migrating one cache: the second finds the column there already.
                if "duplicate column" not in str(e) and "already exists" not in str(e):
                    raise
        self._winner_cols = None
        with self.session() as s:
            try:
                s.merge(Meta(name="schema_version", value=str(SCHEMA_VERSION)))
                s.commit()
            except IntegrityError:  # a process creating this cache right now wrote the same version
                s.rollback()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._session() as s:
            yield s

    def _writable(self) -> None:
        if self.readonly:
            raise CacheError(f"{self.url}: opened read-only")

    # ---- winners --------------------------------------------------------------------------------
    def upsert_winner(self, rec: WinnerRecord, force: bool = False) -> bool:
        """Insert or replace the key's winner, keeping the faster of the two unless ``force``.
        Returns True when ``rec`` is the stored winner afterwards."""
        self._writable()
        values = record_to_row(rec)
        stmt = _upsert_stmt(self.dialect, Winner.__table__, values, force)
        with self.session() as s:
            if stmt is not None:
                s.execute(stmt)
            else:  # other databases: a plain read-compare-write in one transaction
                old = s.get(Winner, rec.key_id, with_for_update=True)
                if old is None:
                    s.add(Winner(**values))
                elif force or rec.median_ms < old.median_ms:
                    for c, val in values.items():
                        setattr(old, c, val)
            s.commit()
            cur = s.get(Winner, rec.key_id)
            return cur is not None and cur.median_ms == rec.median_ms and cur.variant == rec.variant

    def _winner_select(self):
        """SELECT of the winners columns this database has: a read-only cache of an older schema
        (which cannot be migrated) is read without the columns added since."""
        if getattr(self, "_winner_cols", None) is None:
            have = {c["name"] for c in inspect(self.engine).get_columns("winners")}
            self._winner_cols = [c for c in Winner.__table__.c if c.name in have]
        return select(*self._winner_cols)

    def raw_winners(self) -> List[Dict[str, Any]]:
        with self.session() as s:
            rows = s.execute(self._winner_select()).mappings().all()
        return [dict(r) for r in rows]

    def raw_winner(self, key_id: str) -> Optional[Dict[str, Any]]:
        with self.session() as s:
            r = s.execute(self._winner_select().where(Winner.key_id == key_id)).mappings().first()
        return dict(r) if r else None

    def delete_winners(self, key_ids: Optional[List[str]] = None) -> int:
        self._writable()
        with self.session() as s:
            stmt = delete(Winner)
            if key_ids is not None:
                stmt = stmt.where(Winner.key_id.in_(key_ids))
            n = s.execute(stmt).rowcount
            s.commit()
        return n

    def count(self) -> int:
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(Winner)) or 0

    # ---- trials ---------------------------------------------------------------------------------
    def add_trials(self, key_id: str, trials: List[Dict[str, Any]]) -> None:
        """``trials``: dicts with variant, config, status, reason, median_ms, max_error."""
        self._writable()
        now = utcnow()
        with self.session() as s:
            s.execute(delete(Trial).where(Trial.key_id == key_id))
            for t in trials:
                s.add(Trial(key_id=key_id, variant=t["variant"], config_json=json.dumps(t.get("config", {}), sort_keys=True),
                            status=t["status"], reason=t.get("reason"), median_ms=t.get("median_ms"),
                            max_error=t.get("max_error"), created_at=now))
            s.commit()

    def trials(self, key_id: str) -> List[Dict[str, Any]]:
        with self.session() as s:
            rows = s.execute(select(Trial.__table__).where(Trial.key_id == key_id).order_by(Trial.id)).mappings().all()
        return [dict(r) for r in rows]

    # ---- misses ---------------------------------------------------------------------------------
    def record_miss(self, key: TuneKey, count: int = 1) -> None:
        self._writable()
        now = utcnow()
        kid = key.key_id
        with self.session() as s:
            n = s.execute(update(Miss).where(Miss.key_id == kid).values(count=Miss.count + count, last_seen=now)).rowcount
            if not n:
                s.add(Miss(key_id=kid, key_json=key.model_dump_json(), count=count, first_seen=now, last_seen=now))
            try:
                s.commit()
            except IntegrityError:  # raced with another process inserting the same miss
                s.rollback()
                s.execute(update(Miss).where(Miss.key_id == kid).values(count=Miss.count + count, last_seen=now))
                s.commit()

    def misses(self) -> List[Dict[str, Any]]:
        with self.session() as s:
            rows = s.execute(select(Miss.__table__).order_by(Miss.count.desc())).mappings().all()
        return [dict(r) for r in rows]

    def clear_misses(self, key_ids: List[str]) -> None:
        self._writable()
        with self.session() as s:
            s.execute(delete(Miss).where(Miss.key_id.in_(key_ids)))
            s.commit()

    # ---- claims (fleet tuning) --------------------------------------------------------------------
    def claim(self, key_id: str, owner: str, ttl_s: float) -> bool:
        """Try to claim ``key_id`` for ``owner`` for ``ttl_s`` seconds. Succeeds when nobody holds a
        live claim and the key is not done; an expired claim (crashed worker) is taken over."""
        self._writable()
        now = utcnow()
        exp = now + timedelta(seconds=ttl_s)
        with self.session() as s:
            try:
                s.add(Claim(key_id=key_id, owner=owner, expires_at=exp, done=0))
                s.commit()
                return True
            except IntegrityError:
                s.rollback()
            n = s.execute(update(Claim).where(Claim.key_id == key_id, Claim.done == 0,
                                              (Claim.expires_at < now) | (Claim.owner == owner))
                          .values(owner=owner, expires_at=exp)).rowcount
            s.commit()
            return n == 1

    def finish_claim(self, key_id: str, owner: str) -> None:
        self._writable()
        with self.session() as s:
            s.execute(update(Claim).where(Claim.key_id == key_id, Claim.owner == owner).values(done=1))
            s.commit()

    def release_claim(self, key_id: str, owner: str) -> None:
        self._writable()
        with self.session() as s:
            s.execute(delete(Claim).where(Claim.key_id == key_id, Claim.owner == owner, Claim.done == 0))
            s.commit()

    def reset_claims(self, key_ids: Optional[List[str]] = None) -> None:
        self._writable()
        with self.session() as s:
            stmt = delete(Claim)
            if key_ids is not None:
                stmt = stmt.where(Claim.key_id.in_(key_ids))
            s.execute(stmt)
            s.commit()

    # ---- maintenance ----------------------------------------------------------------------------
    def prepare_for_shipping(self) -> None:
        """Checkpoint the WAL and switch to a rollback journal so the file opens read-only anywhere."""
        if self.dialect != "sqlite":
            return
        with self.engine.connect() as c:
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            c.exec_driver_sql("PRAGMA journal_mode=DELETE")
            c.execute(text("VACUUM"))

    def dispose(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"<CacheStore {self.url}{' ro' if self.readonly else ''}>"
