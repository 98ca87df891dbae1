"""The command line against unusable caches: one clear line on stderr and exit code 2, never a traceback
(unless --debug / ATTNTUNE_DEBUG=1 asks for it).

Every command runs in-process through typer's test runner; one subprocess checks the real stderr and exit
status of the installed entry point.
"""

import os
import sqlite3
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attntune.cache import CacheStore
from attntune.cli import app
from attntune.cli.errors import CliError

from test_cache import make_key, make_rec

runner = CliRunner()
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
ROOT_SKIP = "runs as root: file permissions do not stop root from writing, so there is nothing to refuse"


def _valid_cache(path, n=3):
    """A small valid cache in rollback-journal mode (one self-contained file, as shipped)."""
    st = CacheStore(path)
    for i in range(n):
        st.upsert_winner(make_rec(key=make_key(sq=64 * (i + 1)), ms=1.0 + i, sdpa_default_ms=2.0 + i))
    st.prepare_for_shipping()
    st.dispose()
    return path


def _random_bytes(tmp):
    p = tmp / "random.db"
    p.write_bytes(os.urandom(16384))
    return str(p)


def _truncated(tmp):
    data = (_valid_cache(tmp / "whole.db")).read_bytes()
    p = tmp / "truncated.db"
    p.write_bytes(data[: len(data) // 2])
    return str(p)


def _directory(tmp):
    p = tmp / "a-directory"
    p.mkdir()
    return str(p)


def _read_only_file(tmp):
    p = _valid_cache(tmp / "ro.db")
    p.chmod(0o444)
    return str(p)


def _in_read_only_dir(tmp):
    d = tmp / "ro-dir"
    d.mkdir()
    d.chmod(0o555)
    return str(d / "cache.db")


def _schema_99(tmp):
    p = _valid_cache(tmp / "v99.db")
    with sqlite3.connect(p) as c:
        c.execute("UPDATE attntune_meta SET value = '99' WHERE name = 'schema_version'")
    return str(p)


def _winners_dropped(tmp):
    p = _valid_cache(tmp / "nowinners.db")
    with sqlite3.connect(p) as c:
        c.execute("DROP TABLE winners")
    return str(p)


def _bad_url(tmp):
    return "nosuchdialect://x"


# case -> (builder, words the error line must contain (any of them: the store words its reasons))
CASES = {
    "random-bytes": (_random_bytes, ("not a database",)),
    "truncated": (_truncated, ("malformed", "not a database")),
    "directory": (_directory, ("directory",)),
    "read-only-file": (_read_only_file, ("read-only", "readonly", "permission")),
    # (the read commands see a file that does not exist; tune, a directory it cannot write)
    "read-only-dir": (_in_read_only_dir, ("no such", "not writable", "read-only", "readonly", "unable to open")),
    "schema-99": (_schema_99, ("schema version 99",)),
    "winners-dropped": (_winners_dropped, ("winners",)),
    "bad-url": (_bad_url, ("nosuchdialect",)),
}
# The read-only cases are refused by the commands that write; reading a read-only file is fine
# (test_read_commands_read_a_read_only_cache), so those pairs are not cases of this test.
WRITE_ONLY_CASES = {"read-only-file"}

COMMANDS = {
    "show": lambda tmp: ["show"],
    "export": lambda tmp: ["export", str(tmp / "out.json")],
    "doctor": lambda tmp: ["doctor"],
    "report": lambda tmp: ["report", "--out", str(tmp / "r.html")],
    # the smallest tune there is; it must fail on the cache before measuring anything
    "tune": lambda tmp: ["tune", "--suite", "demo", "--device", "cpu", "--quick", "--trials", "1"],
}


def _pairs():
    """(command, case) pairs; those that rely on file permissions are skipped as root (the read-only
    directory as root is covered by a bind mount in test_cache_faults.py)."""
    out = []
    for command in COMMANDS:
        for case in CASES:
            if command != "tune" and case in WRITE_ONLY_CASES:
                continue
            needs_permissions = case == "read-only-file" or (case == "read-only-dir" and command == "tune")
            marks = [pytest.mark.skipif(AS_ROOT, reason=ROOT_SKIP)] if needs_permissions else []
            out.append(pytest.param(command, case, marks=marks, id=f"{command}-{case}"))
    return out


def _assert_one_line_error(res, cache, words):
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit), res.exception  # no exception escaped the command
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert line.startswith("attntune: error:"), line
    assert os.path.basename(cache.rstrip("/")) in line or cache in line, line
    assert any(w in line.lower() for w in words), line
    assert "Traceback" not in res.output


@pytest.mark.parametrize("command, case", _pairs())
def test_unusable_cache_is_one_line_and_exit_2(tmp_path, command, case):
    build, words = CASES[case]
    cache = build(tmp_path)
    res = runner.invoke(app, [*COMMANDS[command](tmp_path), "--cache", cache])
    _assert_one_line_error(res, cache, words)


def test_doctor_still_reports_everything_else(tmp_path):
    cache = _random_bytes(tmp_path)
    res = runner.invoke(app, ["doctor", "--cache", cache])
    assert res.exit_code == 2
    assert "unusable" in res.stdout and "not a database" in res.stdout  # the layer's line in the table
    assert "sdpa_math" in res.stdout  # the variants table is still printed


@pytest.mark.skipif(AS_ROOT, reason=ROOT_SKIP)
def test_read_commands_read_a_read_only_cache(tmp_path):
    cache = _read_only_file(tmp_path)
    res = runner.invoke(app, ["show", "--cache", cache])
    assert res.exit_code == 0, res.output
    assert "3 rows" in res.stdout


def test_missing_cache_file_named_by_cache_is_an_error_for_reads(tmp_path):
    missing = str(tmp_path / "typo.db")
    res = runner.invoke(app, ["show", "--cache", missing])
    _assert_one_line_error(res, missing, ("no such",))
    assert not os.path.exists(missing)  # reading never creates a cache


@pytest.mark.parametrize("argv, words", [
    (["show", "--status", "bogus"], "Invalid value for --status"),
    (["tune", "--device", "cpu", "--shape", "hq=4"], "field sq: missing"),
    (["doctor", "--no-such-option"], "No such option: --no-such-option"),
])
def test_argument_problem_is_one_line_and_exit_2(argv, words):
    res = runner.invoke(app, argv)
    assert res.exit_code == 2, res.output
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("attntune: error:") and words in line, line
    assert f"see 'attntune {argv[0]} --help'" in line


def test_unwritable_export_target_is_one_line(tmp_path):
    cache = str(_valid_cache(tmp_path / "ok.db"))
    target = tmp_path / "out-dir"
    target.mkdir()
    res = runner.invoke(app, ["export", str(target), "--cache", cache])  # a directory, not a file
    _assert_one_line_error(res, str(target), ("directory",))


def test_debug_shows_the_exception(tmp_path, monkeypatch):
    cache = _random_bytes(tmp_path)
    res = runner.invoke(app, ["--debug", "tune", *COMMANDS["tune"](tmp_path)[1:], "--cache", cache])
    assert isinstance(res.exception, CliError), res.output  # not turned into a one-line exit
    assert "not a database" in str(res.exception.__cause__ or res.exception)
    monkeypatch.setenv("ATTNTUNE_DEBUG", "1")
    res = runner.invoke(app, ["show", "--cache", cache])
    assert isinstance(res.exception, CliError), res.output


def test_unexpected_error_is_one_line_exit_1(tmp_path, monkeypatch):
    import attntune.cli.inspect_cmds as cmds

    def boom(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cmds, "read_layers", boom)
    res = runner.invoke(app, ["show"])
    assert res.exit_code == 1
    [line] = res.stderr.strip().splitlines()
    assert "internal error: ZeroDivisionError: a bug" in line and "--debug" in line


def test_real_process_stderr_and_exit_status(tmp_path):
    """The installed entry point, as a user runs it: stderr is one line, exit status 2; --debug (here
    through ATTNTUNE_DEBUG) prints the traceback."""
    cache = _random_bytes(tmp_path)
    env = dict(os.environ, ATTNTUNE_SYSTEM_CACHE="", COLUMNS="120")
    cmd = [sys.executable, "-m", "attntune", "show", "--cache", cache]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "not a database" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, ATTNTUNE_DEBUG="1"), timeout=120)
    assert p.returncode == 1 and "Traceback" in p.stderr and "CliError" in p.stderr, p.stderr


@pytest.fixture(autouse=True)
def _restore_permissions(tmp_path):
    """pytest must be able to delete tmp_path afterwards, whoever runs it."""
    yield
    for root, dirs, _ in os.walk(tmp_path):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)


def test_fixture_builders_make_what_they_say(tmp_path):
    """The cases above are what they claim: a valid cache opens; each broken one does not (as the
    store itself sees it), so a passing CLI test is not a test of a healthy cache."""
    assert CacheStore(_valid_cache(tmp_path / "good.db")).count() == 3
    for name in ("random-bytes", "truncated", "directory", "schema-99", "winners-dropped", "bad-url"):
        path = CASES[name][0](tmp_path)
        with pytest.raises(Exception):
            CacheStore(path).count()
