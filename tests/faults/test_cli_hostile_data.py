"""The command line against hostile data and odd targets (a cache/CLI audit, 2026-12-05): rows nested past
the JSON parser's depth, bracketed text that rich would read as markup, integers past Python's digit limit,
sizes past int64, output targets that are devices, FIFOs or standard output, and junk in ATTNTUNE_DEBUG /
ATTNTUNE_CACHE. Each failed with a traceback-like internal error, silently lost data, or replaced a file
that was not ours; each now gets one clear line, or works."""

import json
import os
import sqlite3
import stat
import threading

import pytest
from typer.testing import CliRunner

import attntune
from attntune.cache import CacheStore, judge
from attntune.cli import app

from test_cache import make_key, make_rec

runner = CliRunner()
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _cache(path, **rec):
    st = CacheStore(path)
    st.upsert_winner(make_rec(key=make_key(sq=64), **rec))
    st.dispose()
    return str(path)


def test_a_row_nested_past_the_parsers_depth_is_rejected_alone(tmp_path, monkeypatch):
    """One row whose config JSON nests 100k deep raised RecursionError out of judge(): the runtime dropped
    every cache layer (the healthy system cache too) and show/export/doctor failed. Now that row alone is
    rejected as malformed."""
    good = _cache(tmp_path / "system.db")
    bad = _cache(tmp_path / "user.db")
    con = sqlite3.connect(bad)
    con.execute("UPDATE winners SET config_json = ?", ("[" * 100000 + "]" * 100000,))
    con.commit()
    con.close()
    [raw] = CacheStore(bad, readonly=True).raw_winners()
    row = judge(raw, "user")
    assert row.status == "rejected" and row.reasons[0].startswith("malformed row")
    res = runner.invoke(app, ["show", "--status", "all", "--cache", bad], env={"ATTNTUNE_SYSTEM_CACHE": good})
    assert res.exit_code == 0, res.output
    assert "valid" in res.stdout and "system" in res.stdout  # the key's healthy row, from the other layer
    res = runner.invoke(app, ["doctor", "--cache", bad], env={"ATTNTUNE_SYSTEM_CACHE": good})
    assert res.exit_code == 0 and "malformed row" in res.stdout, res.output  # listed, counted, no crash
    monkeypatch.setenv("ATTNTUNE_CACHE", bad)
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", good)
    attntune.reset()
    q = make_key(sq=64).representative()
    import torch

    t = torch.zeros(q.batch, q.heads_q, q.seqlen_q, q.head_dim)
    assert attntune.explain(t, t, t).source == "tuned"  # the runtime kept the system layer


@pytest.mark.parametrize("content, words", [
    ('{"format": "attntune-cache", "version": 1, "records": [' + "9" * 5000 + "]}", "ValueError"),
    ("[" * 100000, "RecursionError"),
], ids=["5000-digit-int", "nested-100k"])
def test_import_of_json_python_cannot_parse_is_one_line(tmp_path, content, words):
    f = tmp_path / "hostile.json"
    f.write_text(content)
    res = runner.invoke(app, ["import", str(f), "--cache", str(tmp_path / "c.db")])
    assert res.exit_code == 2, res.output
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("attntune: error:") and "not valid JSON" in line and words in line, line


def test_bracketed_text_is_shown_as_text_not_rich_markup(tmp_path):
    """A variant named "[/]" made import end with rich's MarkupError (exit 1); an imported arch "cpu[/]"
    made every later `show` fail. Cached and imported text is data: shown as it is."""
    cache = _cache(tmp_path / "c.db")
    exported = tmp_path / "e.json"
    assert runner.invoke(app, ["export", str(exported), "--cache", cache]).exit_code == 0
    doc = json.loads(exported.read_text())
    rec = doc["records"][0]
    rec["key"]["device"]["arch"] = "cpu-avx2[/]"
    rec["variant"] = "[bold]x[/]"
    exported.write_text(json.dumps(doc))
    res = runner.invoke(app, ["import", str(exported), "--cache", str(tmp_path / "c2.db")])
    assert res.exit_code == 2 and "unknown variant '[bold]x[/]'" in res.stdout, res.output
    rec["variant"] = "sdpa_math"
    exported.write_text(json.dumps(doc))
    res = runner.invoke(app, ["import", str(exported), "--cache", str(tmp_path / "c2.db")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["show", "--cache", str(tmp_path / "c2.db")], env={"ATTNTUNE_SYSTEM_CACHE": ""})
    assert res.exit_code == 0 and "cpu-avx2[/]" in res.stdout, res.output


@pytest.mark.parametrize("spec", ["b=99999999999999999999,hq=4,sq=64,d=32", "hq=4,sq=64,d=32,window=9999999999:0"],
                         ids=["batch", "window"])
def test_sizes_past_what_a_kernel_indexes_name_the_field(spec):
    res = runner.invoke(app, ["explain", "--shape", spec])
    assert res.exit_code == 2, res.output
    [line] = res.stderr.strip().splitlines()
    assert "Invalid value for --shape" in line and ("field b" in line or "field window" in line), line


def test_export_writes_into_devices_fifos_and_stdout_and_never_replaces_them(tmp_path):
    """As root, `export /dev/null` replaced the device node with a JSON file, and `export FIFO` blocked
    forever reading the FIFO to look for an SQLite header. Such targets are written into, as a shell
    redirection would; `-` is standard output (the command's own line then goes to stderr)."""
    cache = _cache(tmp_path / "c.db")
    if AS_ROOT:  # a null device of our own (never the system's /dev/null: a regression would replace it)
        dev = tmp_path / "null"
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        res = runner.invoke(app, ["export", str(dev), "--cache", cache])
        assert res.exit_code == 0 and stat.S_ISCHR(os.stat(dev).st_mode), res.output
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    res = runner.invoke(app, ["export", str(fifo), "--cache", cache])
    reader.join(30)
    assert res.exit_code == 0 and stat.S_ISFIFO(os.stat(fifo).st_mode), res.output
    assert json.loads(got[0])["format"] == "attntune-cache"
    res = runner.invoke(app, ["export", "-", "--cache", cache])
    assert res.exit_code == 0 and json.loads(res.stdout)["format"] == "attntune-cache", res.output
    assert "exported 1 rows to -" in res.stderr and not (tmp_path / "-").exists()


def test_junk_in_attntune_debug_is_off_not_a_usage_error(tmp_path):
    cache = _cache(tmp_path / "c.db")
    res = runner.invoke(app, ["show", "--cache", cache], env={"ATTNTUNE_DEBUG": "maybe"})
    assert res.exit_code == 0, res.output


def test_a_blank_attntune_cache_is_unset_not_a_file_named_blank(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNTUNE_CACHE", "  ")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    from attntune.cache import user_cache_url

    assert user_cache_url() == str(tmp_path / "xdg" / "attntune" / "cache.db")
    assert attntune  # (the runtime reads the same function)


def test_a_row_dated_in_the_future_is_refused_by_import_and_retuned_by_force(tmp_path):
    """A row dated 2099 (a skewed clock, a forged file) looked like another worker's fresh result to every
    later run: `tune --force` and the busy-CPU re-time skipped it for good. import refuses such rows, and a
    run takes a stored one as predating it."""
    from datetime import datetime, timedelta

    from attntune.cache import utcnow
    from attntune.cache.models import record_to_row
    from attntune.autotune.runner import _needs_tuning

    future = make_rec(key=make_key(sq=64)).model_copy(update={"created_at": datetime(2099, 1, 1)})
    tune, rec, forced = _needs_tuning(record_to_row(future), True, utcnow())
    assert tune and rec is not None and not forced
    fresh = make_rec(key=make_key(sq=64)).model_copy(update={"created_at": utcnow() + timedelta(seconds=5)})
    assert _needs_tuning(record_to_row(fresh), True, utcnow() - timedelta(seconds=1))[0] is False  # this run's
    f = tmp_path / "future.json"
    f.write_text(json.dumps({"format": "attntune-cache", "version": 1,
                             "records": [json.loads(future.model_dump_json())]}))
    res = runner.invoke(app, ["import", str(f), "--cache", str(tmp_path / "c.db")])
    assert res.exit_code == 2 and "is in the future" in res.stdout, res.output


def test_storage_that_is_a_cache_or_another_apps_database_is_refused_untouched(tmp_path):
    """--storage naming another application's SQLite file added optuna's 12 tables to it and switched it to
    WAL (exit 0); naming the cache itself clashed with its `trials` table ("invalid data in the commit",
    naming neither file). Both are refused before anything is written, naming --storage."""
    app_db = tmp_path / "app.db"
    con = sqlite3.connect(app_db)
    con.execute("CREATE TABLE users (id INTEGER)")
    con.commit()
    con.close()
    cache = _cache(tmp_path / "c.db")
    for target, words in ((app_db, "other tables (users)"), (cache, "is an attntune cache")):
        res = runner.invoke(app, ["tune", "--shape", "hq=2,sq=16,d=8", "--trials", "1", "--cache", cache,
                                  "--storage", str(target)])
        assert res.exit_code == 2, res.output
        [line] = res.stderr.strip().splitlines()
        assert "Invalid value for --storage" in line and words in line, line
    con = sqlite3.connect(app_db)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["users"]
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    con.close()


@pytest.mark.parametrize("path, value", [
    (("key", "batch"), -1), (("key", "heads_q"), 10**20), (("key", "seqlen_kv"), True),
    (("median_ms",), True), (("median_ms",), "0.001"), (("median_ms",), 1e-320),
], ids=["batch-1", "heads-1e20", "seqlen-bool", "ms-bool", "ms-str", "ms-denormal"])
def test_import_refuses_rows_no_kernel_could_have_measured(tmp_path, path, value):
    """Impossible values were imported as valid rows (audit): sizes below 1 or past int32, a bool size,
    a time of true, "0.001" or 1e-320 ms (shown as 0.0µs and "infx", and never beaten by a re-tune)."""
    rec = json.loads(make_rec(key=make_key(sq=64)).model_dump_json())
    node = rec
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"format": "attntune-cache", "version": 1, "records": [rec]}))
    res = runner.invoke(app, ["import", str(f), "--cache", str(tmp_path / "c.db")])
    assert res.exit_code == 2 and "malformed" in res.stdout and path[-1] in res.stdout, res.output


def test_a_cache_path_that_is_a_device_or_pipe_is_named_as_such(tmp_path):
    """A cache linked to /dev/null made SQLite create /dev/null-journal (as root) and the error blamed the
    -wal/-shm files; a FIFO stands in for the device here (SQLite blocked opening it: the real process, with
    a timeout, so that a regression fails instead of hanging the suite)."""
    import subprocess
    import sys

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "c.db"
    link.symlink_to(fifo)
    env = dict(os.environ, ATTNTUNE_SYSTEM_CACHE="", COLUMNS="200")
    for argv in (["show", "--cache", str(link)], ["tune", "--shape", "hq=2,sq=16,d=8", "--cache", str(link)]):
        p = subprocess.run([sys.executable, "-m", "attntune", *argv], capture_output=True, text=True, env=env,
                           timeout=60)
        assert p.returncode == 2 and "is not a regular file" in p.stderr, p.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and sorted(q.name for q in tmp_path.iterdir()) == ["c.db", "pipe"]
