"""``attntune tune`` against damaged neighbours and stop signals: a damaged optuna storage is one line
naming it (not an opaque error on every key); a worker process stopped while it is still starting up
reports an interrupt (no traceback, no "worker died")."""

from __future__ import annotations

import multiprocessing.context
import os
import signal
import sqlite3

import pytest
from typer.testing import CliRunner

from attntune.autotune.runner import Interrupted, run_tuning
from attntune.autotune.timing import TimingOptions
from attntune.cache import CacheStore
from attntune.cli import app
from attntune.problem import AttentionProblem

runner = CliRunner()
TUNE = ["tune", "--device", "cpu", "--quick", "--trials", "1", "--refine", "0"]


@pytest.fixture(autouse=True)
def _cpu_torch_variants(monkeypatch):
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "sdpa_default,sdpa_math")


def prob(sq: int) -> AttentionProblem:
    return AttentionProblem(batch=1, heads_q=2, heads_kv=2, seqlen_q=sq, seqlen_kv=sq, head_dim=16, head_dim_v=16,
                            dtype="float32", device_type="cpu")


def test_an_optuna_storage_with_damaged_pages_is_one_line_naming_it(tmp_path):
    cache = str(tmp_path / "c.db")
    res = runner.invoke(app, [*TUNE, "--shape", "b=1,hq=2,sq=32,d=16", "--cache", cache])
    assert res.exit_code == 0, res.output
    optuna_db = tmp_path / "optuna.db"
    con = sqlite3.connect(optuna_db)  # the trials into the main file, where the damage goes
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'trial_user_attributes'").fetchone()[0]
    page = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    # the header page stays intact (the file opens and reads), one table written by every trial is damaged
    data = bytearray(optuna_db.read_bytes())
    start = (root - 1) * page
    data[start:start + page] = bytes((i * 37 + 11) % 256 for i in range(page))
    optuna_db.write_bytes(bytes(data))

    res = runner.invoke(app, [*TUNE, "--shape", "b=1,hq=2,sq=48,d=16", "--cache", cache])
    # before: every key "error: StorageInternalError: ... e.g. exceeding max length", exit 1
    assert res.exit_code == 2, res.output
    assert "optuna storage" in res.output and "optuna.db" in res.output
    assert "malformed" in res.output and "--storage memory" in res.output
    assert "StorageInternalError" not in res.output


@pytest.mark.parametrize("error,advice,not_advice", [
    ("database or disk is full", "free space", "delete it"),
    ("attempt to write a readonly database", "writable", "delete it"),
    ("file is not a database", "delete it", "free space"),
    ("could not connect to server: Connection refused", "check the URL", "delete it"),
])
def test_an_unusable_optuna_storage_gets_the_advice_of_its_cause(tmp_path, monkeypatch, error, advice, not_advice):
    """"delete it" was the advice whatever the cause: on a full disk or a read-only file that throws away a
    good study (the next run resumes from it once the cause is gone). Each cause now gets its own fix."""
    from attntune.autotune import study

    def failing(url):
        raise sqlite3.OperationalError(error)

    monkeypatch.setattr(study, "_open_rdb", failing)
    res = runner.invoke(app, [*TUNE, "--shape", "b=1,hq=2,sq=32,d=16", "--cache", str(tmp_path / "c.db")])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert error in out and advice in out and not_advice not in out and "--storage memory" in out


def test_a_cache_that_fills_the_disk_mid_run_is_named_and_keeps_the_finished_keys(tmp_path, monkeypatch):
    """A full disk while a winner is written: the key ended "error: OperationalError: database or disk is
    full" in the table and tune exited 0. It now exits 1 with one line naming the cache, saying the finished
    keys are kept and what to do."""
    calls = []
    real = CacheStore.upsert_winner

    def filling(self, rec, force=False):
        calls.append(rec.key.key_id)
        if len(calls) > 1:
            raise sqlite3.OperationalError("database or disk is full")
        return real(self, rec, force)

    monkeypatch.setattr(CacheStore, "upsert_winner", filling)
    cache = tmp_path / "c.db"
    res = runner.invoke(app, [*TUNE, "--shape", "b=1,hq=2,sq=32,d=16", "--shape", "b=1,hq=2,sq=48,d=16",
                              "--cache", str(cache)])
    assert res.exit_code == 1, res.output
    out = " ".join(res.output.split())
    assert "1 of 2 keys failed" in out and str(cache) in out and "disk is full" in out and "kept" in out
    assert "free space" in out
    monkeypatch.setattr(CacheStore, "upsert_winner", real)
    assert [r["key_id"] for r in CacheStore(str(cache)).raw_winners()] == calls[:1]


def test_database_errors_get_the_fix_of_their_cause():
    from attntune.cache.store import CacheError
    from attntune.cli.errors import describe

    for msg, fix in (("disk I/O error", "-wal/-shm"), ("database or disk is full", "free space"),
                     ("attempt to write a readonly database", "writable")):
        line, code = describe(CacheError(f"user cache sqlite:///x.db: cannot read (OperationalError: {msg})"))
        assert code == 2 and line.startswith("user cache sqlite:///x.db") and fix in line, line
    line, _ = describe(CacheError("user cache sqlite:///x.db: cannot read (DatabaseError: file is not a database)"))
    assert "delete" not in line  # deleting a damaged cache loses its winners: no such advice here


def test_a_worker_stopped_while_starting_reports_an_interrupt(tmp_path, monkeypatch, capfd):
    """Ctrl-C reaches every process of the terminal's group, and ``tune`` passes SIGTERM on to its
    workers as SIGINT: a worker still importing torch printed a KeyboardInterrupt traceback from
    multiprocessing's bootstrap (or died at once) and the parent said "worker N died". Forced here: each
    worker gets SIGINT the moment it is started, long before its own handlers exist."""
    real_start = multiprocessing.context.SpawnProcess.start

    def start_then_interrupt(self):
        real_start(self)
        os.kill(self.pid, signal.SIGINT)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start_then_interrupt)
    cache = str(tmp_path / "c.db")
    events = []
    with pytest.raises(Interrupted):
        run_tuning([prob(32), prob(48)], cache=cache, workers=2, timing=TimingOptions.quick(), refine=0,
                   trials=1, on_event=events.append)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not [ev for ev in events if ev["type"] == "worker_errors"]
    store = CacheStore(cache)  # nothing claimed is left live; the cache is usable
    from attntune.cache.schema import Claim

    with store.session() as s:
        assert not s.query(Claim).filter(Claim.done == 0).all()
    store.dispose()


def test_ctrl_c_sent_to_the_parent_alone_stops_every_worker(tmp_path, capfd):
    """``kill -INT`` of ``tune``'s process alone (a supervisor, a script): the parent stopped, its workers
    tuned on until terminated 35 s later and their claims stayed live. The parent now passes the signal on,
    and each worker releases its claim and reports an interrupt."""
    import threading

    cache = str(tmp_path / "c.db")
    events, sent = [], []

    def on_event(ev):
        events.append(ev)
        if ev["type"] == "key_start" and not sent:  # a worker is inside a key: stop the parent only
            sent.append(1)
            threading.Timer(0.0, os.kill, (os.getpid(), signal.SIGINT)).start()

    keys = [prob(s) for s in range(40, 40 + 8 * 40, 8)]  # 40 keys: seconds of work left for each worker
    with pytest.raises(Interrupted):
        run_tuning(keys, cache=cache, workers=2, timing=TimingOptions.quick(), refine=0, trials=4,
                   on_event=on_event)
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert not [ev for ev in events if ev["type"] == "worker_errors"]
    store = CacheStore(cache)
    from attntune.cache.schema import Claim

    with store.session() as s:
        assert not s.query(Claim).filter(Claim.done == 0).all()  # every worker released its claim
    # the workers stopped in the key they were in (at most that one finished); before, they went on (7 keys)
    assert store.count() <= 2, store.count()
    store.dispose()
