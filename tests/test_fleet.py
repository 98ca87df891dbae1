"""Fleet tuning: several tuner processes on one cache (SQLite, and a real PostgreSQL server when
``ATTNTUNE_TEST_PG_URL`` names one — ``.ci/run`` starts it), killed workers, SQLite ↔ PostgreSQL copies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from attntune.autotune import claims
from attntune.autotune.runner import run_tuning
from attntune.autotune.study import default_storage_url
from attntune.autotune.timing import TimingOptions
from attntune.cache import CacheStore
from attntune.cli import app
from attntune.device import device_fingerprint
from attntune.key import TuneKey
from attntune.problem import AttentionProblem

BUILTIN = "eager,sdpa_default,sdpa_math"
QUICK = TimingOptions.quick()
PG_ENV = "ATTNTUNE_TEST_PG_URL"


@pytest.fixture(autouse=True)
def _builtin_candidates(monkeypatch):
    monkeypatch.setenv("ATTNTUNE_VARIANTS", BUILTIN)


def prob(b=1, s=16) -> AttentionProblem:
    return AttentionProblem(
        batch=b,
        heads_q=2,
        heads_kv=2,
        seqlen_q=s,
        seqlen_kv=s,
        head_dim=16,
        head_dim_v=16,
        dtype="float32",
        device_type="cpu",
    )


def key_of(p: AttentionProblem) -> TuneKey:
    return TuneKey.from_problem(p, device_fingerprint("cpu"))


@pytest.fixture
def pg_url():
    """A fresh database on the test PostgreSQL server, dropped afterwards."""
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set: no PostgreSQL server to test against (.ci/run starts one)")
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'attntune[postgres]')")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"attntune_{uuid.uuid4().hex[:12]}"
    admin = create_engine(make_url(base).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(base).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def cache_url(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    return request.getfixturevalue("pg_url")


def measured_counts(storage_url: str, key: TuneKey) -> Counter:
    study = optuna.load_study(study_name=key.key_id, storage=storage_url)
    return Counter(
        t.user_attrs["variant"] + t.user_attrs["config"]
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get("measured")
    )


def test_four_workers_on_one_cache_tune_every_key_exactly_once(cache_url):
    problems = [prob(b, s) for b in (1, 2) for s in (16, 24, 32, 48, 64)]
    events = []
    results = run_tuning(
        problems, cache=cache_url, workers=4, timing=QUICK, claim_ttl=30, on_event=events.append
    )
    assert not [e for e in events if e["type"] == "worker_errors"]
    assert sorted(r.status for r in results) == ["tuned"] * len(problems), [
        (r.status, r.reason) for r in results
    ]
    store = CacheStore(cache_url)
    assert store.count() == len(problems)  # no lost winner
    storage = default_storage_url(cache_url)
    for p in problems:
        counts = measured_counts(storage, key_of(p))
        assert len(counts) == 3 and set(counts.values()) == {1}, (
            counts
        )  # tuned once: no config measured twice
        assert len(store.trials(key_of(p).key_id)) == 3
    started = Counter(e["key_id"] for e in events if e["type"] == "key_start")
    assert len(started) == len(problems) and set(started.values()) == {1}
    workers = {e["worker"] for e in events if e["type"] == "key_start"}
    assert len(workers) >= 2  # the keys really were shared out
    for p in problems:
        st = claims.claim_state(store, key_of(p).key_id)
        assert st is not None and st["done"] == 1
    store.dispose()


# A fleet host: `attntune tune` with one extra variant that hangs (as a stuck kernel would) when HANG=1.
WORKER_SCRIPT = """
import json, os, sys, time
from pathlib import Path

from attntune.autotune.runner import run_worker
from attntune.autotune.study import default_storage_url
from attntune.autotune.sweep import SweepOptions
from attntune.autotune.timing import TimingOptions
from attntune.cache.models import utcnow
from attntune.kernels import registry
from attntune.kernels.base import Variant
from attntune.kernels.reference import masked_softmax_attention
from attntune.problem import AttentionProblem


class Hang(Variant):
    name = "t_hang"
    family = "test"

    def supports(self, problem):
        return []

    def run(self, q, k, v, problem, config, kv_lens=None):
        if os.environ.get("HANG") == "1":
            Path(os.environ["MARKER"]).write_text(str(os.getpid()))
            time.sleep(600)
        return masked_softmax_attention(q, k, v, problem, kv_lens).to(q.dtype)


registry.register(Hang())
problems = [AttentionProblem.model_validate_json(s) for s in json.loads(sys.argv[1])]
cache = os.environ["CACHE"]
res = run_worker(problems, cache=cache, storage=default_storage_url(cache),
                 options=SweepOptions(timing=TimingOptions.quick()), run_start=utcnow(),
                 worker=int(os.environ["WORKER"]), claim_ttl=float(os.environ["TTL"]))
print("RESULTS " + json.dumps([json.loads(r.model_dump_json()) for r in res]))
"""


def _spawn(script: Path, problems, cache: str, worker: int, hang: bool, marker: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        CACHE=cache,
        WORKER=str(worker),
        TTL="2",
        HANG="1" if hang else "0",
        MARKER=str(marker),
        ATTNTUNE_VARIANTS=BUILTIN + ",t_hang",
    )
    return subprocess.Popen(
        [sys.executable, str(script), json.dumps([p.model_dump_json() for p in problems])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_worker_killed_mid_key_leaves_its_key_to_another(cache_url, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    marker = tmp_path / "hanging"
    problems = [prob(1, 16), prob(1, 32), prob(2, 16)]
    a = _spawn(script, problems, cache_url, 1, hang=True, marker=marker)
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert a.poll() is None, a.communicate()
            assert time.time() < deadline, "worker A never reached the hanging variant"
            time.sleep(0.1)
        victim = key_of(problems[0])
        store = CacheStore(cache_url)
        st = claims.claim_state(store, victim.key_id)
        assert st is not None and st["done"] == 0 and st["owner"].endswith(f":{a.pid}:1")
        a.send_signal(signal.SIGKILL)  # no clean-up at all: its claim stays until it expires
        a.wait(timeout=30)
    finally:
        if a.poll() is None:
            a.kill()
    assert claims.claim_state(store, victim.key_id)["done"] == 0
    b = _spawn(script, problems, cache_url, 2, hang=False, marker=marker)
    out, err = b.communicate(timeout=300)
    assert b.returncode == 0, err
    results = json.loads(out.split("RESULTS ", 1)[1])
    assert [r["status"] for r in results] == ["tuned"] * 3, results
    assert store.count() == 3
    st = claims.claim_state(store, victim.key_id)
    assert st["done"] == 1 and st["owner"].endswith(f":{b.pid}:2")
    storage = default_storage_url(cache_url)
    counts = measured_counts(storage, victim)
    # A measured the three torch variants before it hung; B measured only what was left: t_hang.
    assert len(counts) == 4 and set(counts.values()) == {1}, counts
    study = optuna.load_study(study_name=victim.key_id, storage=storage)
    states = Counter(t.state.name for t in study.get_trials(deepcopy=False))
    assert states["FAIL"] >= 1 and states["RUNNING"] == 0  # A's hung trial was failed by B, not left running
    store.dispose()


def test_export_import_round_trips_between_sqlite_and_postgresql(tmp_path, pg_url):
    runner = CliRunner()
    sqlite_a, sqlite_b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    run_tuning([prob(1, 16), prob(2, 32), prob(1, 64)], cache=sqlite_a, timing=QUICK, storage="memory")

    def export(cache: str, name: str) -> dict:
        path = tmp_path / name
        res = runner.invoke(app, ["export", str(path), "--cache", cache, "--no-system"])
        assert res.exit_code == 0, res.output
        return json.loads(path.read_text())

    def import_(path: Path, cache: str) -> None:
        res = runner.invoke(app, ["import", str(path), "--cache", cache])
        assert res.exit_code == 0, res.output
        assert "imported 3 rows" in res.output

    def by_key(doc: dict) -> list:
        return sorted(doc["records"], key=lambda r: json.dumps(r["key"], sort_keys=True))

    def rows(cache: str) -> dict:
        store = CacheStore(cache)
        out = {r["key_id"]: r for r in store.raw_winners()}
        store.dispose()
        return out

    from_sqlite = export(sqlite_a, "a.json")
    assert len(from_sqlite["records"]) == 3
    import_(tmp_path / "a.json", pg_url)
    from_pg = export(pg_url, "pg.json")
    assert by_key(from_pg) == by_key(from_sqlite)
    import_(tmp_path / "pg.json", sqlite_b)
    assert by_key(export(sqlite_b, "b.json")) == by_key(from_sqlite)
    # every column of every row, as stored: floats, JSON text, timestamps (microseconds) alike
    assert rows(pg_url) == rows(sqlite_a) == rows(sqlite_b)
