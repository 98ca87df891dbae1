"""Fault injection, the tuning cache (issue #12): a locked cache (another process holding an exclusive
lock, both modes) never stalls a call and loses no miss; damaged, unreadable and read-only caches are
skipped or read with one warning; one poisoned row rejects that row only; a claim left by a killed tuner
on this host is taken at once."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import attntune
from attntune.autotune import claims
from attntune.cache import CacheStore, LayeredCache, WinnerRecord, utcnow
from attntune.device import device_fingerprint, software_fingerprint
from attntune.key import TuneKey
from attntune.kernels import registry
from attntune.policies import runtime
from attntune.problem import AttentionProblem

HOLDER = r"""
import sqlite3, sys
path, mode = sys.argv[1], sys.argv[2]
c = sqlite3.connect(path, isolation_level=None)
if mode == "locking_mode":  # the lock stays after the first read and is never given back
    c.execute("PRAGMA locking_mode=EXCLUSIVE")
    c.execute("BEGIN EXCLUSIVE")
    c.execute("SELECT count(*) FROM winners").fetchall()
    c.execute("COMMIT")
else:                       # an open exclusive write transaction
    c.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()            # held until the test closes our stdin
"""


def problem(sq=100, d=16) -> AttentionProblem:
    return AttentionProblem(batch=2, heads_q=4, heads_kv=4, seqlen_q=sq, seqlen_kv=sq, head_dim=d, head_dim_v=d,
                            dtype="float32", device_type="cpu")


def record(p: AttentionProblem, variant="sdpa_math", ms=1.0) -> WinnerRecord:
    return WinnerRecord(key=TuneKey.from_problem(p, device_fingerprint("cpu")), variant=variant, config={},
                        median_ms=ms, fingerprint=software_fingerprint(registry.get(variant).source_hash(), "cpu"),
                        created_at=utcnow())


def make_cache(path: Path, *recs: WinnerRecord, ship: bool = False) -> Path:
    st = CacheStore(path)
    for rec in recs or (record(problem()),):
        st.upsert_winner(rec)
    if ship:
        st.prepare_for_shipping()  # rollback journal, as the shipped cache.db
    st.dispose()
    return path


def tensors(p: AttentionProblem):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim, generator=g) for _ in range(3)]


@pytest.fixture(autouse=True)
def _fresh_runtime():
    attntune.reset()
    yield
    attntune.reset()


class Holder:
    """A process holding an exclusive lock on an SQLite file until :meth:`release`."""

    def __init__(self, path: Path, mode: str):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _timed_first_call(p: AttentionProblem) -> float:
    q, k, v = tensors(p)
    t0 = time.perf_counter()
    attntune.attention(q, k, v)
    return time.perf_counter() - t0


def _warm_up_process() -> None:
    """Imports and the first plan of the process happen before the timed part (the target is the wait
    for the lock, not Python's import time)."""
    attntune.attention(*tensors(problem(sq=33)))
    attntune.reset()


# ---- locks -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["transaction", "locking_mode"])
def test_locked_user_cache_never_stalls_a_call_and_loses_no_miss(tmp_path, monkeypatch, mode):
    cache = make_cache(tmp_path / "user.db")
    monkeypatch.setenv("ATTNTUNE_CACHE", str(cache))
    _warm_up_process()
    new = problem(sq=57)
    with Holder(cache, mode) as holder, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _timed_first_call(new) < 0.5
        t0 = time.perf_counter()
        runtime.get().flush_misses()  # the miss cannot be written now: kept, and the flush does not wait
        assert time.perf_counter() - t0 < 0.5
        assert runtime.get().pending
        holder.release()
    runtime.get().flush_misses()
    assert not runtime.get().pending
    kid = TuneKey.from_problem(new, device_fingerprint("cpu")).key_id
    assert any(m["key_id"] == kid for m in CacheStore(cache).misses())
    if mode == "locking_mode":  # the cache could not even be read: one warning says so
        assert len([w for w in caught if "user cache" in str(w.message)]) == 1, [str(w.message) for w in caught]


def test_locked_shipped_cache_never_stalls_a_call(tmp_path, monkeypatch):
    shipped = make_cache(tmp_path / "cache.db", ship=True)
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", str(shipped))
    _warm_up_process()
    with Holder(shipped, "transaction"), pytest.warns(RuntimeWarning, match="system cache"):
        assert _timed_first_call(problem(sq=57)) < 0.5
    attntune.reset()  # lock gone: the shipped rows serve again
    q, k, v = tensors(problem())
    assert attntune.explain(q, k, v).source == "tuned"


# ---- damaged and unreadable caches --------------------------------------------------------------------------
def _random_bytes(p: Path):
    p.write_bytes(os.urandom(8192))


def _truncated(p: Path):
    make_cache(p, ship=True)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])


def _directory(p: Path):
    p.mkdir()


def _schema_99(p: Path):
    make_cache(p)
    with sqlite3.connect(p) as c:
        c.execute("UPDATE attntune_meta SET value = '99' WHERE name = 'schema_version'")


def _no_winners(p: Path):
    make_cache(p)
    with sqlite3.connect(p) as c:
        c.execute("DROP TABLE winners")


def _corrupt_page(p: Path):
    make_cache(p, *[record(problem(sq=s)) for s in range(40, 240)], ship=True)
    data = bytearray(p.read_bytes())
    page = 4096
    data[2 * page: 3 * page] = os.urandom(page)  # a b-tree page of the winners table
    p.write_bytes(bytes(data))


BROKEN = {"random bytes": _random_bytes, "truncated": _truncated, "directory": _directory,
          "schema 99": _schema_99, "no winners table": _no_winners, "corrupt page": _corrupt_page}


@pytest.mark.parametrize("layer", ["user", "system"])
@pytest.mark.parametrize("damage", list(BROKEN))
def test_broken_cache_is_one_warning_and_a_named_failure(tmp_path, monkeypatch, layer, damage):
    path = tmp_path / "broken.db"
    BROKEN[damage](path)
    monkeypatch.setenv("ATTNTUNE_CACHE" if layer == "user" else "ATTNTUNE_SYSTEM_CACHE", str(path))
    q, k, v = tensors(problem())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = attntune.attention(q, k, v)
        attntune.attention(*tensors(problem(sq=77)))
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert len([w for w in caught if str(path) in str(w.message)]) == 1, [(w.category, str(w.message)) for w in caught]
    layers = LayeredCache.open_default(user_readonly=True) if layer == "user" else LayeredCache.open_default()
    layers.all_rows()
    assert [f.label for f in layers.failures] == [layer], layers.failures
    assert layers.failures[0].reason


# ---- poisoned rows ---------------------------------------------------------------------------------------
POISON = {
    "created_at": ["garbage", 12345],
    "median_ms": ["abc", -1.0, float("inf")],
    "key_json": ["{", "[]"],
    "config_json": ["{not json", "[1, 2]", 7],
    "fingerprint_json": ["nope"],
    "variant": ["no_such_variant"],
    "trials": ["many"],
    "key_id": ["0" * 40],
}


@pytest.mark.parametrize("column, value", [(c, v) for c, vs in POISON.items() for v in vs],
                         ids=lambda x: repr(x))
def test_one_poisoned_row_rejects_that_row_only(tmp_path, monkeypatch, column, value):
    good, bad = problem(sq=100), problem(sq=300)
    path = make_cache(tmp_path / "user.db", record(good), record(bad))
    bad_id = TuneKey.from_problem(bad, device_fingerprint("cpu")).key_id
    with sqlite3.connect(path) as c:
        c.execute(f"UPDATE winners SET {column} = ? WHERE key_id = ?", (value, bad_id))
    rows = {r.key_id: r for r in LayeredCache([("user", CacheStore(path, readonly=True))]).all_rows()}
    assert len(rows) == 2
    verdicts = sorted(r.status for r in rows.values())
    assert verdicts == ["rejected", "valid"], {k: (r.status, r.reasons) for k, r in rows.items()}
    rejected = next(r for r in rows.values() if r.status == "rejected")
    assert rejected.reasons and rejected.reasons[0]
    monkeypatch.setenv("ATTNTUNE_CACHE", str(path))
    assert attntune.explain(*tensors(good)).source == "tuned"  # the good row still serves


def test_schema_drift_extra_and_missing_columns_still_read(tmp_path):
    path = make_cache(tmp_path / "user.db")
    with sqlite3.connect(path) as c:
        c.execute("ALTER TABLE winners ADD COLUMN from_the_future TEXT DEFAULT 'x'")
        c.execute("ALTER TABLE winners DROP COLUMN rel_error")
    [row] = LayeredCache([("user", CacheStore(path, readonly=True))]).all_rows()
    assert row.status == "valid", row.reasons


# ---- read-only caches ----------------------------------------------------------------------------------
READER = r"""
import sys, warnings
warnings.simplefilter("error")  # the cache is fine, only its directory is read-only: no warning at all
import torch, attntune
from attntune.cache import CacheStore
print(len(CacheStore(sys.argv[1], readonly=True).raw_winners()))
q = torch.randn(2, 4, 100, 16)
print(attntune.explain(q, q, q).source)
"""


def _read_only_dir_cmd(d: Path) -> list:
    """A command prefix running a program with ``d`` read-only: a read-only bind mount in a private mount
    namespace when we are root (for whom ``chmod`` does not bind), else ``chmod 555``."""
    if os.geteuid() != 0:
        d.chmod(0o555)
        return []
    probe = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0"',
                            str(d)], capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("needs a read-only directory: as root that takes a mount namespace (unshare -m), "
                    "not available here")
    return ["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
            str(d)]


@pytest.mark.parametrize("layer", ["ATTNTUNE_CACHE", "ATTNTUNE_SYSTEM_CACHE"])
def test_wal_cache_in_a_read_only_directory_is_read(tmp_path, layer):
    """A valid WAL cache whose ``-wal``/``-shm`` files cannot be created (the directory is read-only) used
    to be ignored; it is read (``mode=ro``, then ``immutable``), silently, by the store and the runtime."""
    d = tmp_path / "ro"
    d.mkdir()
    path = make_cache(d / "cache.db")
    c = sqlite3.connect(path)
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    c.close()  # the last connection: SQLite checkpoints and removes -wal/-shm
    assert sorted(os.listdir(d)) == ["cache.db"]  # no -wal/-shm left: they would have to be created
    env = {**os.environ, "ATTNTUNE_CACHE": str(tmp_path / "other.db"), "ATTNTUNE_SYSTEM_CACHE": "", layer: str(path)}
    try:
        cmd = _read_only_dir_cmd(d) + [sys.executable, "-c", READER, str(path)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    finally:
        d.chmod(0o755)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["1", "tuned"], res.stdout


def test_writable_open_of_a_directory_or_bad_url_is_a_cache_error(tmp_path):
    from attntune.cache import CacheError

    (tmp_path / "d").mkdir()
    for target in (tmp_path / "d", "nosuchdialect://x"):
        with pytest.raises(CacheError):
            CacheStore(target)


# ---- claims of killed tuners ---------------------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _claim(path: Path, owner: str, key_id: str) -> CacheStore:
    st = CacheStore(path)
    assert st.claim(key_id, owner, ttl_s=3600)  # an hour: waiting for it to expire is not an option
    return st


def test_claim_of_a_dead_local_process_is_taken_at_once(tmp_path, monkeypatch):
    import socket

    from attntune.autotune.runner import run_tuning
    from attntune.autotune.timing import TimingOptions

    monkeypatch.setenv("ATTNTUNE_VARIANTS", "eager,sdpa_math")
    p = problem(sq=16)
    kid = TuneKey.from_problem(p, device_fingerprint("cpu")).key_id
    st = _claim(tmp_path / "c.db", f"{socket.gethostname()}:{_dead_pid()}:0", kid)
    t0 = time.perf_counter()
    # time_limit: without the take-over this would wait out the hour (the run then ends "unfinished")
    [res] = run_tuning([p], cache=st, storage="memory", trials=2, timing=TimingOptions.quick(), time_limit=30)
    assert res.status == "tuned" and time.perf_counter() - t0 < 30
    assert claims.claim_state(st, kid)["owner"] == claims.owner_id(0)


@pytest.mark.parametrize("owner", ["elsewhere.example:1:0", "{host}:{ppid}:0", "not-an-owner"])
def test_claim_of_a_live_or_foreign_owner_is_respected(tmp_path, owner):
    import socket

    owner = owner.format(host=socket.gethostname(), ppid=os.getppid())
    st = _claim(tmp_path / "c.db", owner, "k" * 40)
    assert not claims.owner_is_dead(owner)
    assert not claims.try_claim(st, "k" * 40, claims.owner_id(0), 60, utcnow())


def test_a_live_claim_is_waited_for_and_announced(tmp_path, monkeypatch):
    """A key claimed by a live process: the tuner says whom it waits for (once), then takes the key when
    the claim expires."""
    import socket

    from attntune.autotune.runner import run_tuning
    from attntune.autotune.timing import TimingOptions

    monkeypatch.setenv("ATTNTUNE_VARIANTS", "eager,sdpa_math")
    p = problem(sq=16)
    kid = TuneKey.from_problem(p, device_fingerprint("cpu")).key_id
    st = CacheStore(tmp_path / "c.db")
    live = f"{socket.gethostname()}:{os.getppid()}:0"
    assert st.claim(kid, live, ttl_s=2.0)
    events = []
    [res] = run_tuning([p], cache=st, storage="memory", trials=2, timing=TimingOptions.quick(),
                       on_event=events.append)
    waits = [e for e in events if e["type"] == "key_waiting"]
    assert len(waits) == 1 and waits[0]["owner"] == live and waits[0]["until"] != "?"
    assert res.status == "tuned"


TUNE_INTO = r"""
import sys
from attntune.cache import CacheError, CacheStore
try:
    CacheStore(sys.argv[1])
except CacheError as e:
    print("refused:", e)
"""


def test_tuning_into_a_read_only_directory_is_one_clear_line(tmp_path):
    """Writing (tune, import) needs a writable directory: refused with one line naming the reason, by the
    store and by the command line, before any work; nothing in the directory changes."""
    d = tmp_path / "ro"
    d.mkdir()
    path = make_cache(d / "cache.db")
    before = sorted(os.listdir(d)), path.read_bytes()
    try:
        prefix = _read_only_dir_cmd(d)
        store = subprocess.run(prefix + [sys.executable, "-c", TUNE_INTO, str(path)], capture_output=True,
                               text=True, timeout=120)
        cli = subprocess.run(prefix + [sys.executable, "-m", "attntune", "tune", "--suite", "demo", "--cache",
                                       str(path), "--device", "cpu"], capture_output=True, text=True, timeout=120)
    finally:
        d.chmod(0o755)
    assert "refused:" in store.stdout and "not writable" in store.stdout, (store.stdout, store.stderr[-1500:])
    assert cli.returncode == 2, (cli.stdout[-800:], cli.stderr[-1500:])
    lines = [ln for ln in cli.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not writable" in lines[0] and "Traceback" not in cli.stderr, cli.stderr
    assert (sorted(os.listdir(d)), path.read_bytes()) == before


def test_raw_rows_are_typed_value_by_value(tmp_path):
    """Per-row isolation reads values unconverted, then converts each on its own: a good row comes back
    typed as SQLAlchemy would type it (a datetime, as PostgreSQL's driver gives it — export/import between
    the two compare equal), a malformed value stays raw for judge() to reject its row alone."""
    from datetime import datetime

    good, bad = problem(sq=100), problem(sq=300)
    path = make_cache(tmp_path / "user.db", record(good), record(bad))
    bad_id = TuneKey.from_problem(bad, device_fingerprint("cpu")).key_id
    with sqlite3.connect(path) as c:
        c.execute("UPDATE winners SET created_at = 'garbage' WHERE key_id = ?", (bad_id,))
    rows = {r["key_id"]: r for r in CacheStore(path, readonly=True).raw_winners()}
    assert rows[bad_id]["created_at"] == "garbage"
    [ok] = [r for k, r in rows.items() if k != bad_id]
    assert isinstance(ok["created_at"], datetime) and isinstance(ok["median_ms"], float)


def test_lock_retries_stop_at_their_budget_and_a_stopping_tuner_releases_quickly(tmp_path, monkeypatch):
    """A write that waited out the busy timeout met a lock another process holds: retrying it 7 more times
    turned one write of `tune` into 4 minutes (audit: --time-limit 20 ran 251 s; after Ctrl-C the claims'
    release, with signals held back, kept it alive 12 minutes). Retries stop at their budget, and a stopping
    worker releases its claims through a 1 s connection, no further than the first lock."""
    import sqlite3 as _sqlite3

    from attntune.cache.retry import retry_locked
    from attntune.autotune import runner

    calls = []

    def held(wait):
        calls.append(wait)
        time.sleep(wait)
        raise _sqlite3.OperationalError("database is locked")

    t0 = time.monotonic()
    with pytest.raises(_sqlite3.OperationalError):
        retry_locked(held, 0.3, budget_s=0.5)
    assert len(calls) == 2 and time.monotonic() - t0 < 2.0  # 0.3 s, then past the budget: raised
    calls.clear()
    with pytest.raises(_sqlite3.OperationalError):
        retry_locked(held, 0.0, attempts=4, budget_s=30)
    assert len(calls) == 4  # immediate BUSY: every attempt is tried

    db = tmp_path / "c.db"
    CacheStore(db).dispose()
    tried = []

    def locked_release(self, key_id, owner):
        tried.append((key_id, self.timeout_s))
        raise _sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(CacheStore, "release_claim", locked_release)
    store = CacheStore(db)
    t0 = time.monotonic()
    runner.release_quickly(store, ["k1", "k2", "k3"], "me")
    store.dispose()
    assert {k for k, _ in tried} == {"k1"} and all(t == 1.0 for _, t in tried), tried  # stopped at the lock
    assert time.monotonic() - t0 < 5.0


def test_a_locked_optuna_storage_is_named_as_locked_not_as_bad_data():
    """optuna reports a locked storage as StorageInternalError "invalid data in the commit, e.g. exceeding max
    length"; the key's reason names the storage and the lock (found in the cause chain)."""
    from attntune.autotune.runner import _key_error

    class Storage:
        url = "sqlite:////tmp/x/optuna.db"

    try:
        try:
            raise sqlite3.OperationalError("database is locked")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("An exception is raised during the commit: invalid data") from inner
    except RuntimeError as e:
        why = _key_error(e, Storage())
    assert why.startswith("optuna storage sqlite:////tmp/x/optuna.db: locked by another process"), why
    assert _key_error(ValueError("plain"), Storage()) == "ValueError: plain"
