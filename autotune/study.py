"""Optuna storage and studies: one study per key (``study_name`` = the key id) in a standard RDB
storage, so a run can be resumed and inspected with ``optuna-dashboard <storage URL>``.

Default storage: ``optuna.db`` next to the SQLite cache (``sqlite:///<cache dir>/optuna.db``); with a
PostgreSQL cache, the same database, schema ``attntune_optuna`` (:func:`default_storage_url`). A study
keeps a ``signature`` user attribute (:meth:`SearchSpace.signature`); when the candidates, their source
or the software versions changed, its trials describe other code and the study is started afresh.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Optional

import optuna
from optuna.trial import TrialState
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from attntune.cache.causes import ADVICE, cause_of
from attntune.cache.retry import retry_locked
from attntune.cache.store import BUSY_TIMEOUT_MS, CacheError, display_url, normalize_url

optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial would drown the progress bar

MEMORY = "memory"
OPTUNA_SCHEMA = "attntune_optuna"
OPTUNA_LOCK_KEY = 0x6F7074756E61  # PostgreSQL advisory lock id of storage set-up ("optuna")


def default_storage_url(cache_url: str) -> str:
    """``optuna.db`` next to a SQLite cache file. For a PostgreSQL cache, the same database with the
    studies in their own schema (``OPTUNA_SCHEMA``: optuna's ``trials`` table would collide with the
    cache's), selected by the libpq ``options`` parameter so the URL works as is in optuna-dashboard."""
    url = normalize_url(cache_url)
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if not u.database or u.database == ":memory:":
            return MEMORY
        return f"sqlite:///{Path(u.database).parent / 'optuna.db'}"
    if u.get_backend_name() == "postgresql" and "options" not in u.query:
        u = u.update_query_dict({"options": f"-csearch_path={OPTUNA_SCHEMA}"})
        return u.render_as_string(hide_password=False)
    return url


def _pg_schema(u) -> Optional[str]:
    m = re.search(r"search_path\s*=\s*([A-Za-z_][A-Za-z0-9_]*)", str(u.query.get("options", "")))
    return m.group(1) if m else None


def _open_pg(url: str, kwargs: dict):
    # Serialise first use across a fleet: optuna creates its tables (and a version row) on open, and
    # concurrent creations of one table fail on PostgreSQL. The schema of the search_path is created too.
    u = make_url(url)
    admin = create_engine(u.difference_update_query(["options"]), pool_pre_ping=True)
    try:
        with admin.connect() as c:
            c.execute(text("SELECT pg_advisory_lock(:k)"), {"k": OPTUNA_LOCK_KEY})
            c.commit()
            try:
                schema = _pg_schema(u)
                if schema:
                    c.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
                    c.commit()
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
            finally:
                c.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": OPTUNA_LOCK_KEY})
                c.commit()
    finally:
        admin.dispose()


def _sqlite_wal(path: str) -> None:
    # WAL lets the dashboard and other workers read while one writes; the mode is stored in the file.
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        # A file whose header is intact but whose pages are damaged opens fine and fails only when a
        # study is written: every key then ended "error: StorageInternalError ... e.g. exceeding max
        # length", naming neither the file nor the fix. Checked here, it is open_storage's one line.
        found = [r[0] for r in con.execute("PRAGMA quick_check(1)")]
        if found != ["ok"]:
            detail = str(found[0]).replace("*** in database main ***", "").strip().splitlines() if found else []
            raise sqlite3.DatabaseError("database disk image is malformed"
                                        + (f" ({detail[0]})" if detail else ""))
    finally:
        con.close()


def open_storage(url: Optional[str]):
    """An optuna storage for ``url``: ``None``/``"memory"`` → in-memory (no resume), else an
    ``RDBStorage``. Creation is retried: several workers may create the tables at the same moment.
    Raises :class:`~attntune.cache.store.CacheError` naming the storage and what to do (a damaged
    ``optuna.db`` made every ``tune`` fail with a bare "cache: file is not a database")."""
    if url is None or url == MEMORY:
        return optuna.storages.InMemoryStorage()
    try:
        return _open_rdb(url)
    except Exception as e:  # noqa: BLE001 — a damaged file, a bad URL, a missing driver, a dead server
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CacheError(f"optuna storage {display_url(normalize_url(url))}: cannot be used "
                         f"({type(e).__name__}: {first}); {storage_advice(first)}") from e


def storage_advice(error: str) -> str:
    """The fix to suggest for an optuna storage that raised ``error`` (its first line): deleting the file
    only where the file itself is damaged — a full disk, a read-only file or a dead server leave a good
    study that the next run resumes from once the cause is gone."""
    cause = cause_of(error)
    if cause == "damaged":
        return ("the file is damaged; it holds only the tuner's resumable study state (the winners are in the "
                "cache): delete it, or pass --storage memory")
    if cause is not None:
        return f"{ADVICE[cause]} (the study resumes), or pass --storage memory"
    return "check the URL, its driver and its server, or pass --storage memory (no resume)"


#: the tables optuna's RDB storage keeps (optuna 3-5); a storage file holding others is not the tuner's
_OPTUNA_TABLES = frozenset({
    "alembic_version", "studies", "study_directions", "study_system_attributes", "study_user_attributes",
    "trial_heartbeats", "trial_intermediate_values", "trial_params", "trial_system_attributes",
    "trial_user_attributes", "trial_values", "trials", "version_info"})


def _foreign_tables(path: str) -> list:
    """Tables of an existing SQLite file that optuna's storage does not make (read-only look; [] for a new
    file, or one SQLite cannot read — that is for the storage's own error to name)."""
    if not Path(path).is_file():
        return []
    try:
        con = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True, timeout=1.0)
        try:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error:
        return []
    return sorted(n for n in names - _OPTUNA_TABLES if not n.startswith("sqlite_"))


def storage_problem(url: Optional[str]) -> Optional[str]:
    """Why ``url`` must not be the tuner's optuna storage, or None. An existing SQLite file with tables of
    its own is not a study store: optuna would add its tables to it and switch it to WAL (another
    application's database, audit), or clash with attntune's own ``trials`` table (the cache itself: the run
    failed with "invalid data in the commit", naming neither file)."""
    if url is None or url == MEMORY:
        return None
    try:
        u = make_url(normalize_url(url))
    except Exception:  # noqa: BLE001 — a bad URL: open_storage names it
        return None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    foreign = _foreign_tables(u.database)
    if not foreign:
        return None
    what = ("an attntune cache" if {"winners", "claims"} & set(foreign)
            else f"a database with other tables ({', '.join(foreign[:4])})")
    return f"{u.database} is {what}, not an optuna study store: give the tuner a file of its own"


def _open_rdb(url: str):
    url = normalize_url(url)
    u = make_url(url)
    kwargs: dict = {}
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            why = storage_problem(url)
            if why:
                raise ValueError(why)
            retry_locked(_sqlite_wal, u.database)
        kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_MS / 1000}
    else:
        kwargs["pool_pre_ping"] = True
    last: Optional[BaseException] = None
    for i in range(8):
        try:
            if u.get_backend_name() == "postgresql":
                return _open_pg(url, kwargs)
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except (OperationalError, IntegrityError, ProgrammingError) as e:  # tables created concurrently
            last = e
            time.sleep(0.1 * (i + 1))
    raise RuntimeError(f"cannot open optuna storage {display_url(url)}: {last}")


def open_study(
    storage, key_id: str, signature: str, sampler, label: str, fresh: bool = False
) -> optuna.Study:
    """Load or create the key's study. ``fresh`` (``--force``) or a changed signature deletes the stored
    trials first. Trials left RUNNING by an interrupted or killed run are marked FAIL: the caller holds
    the key's claim, so nobody else is running them."""

    def create() -> optuna.Study:
        return optuna.create_study(
            storage=storage, study_name=key_id, direction="minimize", sampler=sampler, load_if_exists=True
        )

    study = retry_locked(create)
    old = study.user_attrs.get("signature")
    has_trials = bool(study.get_trials(deepcopy=False))
    if fresh or (old is not None and old != signature) or (old is None and has_trials):
        retry_locked(optuna.delete_study, study_name=key_id, storage=storage)
        study = retry_locked(create)
    if study.user_attrs.get("signature") != signature:
        retry_locked(study.set_user_attr, "signature", signature)
        retry_locked(study.set_user_attr, "key", label)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        retry_locked(study.tell, t.number, state=TrialState.FAIL, skip_if_finished=True)
    return study
