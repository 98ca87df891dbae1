"""One cache database (SQLite file or any SQLAlchemy URL): open, migrate, read raw rows, upsert.

Reads return raw column dicts; :func:`attntune.cache.models.judge` decides whether a row may be used.
"""

from __future__ import annotations

import math
import os
import re
import urllib.parse
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from sqlalchemy import create_engine, delete, event, func, inspect, select, text, type_coerce, update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.types import NullType

from attntune.cache.models import WinnerRecord, record_to_row, utcnow
from attntune.cache.retry import retry_locked
from attntune.cache.schema import SCHEMA_VERSION, Base, Claim, Meta, Miss, Trial, Winner
from attntune.key import TuneKey, config_key

#: how long the CLI and the tuner wait for a locked SQLite cache (the runtime waits far less:
#: ``ATTNTUNE_CACHE_TIMEOUT``, see :mod:`attntune.policies.config`)
BUSY_TIMEOUT_MS = 30_000
SCHEMA_LOCK_KEY = 0x617474756E65  # PostgreSQL advisory lock id of schema creation ("attune")


def _raw_col(col):
    """``col`` selected under its own name without its type's result conversion."""
    return type_coerce(col, NullType()).label(col.name)


class CacheError(RuntimeError):
    """The database cannot be used (not a database, newer schema, unreachable)."""


def normalize_url(target: str | os.PathLike) -> str:
    """A filesystem path becomes ``sqlite:///<absolute path>``; URLs pass through."""
    s = str(target)
    if "://" in s:
        return s
    try:
        path = str(Path(s).expanduser().resolve())
    except (OSError, RuntimeError):  # a symlink loop: the open that follows says what is wrong with it
        path = os.path.abspath(os.path.expanduser(s))
    return f"sqlite:///{path}"


def display_url(url: str | os.PathLike) -> str:
    """``url`` as messages show it: a database URL's password masked (``***``), a path as it is."""
    s = str(url)
    if "://" not in s:
        return s
    try:
        return make_url(s).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 — a malformed URL: show no credentials (what is after "//" up to "@")
        return re.sub(r"//[^/@]*@", "//***@", s)


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


def _writable_path(path: Path) -> Optional[str]:
    """Why a writable SQLite cache cannot live at ``path`` (None when it can): the file or its directory
    is read-only (a WAL database also creates ``-wal``/``-shm`` files next to it), or it is a directory."""
    if path.is_dir():
        return "is a directory, not a cache file"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not os.access(parent, os.W_OK):
        return f"directory {parent} is not writable"
    if path.exists() and not os.access(path, os.W_OK):
        return "file is read-only"
    return None


def _sqlite_ro_urls(path: str) -> List[str]:
    """How to open an existing SQLite file read-only, in order: ``mode=ro`` (sees a WAL's latest
    commits; needs the ``-shm`` file, which SQLite creates where the directory is writable), then
    ``immutable=1`` (no locks, no ``-shm``: for a file on a read-only path, as a shipped cache; the
    content of a ``-wal`` file that was never checkpointed is not seen)."""
    quoted = urllib.parse.quote(path)
    return [f"file:{quoted}?mode=ro", f"file:{quoted}?mode=ro&immutable=1"]


class CacheStore:
    """A tuning cache at ``url`` (path or SQLAlchemy URL). ``readonly`` stores never write or migrate.

    ``timeout_s``: how long a statement waits for another process's lock (SQLite's busy timeout) and,
    with ``lock_attempts``, how often a connection retries switching the file into WAL. The CLI and the
    tuner wait long (they write); the runtime opens its caches with a short timeout so that a locked
    cache never stalls a model (it is skipped with one warning). Raises :class:`CacheError` when the
    database cannot be used; never leaves a half-open engine behind."""

    def __init__(self, url: str | os.PathLike, readonly: bool = False, create: bool = True,
                 timeout_s: float = BUSY_TIMEOUT_MS / 1000, lock_attempts: int = 8):
        self.url = normalize_url(url)
        self.shown = display_url(self.url)  # in messages: no password
        self.readonly = readonly
        self.timeout_s = max(0.0, float(timeout_s))
        self.lock_attempts = max(1, lock_attempts)
        self._procs: Dict[str, Dict[str, Any]] = {}  # table -> column -> its type's result processor
        try:
            u = make_url(self.url)
            self.dialect = u.get_backend_name()
        except Exception as e:  # noqa: BLE001 — "nosuchdialect://x", malformed URLs
            raise CacheError(f"{self.shown}: not a database URL ({type(e).__name__}: {e})") from None
        kwargs: Dict[str, Any] = {}
        urls = [u]
        if self.dialect == "sqlite":
            path = u.database
            if path and path != ":memory:":
                p = Path(path)
                if p.exists() and not p.is_file() and not p.is_dir():
                    # a device or FIFO (a cache linked to /dev/null): SQLite would put its journal next to
                    # it (/dev/null-journal, as root) and the error blamed the -wal/-shm files
                    raise CacheError(f"{path}: is not a regular file (a device or pipe?), not a cache file")
                if readonly:
                    if Path(path).is_dir():
                        raise CacheError(f"{path}: is a directory, not a cache file")
                    if not Path(path).exists():
                        raise CacheError(f"{path}: no such cache file")
                    urls = [u.set(database=ro, query={"uri": "true"}) for ro in _sqlite_ro_urls(path)]
                else:
                    why = _writable_path(Path(path))
                    if why:
                        raise CacheError(f"{path}: cannot be written ({why}); a read-only cache can only "
                                         "be read (e.g. as ATTNTUNE_SYSTEM_CACHE)")
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"timeout": self.timeout_s, "check_same_thread": False}
        else:
            kwargs["pool_pre_ping"] = True
            if self.dialect == "postgresql":
                # A server that accepts the connection but never answers (hung, overloaded, a half-open
                # firewall) blocked the first attention() call forever: libpq's connect timeout bounds
                # the handshake (whole seconds, 2 at least: the runtime's 0.2 s becomes 2 s)
                kwargs["connect_args"] = {"connect_timeout": max(2, math.ceil(self.timeout_s))}
        for i, target in enumerate(urls):
            try:
                self.engine: Engine = create_engine(target, **kwargs)
            except Exception as e:  # noqa: BLE001 — a missing driver (psycopg), bad arguments
                raise CacheError(f"{self.shown}: cannot open ({type(e).__name__}: {str(e).splitlines()[0]})") \
                    from None
            if self.dialect == "sqlite":
                event.listen(self.engine, "connect", self._sqlite_pragmas)
            self._session = sessionmaker(self.engine, expire_on_commit=False)
            try:
                self._check_schema(create and not readonly)
                return
            except CacheError as e:
                self.engine.dispose()
                # Only a file SQLite cannot open read-only the usual way (a WAL file whose -shm cannot
                # be created: a read-only directory) is read immutable. Not on any other error: an
                # immutable read ignores the -wal file (a stale view) and any lock (a writer now could
                # show it torn pages).
                if i == len(urls) - 1 or "unable to open" not in str(e):
                    raise

    # ---- setup ----------------------------------------------------------------------------------
    def _sqlite_pragmas(self, dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(self.timeout_s * 1000)}")
        if not self.readonly and not self._foreign_sqlite(cur):
            # WAL: readers never block the writer, so dispatching processes can read while tuning.
            # Switching a fresh file into WAL needs an exclusive lock and SQLite answers "database is
            # locked" at once (the busy handler is not consulted) while a neighbour does the same, as
            # fleet workers opening one new cache do.
            retry_locked(cur.execute, "PRAGMA journal_mode=WAL", attempts=self.lock_attempts)
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @staticmethod
    def _foreign_sqlite(cur) -> bool:
        """Whether the file holds another application's tables and no attntune cache: it is refused by
        :meth:`_check_schema`, and must not be switched to WAL first (the mode is stored in the file)."""
        names = {r[0] for r in cur.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return "attntune_meta" not in names and bool(names - set(Base.metadata.tables))

    def _check_schema(self, create: bool) -> None:
        try:
            tables = set(inspect(self.engine).get_table_names())
        except Exception as e:  # noqa: BLE001 — "file is not a database", connection refused, …
            raise CacheError(f"{self.shown}: cannot read ({type(e).__name__}: {str(e).splitlines()[0]})") from e
        if "attntune_meta" not in tables:
            if not create:
                if tables or self.readonly:
                    raise CacheError(f"{self.shown}: not an attntune cache (no attntune_meta table)")
                return
            foreign = sorted(tables - set(Base.metadata.tables))
            if foreign and self.dialect == "sqlite":
                # another application's database (a wrong --cache path): the runtime, tune and import
                # wrote attntune's tables into it and switched it to WAL. A fleet's PostgreSQL database
                # may hold other tables (optuna's) by design.
                raise CacheError(f"{self.shown}: not an attntune cache (it holds other tables: "
                                 f"{', '.join(foreign[:5])}{', …' if len(foreign) > 5 else ''}); not writing into it")
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
        try:
            version = int(row.value) if row else 0
        except (TypeError, ValueError):
            raise CacheError(f"{self.shown}: schema version {row.value!r} is not a number "
                             "(a damaged cache)") from None
        if version > SCHEMA_VERSION:
            raise CacheError(f"{self.shown}: schema version {version} is newer than this attntune ({SCHEMA_VERSION})")
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

    def locked_now(self) -> Optional[str]:
        """Why a write would have to wait now (another connection holds SQLite's write lock; the wait is
        this store's busy timeout), or None. For callers that must not wait: the runtime's online tuning
        skips a key instead of stalling the model's call in the tuner's lock retries (~8 s a key)."""
        if self.dialect != "sqlite" or self.readonly:
            return None
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute("BEGIN IMMEDIATE")
            raw.rollback()
            return None
        except Exception as e:  # noqa: BLE001 — locked, busy, or broken: not writable now either way
            return str(e).splitlines()[0] if str(e) else type(e).__name__
        finally:
            raw.close()

    def _migrate(self, version: int) -> None:
        """Bring an older schema up to SCHEMA_VERSION, one step per version."""
        self._create_tables()  # tables added since (claims, …)
        cols = {c["name"] for c in inspect(self.engine).get_columns("winners")}
        for since, col in ((2, "rel_error"), (3, "spread"), (4, "busy")):
            if version >= since or col in cols:
                continue
            try:
                with self.engine.begin() as c:
                    c.execute(text(f"ALTER TABLE winners ADD COLUMN {col} FLOAT"))
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
            raise CacheError(f"{self.shown}: opened read-only")

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
        (which cannot be migrated) is read without the columns added since. Values come back as the
        driver gives them (no SQLAlchemy type conversion): one malformed field (a ``created_at`` of
        ``'garbage'``) would otherwise fail the whole query; :func:`attntune.cache.models.judge`
        rejects that row alone."""
        if getattr(self, "_winner_cols", None) is None:
            have = {c["name"] for c in inspect(self.engine).get_columns("winners")}
            self._winner_cols = [c for c in Winner.__table__.c if c.name in have]
        return select(*[_raw_col(c) for c in self._winner_cols])

    def _typed(self, table, row) -> Dict[str, Any]:
        """A raw row with each value converted as its column's type would (SQLite's timestamp text
        becomes a datetime, as PostgreSQL's driver returns it), value by value: a value that does not
        convert is kept raw, for :func:`~attntune.cache.models.judge` to reject that row alone."""
        if self.dialect != "sqlite":
            return dict(row)  # typed databases: the driver already returns typed values, column by column
        procs = self._procs.get(table.name)
        if procs is None:
            dialect = self.engine.dialect
            procs = {c.name: c.type.dialect_impl(dialect).result_processor(dialect, None) for c in table.c}
            self._procs[table.name] = procs
        out = dict(row)
        for name, value in out.items():
            proc = procs.get(name)
            if proc is not None and value is not None:
                try:
                    out[name] = proc(value)
                except Exception:  # noqa: BLE001 — malformed: left as stored
                    pass
        return out

    def raw_winners(self) -> List[Dict[str, Any]]:
        with self.session() as s:
            rows = s.execute(self._winner_select()).mappings().all()
        return [self._typed(Winner.__table__, r) for r in rows]

    def raw_winner(self, key_id: str) -> Optional[Dict[str, Any]]:
        with self.session() as s:
            r = s.execute(self._winner_select().where(Winner.key_id == key_id)).mappings().first()
        return self._typed(Winner.__table__, r) if r else None

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
                s.add(Trial(key_id=key_id, variant=t["variant"], config_json=config_key(t.get("config", {})),
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
        """Raw miss rows, most counted first (values unconverted, as :meth:`raw_winners`)."""
        with self.session() as s:
            rows = s.execute(select(*[_raw_col(c) for c in Miss.__table__.c])
                             .order_by(Miss.count.desc())).mappings().all()
        return [self._typed(Miss.__table__, r) for r in rows]

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
        return f"<CacheStore {self.shown}{' ro' if self.readonly else ''}>"
