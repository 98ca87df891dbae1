"""Cache: round trip, layering, upsert keeps the better row, stale/poisoned rows rejected, broken files."""

import json
import sqlite3
import warnings

import pytest

from attntune.cache import CacheStore, LayeredCache, WinnerRecord, judge, utcnow
from attntune.cache import layered as layered_mod
from attntune.cache.models import record_to_row
from attntune.cache.schema import SCHEMA_VERSION, Meta
from attntune.device import SoftwareFingerprint, device_fingerprint, software_fingerprint
from attntune.key import TuneKey
from attntune.kernels import registry
from attntune.problem import AttentionProblem


def make_key(sq=100, d=16, dtype="float32"):
    p = AttentionProblem(batch=2, heads_q=4, heads_kv=4, seqlen_q=sq, seqlen_kv=sq, head_dim=d, head_dim_v=d,
                         dtype=dtype, device_type="cpu")
    return TuneKey.from_problem(p, device_fingerprint("cpu"))


def make_rec(key=None, variant="sdpa_math", ms=1.0, config=None, **kw):
    key = key or make_key()
    v = registry.get(variant)
    return WinnerRecord(key=key, variant=variant, config=config or {}, median_ms=ms,
                        fingerprint=software_fingerprint(v.source_hash(), "cpu"), created_at=utcnow(), **kw)


def test_round_trip(tmp_path):
    st = CacheStore(tmp_path / "c.db")
    rec = make_rec(sdpa_default_ms=2.0, runner_up="sdpa_flash", runner_up_ms=1.5, max_error=1e-6, trials=7)
    assert st.upsert_winner(rec)
    st2 = CacheStore(tmp_path / "c.db")  # a fresh connection reads the same thing back
    rows = [judge(r, "user") for r in st2.raw_winners()]
    assert len(rows) == 1 and rows[0].status == "valid"
    assert rows[0].record == rec
    assert rows[0].record.speedup == pytest.approx(2.0)


def test_upsert_keeps_faster(tmp_path):
    st = CacheStore(tmp_path / "c.db")
    assert st.upsert_winner(make_rec(ms=1.0))
    assert not st.upsert_winner(make_rec(variant="sdpa_flash", ms=2.0))
    assert st.raw_winner(make_key().key_id)["variant"] == "sdpa_math"
    assert st.upsert_winner(make_rec(variant="sdpa_flash", ms=0.5))
    assert st.raw_winner(make_key().key_id)["variant"] == "sdpa_flash"
    assert st.upsert_winner(make_rec(ms=3.0), force=True)
    assert st.raw_winner(make_key().key_id)["median_ms"] == 3.0
    assert st.count() == 1


def test_layering_user_over_system(tmp_path):
    sys_st = CacheStore(tmp_path / "sys.db")
    sys_st.upsert_winner(make_rec(ms=1.0))
    sys_st.upsert_winner(make_rec(key=make_key(sq=1000), ms=9.0))
    sys_st.prepare_for_shipping()
    sys_st.dispose()
    user = CacheStore(tmp_path / "user.db")
    user.upsert_winner(make_rec(variant="sdpa_flash", ms=5.0))  # user row wins even though slower
    lc = LayeredCache([("user", user), ("system", CacheStore(tmp_path / "sys.db", readonly=True))])
    eff = lc.effective()
    assert eff[make_key().key_id].record.variant == "sdpa_flash" and eff[make_key().key_id].origin == "user"
    assert eff[make_key(sq=1000).key_id].origin == "system"
    assert len(lc.all_rows()) == 3


def test_readonly_store_never_writes(tmp_path):
    CacheStore(tmp_path / "c.db").dispose()
    ro = CacheStore(tmp_path / "c.db", readonly=True)
    with pytest.raises(Exception, match="read-only"):
        ro.upsert_winner(make_rec())


def _poison(st, key_id, **cols):
    with sqlite3.connect(st.engine.url.database) as c:
        sets = ", ".join(f"{k} = ?" for k in cols)
        c.execute(f"UPDATE winners SET {sets} WHERE key_id = ?", (*cols.values(), key_id))


@pytest.mark.parametrize("cols, status, reason", [
    ({"variant": "no_such_variant"}, "rejected", "unknown variant"),
    ({"config_json": "{not json"}, "rejected", "malformed"),
    ({"config_json": json.dumps({"BLOCK_M": 10**9})}, "rejected", "unknown parameters"),
    ({"key_json": "[]"}, "rejected", "malformed"),
    ({"median_ms": -1.0}, "rejected", "malformed"),
    ({"fingerprint_json": SoftwareFingerprint(torch="1.0.0", variant_hash="x").model_dump_json()}, "stale", "torch"),
])
def test_poisoned_rows_rejected(tmp_path, cols, status, reason):
    st = CacheStore(tmp_path / "c.db")
    rec = make_rec()
    st.upsert_winner(rec)
    _poison(st, rec.key_id, **cols)
    [row] = LayeredCache([("user", st)]).all_rows()
    assert row.status == status
    assert any(reason in r for r in row.reasons), row.reasons


def test_key_id_mismatch_rejected(tmp_path):
    st = CacheStore(tmp_path / "c.db")
    rec = make_rec()
    st.upsert_winner(rec)
    _poison(st, rec.key_id, key_json=make_key(sq=5000).model_dump_json())
    [row] = LayeredCache([("user", st)]).all_rows()
    assert row.status == "rejected" and "key_id" in row.reasons[0]


def test_config_domain_checked(tmp_path):
    from attntune.kernels.base import Param, Space, Variant

    class Tunable(Variant):
        name = "test_tunable"

        def supports(self, problem):
            return []

        def space(self, problem):
            return Space((Param("BLOCK", (16, 32)),), constraint=lambda c: ["too big"] if c["BLOCK"] > 16 else [])

        def run(self, q, k, v, problem, config, kv_lens=None):
            return q

    registry.register(Tunable())
    try:
        ok = judge(record_to_row(make_rec(variant="test_tunable", config={"BLOCK": 16})), "t")
        out = judge(record_to_row(make_rec(variant="test_tunable", config={"BLOCK": 64})), "t")
        bad = judge(record_to_row(make_rec(variant="test_tunable", config={"BLOCK": 32})), "t")
        missing = judge(record_to_row(make_rec(variant="test_tunable", config={})), "t")
    finally:
        registry.unregister("test_tunable")
    assert ok.status == "valid"
    assert out.status == "rejected" and "outside" in out.reasons[0]
    assert bad.status == "rejected" and "too big" in bad.reasons[0]
    assert missing.status == "rejected" and "missing" in missing.reasons[0]


def test_a_row_whose_variant_changed_its_config_format_is_stale_not_rejected():
    """A kernel change that adds a launch knob stales the rows written before it (their source hash differs)
    and puts their configs out of the new domain: they read as stale (not damaged), never as hints; the same
    out-of-domain config under the current source is rejected."""
    from attntune.kernels.base import Param, Space, Variant

    class Knobbed(Variant):
        name = "test_knobbed"

        def supports(self, problem):
            return []

        def space(self, problem):
            return Space((Param("BLOCK", (16, 32)), Param("NEW_KNOB", (0, 1))))

        def run(self, q, k, v, problem, config, kv_lens=None):
            return q

    registry.register(Knobbed())
    try:
        rec = make_rec(variant="test_knobbed", config={"BLOCK": 16})
        same = judge(record_to_row(rec), "t")
        old_fp = rec.fingerprint.model_copy(update={"variant_hash": "before-the-knob"})
        old = judge(record_to_row(rec.model_copy(update={"fingerprint": old_fp})), "t")
    finally:
        registry.unregister("test_knobbed")
    assert same.status == "rejected" and "missing parameter NEW_KNOB" in same.reasons[0]
    assert old.status == "stale" and not old.hint
    assert old.reasons == ["variant source changed", "config out of domain: missing parameter NEW_KNOB"]


@pytest.mark.parametrize("content", [b"", b"garbage" * 100, b"SQLite format 3\x00" + b"\x00" * 50])
def test_broken_system_cache_warns_once(tmp_path, monkeypatch, content):
    bad = tmp_path / "cache.db"
    bad.write_bytes(content)
    monkeypatch.setattr(layered_mod, "_WARNED", set())
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", str(bad))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lc = LayeredCache.open_default()
        lc2 = LayeredCache.open_default()
        rows = lc.effective()
        lc2.effective()
    assert rows == {}
    assert [lbl for lbl, _ in lc.layers] == ["user"]
    msgs = [str(w.message) for w in caught if "attntune" in str(w.message)]
    assert len(msgs) == 1, msgs
    assert bad.read_bytes() == content  # never modified


def test_truncated_shipped_cache(tmp_path, monkeypatch):
    good = CacheStore(tmp_path / "full.db")
    for n in range(20):
        good.upsert_winner(make_rec(key=make_key(sq=100 + 50 * n)))
    good.prepare_for_shipping()
    good.dispose()
    data = (tmp_path / "full.db").read_bytes()
    (tmp_path / "trunc.db").write_bytes(data[: len(data) // 3])
    monkeypatch.setattr(layered_mod, "_WARNED", set())
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", str(tmp_path / "trunc.db"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lc = LayeredCache.open_default()
        lc.effective()
    assert len([w for w in caught if "attntune" in str(w.message)]) <= 1


def test_newer_schema_refused(tmp_path):
    st = CacheStore(tmp_path / "c.db")
    with sqlite3.connect(st.engine.url.database) as c:
        c.execute("UPDATE attntune_meta SET value = '999' WHERE name = 'schema_version'")
    with pytest.raises(Exception, match="newer"):
        CacheStore(tmp_path / "c.db")


def test_misses_and_claims(tmp_path):
    st = CacheStore(tmp_path / "c.db")
    k = make_key()
    st.record_miss(k)
    st.record_miss(k, count=2)
    [m] = st.misses()
    assert m["count"] == 3 and TuneKey.model_validate_json(m["key_json"]) == k
    assert st.claim("k1", "a", ttl_s=60)
    assert not st.claim("k1", "b", ttl_s=60)
    assert st.claim("k2", "b", ttl_s=-1)  # already expired: another worker may take it over
    assert st.claim("k2", "a", ttl_s=60)
    st.finish_claim("k2", "a")
    assert not st.claim("k2", "b", ttl_s=-1)


def test_shipped_cache_opens():
    from pathlib import Path

    shipped = Path(__file__).resolve().parent.parent / "cache.db"
    assert shipped.exists()
    st = CacheStore(shipped, readonly=True)
    rows = [judge(r, "system") for r in st.raw_winners()]
    assert all(r.status in ("valid", "stale") for r in rows), [r.reasons for r in rows if r.status == "rejected"]


def _make_v1(path):
    """A cache as schema version 1 wrote it (no winners.rel_error, .spread, .busy)."""
    st = CacheStore(path)
    st.upsert_winner(make_rec(max_error=1e-6))
    st.dispose()
    with sqlite3.connect(path) as c:
        c.execute("ALTER TABLE winners DROP COLUMN rel_error")
        c.execute("ALTER TABLE winners DROP COLUMN spread")
        c.execute("ALTER TABLE winners DROP COLUMN busy")
        c.execute("UPDATE attntune_meta SET value = '1' WHERE name = 'schema_version'")


def test_v1_cache_read_only_and_migrated(tmp_path):
    _make_v1(tmp_path / "v1.db")
    ro = CacheStore(tmp_path / "v1.db", readonly=True)  # cannot migrate: read without the new column
    [row] = [judge(r, "system") for r in ro.raw_winners()]
    assert row.status == "valid" and row.record.rel_error is None
    ro.dispose()
    st = CacheStore(tmp_path / "v1.db")  # writable: migrated in place, nothing lost
    with sqlite3.connect(tmp_path / "v1.db") as c:
        cols = [r[1] for r in c.execute("PRAGMA table_info(winners)")]
        version = c.execute("SELECT value FROM attntune_meta WHERE name='schema_version'").fetchone()[0]
    assert "rel_error" in cols and "spread" in cols and "busy" in cols and version == str(SCHEMA_VERSION)
    assert st.count() == 1
    assert st.upsert_winner(make_rec(ms=0.5, rel_error=0.03, busy=0.0))
    [row] = [judge(r, "user") for r in st.raw_winners()]
    assert row.record.rel_error == 0.03 and row.record.busy == 0.0


def _open_when_released(path, barrier, errors):
    barrier.wait()
    try:
        CacheStore(path)
    except Exception as e:  # noqa: BLE001 — reported to the parent
        errors.put(f"{type(e).__name__}: {e}")


def test_many_processes_open_a_fresh_cache_at_once(tmp_path):
    """Fleet workers open a not-yet-existing SQLite cache simultaneously: schema creation races
    (check-then-CREATE TABLE) must resolve without an error in any of them."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    for round_ in range(4):
        path = tmp_path / f"fresh{round_}.db"
        barrier, errors = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_open_when_released, args=(path, barrier, errors)) for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        found = []
        while not errors.empty():
            found.append(errors.get())
        assert not found, found
        assert all(p.exitcode == 0 for p in procs)
        with CacheStore(path).session() as s:
            assert s.get(Meta, "schema_version").value == str(SCHEMA_VERSION)


def test_shipped_cache_found_in_the_install_data_dir(tmp_path, monkeypatch):
    """A wheel install has no source tree: the shipped cache is looked up in <data>/share/attntune."""
    import shutil
    import sysconfig

    from pathlib import Path

    monkeypatch.delenv("ATTNTUNE_SYSTEM_CACHE", raising=False)
    data = tmp_path / "prefix"
    (data / "share" / "attntune").mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parent.parent / "cache.db", data / "share" / "attntune" / "cache.db")
    fake_pkg = tmp_path / "site" / "attntune" / "cache" / "layered.py"  # no cache.db three levels up
    monkeypatch.setattr(layered_mod, "__file__", str(fake_pkg))
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(data) if name == "data" else "")
    assert layered_mod.system_cache_path() == data / "share" / "attntune" / "cache.db"
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(tmp_path / "elsewhere"))
    monkeypatch.setattr(layered_mod.sys, "prefix", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(layered_mod.sys, "base_prefix", str(tmp_path / "elsewhere"))
    assert layered_mod.system_cache_path() is None


def test_wheel_carries_the_shipped_cache(tmp_path):
    """`pip install attntune` (not editable) must still give an H200 user the shipped tuned rows."""
    import shutil
    import subprocess
    import sys
    import zipfile

    from pathlib import Path

    pytest.importorskip("setuptools", reason="building a wheel needs setuptools")
    root = Path(__file__).resolve().parent.parent
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds, and a build/
    # left from an earlier state would put deleted modules into the wheel.
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".whl", "build", "dist", "*.egg-info", "__pycache__", "*.db-wal", "*.db-shm"))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("attntune-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist() if n.endswith("/data/share/attntune/cache.db")]
        assert len(names) == 1, z.namelist()
        assert z.read(names[0]) == (root / "cache.db").read_bytes()


def test_a_postgres_server_that_never_answers_is_skipped_in_seconds_and_no_password_is_shown():
    """A server that accepts the connection and stays silent (hung, overloaded, a half-open firewall)
    blocked the first attention() call forever: the connect timeout bounds it, and the messages that
    name the database mask its password."""
    pytest.importorskip("psycopg")
    import socket
    import threading
    import time

    from attntune.cache.store import CacheError, display_url

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []

    def accept():
        try:
            while True:
                held.append(srv.accept()[0])  # never answer
        except OSError:
            return

    threading.Thread(target=accept, daemon=True).start()
    url = f"postgresql+psycopg://tuner:s3cret@127.0.0.1:{srv.getsockname()[1]}/attntune"
    got = []

    def open_it():  # in a thread: a regression fails this test instead of hanging the suite
        try:
            CacheStore(url, readonly=True, timeout_s=0.2)
        except Exception as e:  # noqa: BLE001
            got.append(e)

    t = threading.Thread(target=open_it, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(timeout=20)
    srv.close()
    for c in held:
        c.close()
    assert not t.is_alive(), "opening a silent PostgreSQL server did not time out in 20 s"
    assert time.monotonic() - t0 < 15
    assert len(got) == 1 and isinstance(got[0], CacheError), got
    assert "s3cret" not in str(got[0]) and "***" in str(got[0])
    assert display_url(url) == url.replace("s3cret", "***")
    assert display_url("/a/path/cache.db") == "/a/path/cache.db"


def test_another_applications_sqlite_database_is_never_written(tmp_path):
    """A --cache / ATTNTUNE_CACHE pointing at another application's database: it got attntune's tables
    and was switched to WAL (by the runtime's miss writer, tune and import) after a warning that said
    it was ignored."""
    from attntune.cache.store import CacheError

    app_db = tmp_path / "app.db"
    con = sqlite3.connect(app_db)
    con.execute("create table users (id integer)")
    con.commit()
    con.close()
    for readonly in (False, True):
        with pytest.raises(CacheError, match="not an attntune cache"):
            CacheStore(app_db, readonly=readonly)
    con = sqlite3.connect(app_db)
    assert [r[0] for r in con.execute("select name from sqlite_master where type='table'")] == ["users"]
    assert con.execute("pragma journal_mode").fetchone()[0] == "delete"
    con.close()
    CacheStore(tmp_path / "empty.db").dispose()  # an empty file still becomes a cache


def test_a_symlink_loop_at_the_cache_path_does_not_take_the_other_layers_down(tmp_path, monkeypatch):
    from attntune.cache.store import normalize_url

    (tmp_path / "a.db").symlink_to(tmp_path / "b.db")
    (tmp_path / "b.db").symlink_to(tmp_path / "a.db")
    assert normalize_url(tmp_path / "a.db") == f"sqlite:///{tmp_path / 'a.db'}"
    system = tmp_path / "system.db"
    st = CacheStore(system)
    st.upsert_winner(make_rec(key=make_key(sq=64)))
    st.dispose()
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", str(system))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lc = LayeredCache.open_default(str(tmp_path / "a.db"))
    assert [label for label, _ in lc.layers] == ["system"]
    assert [f.label for f in lc.failures] == ["user"]
