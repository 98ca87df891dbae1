"""``doctor`` and ``show`` tell the whole truth: every configured cache layer (unusable ones with the
reason), counts per layer, and never a list cut short or a status filtered away without saying so."""

import json
import os
import sqlite3

from typer.testing import CliRunner

from attntune.cache import CacheStore
from attntune.cli import app
from attntune.device import SoftwareFingerprint

from test_cache import make_key, make_rec

runner = CliRunner()


def _seed(path, n):
    """``n`` (at most 25) valid rows of distinct keys (powers of two: one bucket each)."""
    st = CacheStore(path)
    for i in range(n):
        st.upsert_winner(make_rec(key=make_key(sq=64 * 2 ** (i % 5), d=16 * 2 ** (i // 5)), ms=1.0 + i))
    st.dispose()
    return str(path)


def _make_stale(path, where="1=1"):
    """As if tuned under another torch (the shipped cache seen on another machine)."""
    with sqlite3.connect(path) as c:
        c.execute(f"UPDATE winners SET fingerprint_json = ? WHERE {where}",
                  (SoftwareFingerprint(torch="1.0.0", variant_hash="x").model_dump_json(),))


def _doctor_json(args):
    res = runner.invoke(app, ["doctor", "--json", *args])
    return res, json.loads(res.stdout)


def test_doctor_lists_an_unusable_system_layer_with_its_reason(tmp_path, monkeypatch):
    user = _seed(tmp_path / "user.db", 2)
    broken = tmp_path / "shipped.db"
    broken.write_bytes(os.urandom(8192))
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", str(broken))
    res, rep = _doctor_json(["--cache", user])
    assert res.exit_code == 2  # a configured layer is unusable: doctor says so in its exit status too
    by_layer = {c["layer"]: c for c in rep["caches"]}
    assert [c["layer"] for c in rep["caches"]] == ["user", "system"]
    assert by_layer["user"]["state"] == "ok" and (by_layer["user"]["rows"], by_layer["user"]["valid"]) == (2, 2)
    sys_layer = by_layer["system"]
    assert sys_layer["state"] == "unusable" and "not a database" in sys_layer["reason"]
    assert sys_layer["rows"] is None and str(broken) in sys_layer["url"]
    [err] = res.stderr.strip().splitlines()
    assert "system" in err and "not a database" in err
    res = runner.invoke(app, ["doctor", "--cache", user])
    table = res.stdout.split("variants on this device")[0]
    assert "system" in table and "unusable" in table and "not a database" in table


def test_doctor_counts_per_layer_and_says_why_a_layer_is_absent(tmp_path, monkeypatch):
    user = _seed(tmp_path / "user.db", 3)
    _make_stale(user, "rowid = 1")
    shipped = _seed(tmp_path / "shipped.db", 2)
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", shipped)
    res, rep = _doctor_json(["--cache", user])
    assert res.exit_code == 0, res.output
    counts = {c["layer"]: (c["state"], c["rows"], c["valid"], c["stale"], c["rejected"]) for c in rep["caches"]}
    assert counts == {"user": ("ok", 3, 2, 1, 0), "system": ("ok", 2, 2, 0, 0)}
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", "")
    res, rep = _doctor_json(["--cache", user])
    [system] = [c for c in rep["caches"] if c["layer"] == "system"]
    assert system["state"] == "absent" and "ATTNTUNE_SYSTEM_CACHE" in system["reason"]
    res, rep = _doctor_json([])  # the default user cache, not created yet: absent, not an error
    assert res.exit_code == 0, res.output
    [user_layer] = [c for c in rep["caches"] if c["layer"] == "user"]
    assert user_layer["state"] == "absent" and not os.path.exists(os.environ["ATTNTUNE_CACHE"])


def test_doctor_never_cuts_its_problem_list_silently(tmp_path):
    user = _seed(tmp_path / "user.db", 25)
    with sqlite3.connect(user) as c:
        c.execute("UPDATE winners SET variant = 'ghost'")  # 25 rejected rows
    res = runner.invoke(app, ["doctor", "--cache", user])
    assert res.exit_code == 0, res.output
    assert res.stdout.count("unknown variant 'ghost'") == 20
    assert "… and 5 more (use --all / --json to see them)" in res.stdout
    res = runner.invoke(app, ["doctor", "--cache", user, "--all"])
    assert res.stdout.count("unknown variant 'ghost'") == 25 and "more (use" not in res.stdout
    _, rep = _doctor_json(["--cache", user])
    assert len(rep["caches"][0]["problems"]) == 25


def test_show_says_what_its_status_filter_hides(tmp_path):
    user = _seed(tmp_path / "user.db", 4)
    _make_stale(user, "rowid <= 3")
    res = runner.invoke(app, ["show", "--cache", user])
    assert res.exit_code == 0, res.output
    assert "1 rows" in res.stdout
    assert "3 more rows not shown (3 stale): see them with --status all" in " ".join(res.stdout.split())
    res = runner.invoke(app, ["show", "--cache", user, "--status", "all"])
    assert "4 rows" in res.stdout and "not shown" not in res.stdout
    _make_stale(user)
    res = runner.invoke(app, ["show", "--cache", user])
    assert "0 rows" in res.stdout and "4 more rows not shown (4 stale)" in res.stdout
    assert "No rows. Run" not in res.stdout  # there are rows: they are stale, not missing


def test_export_says_what_it_left_out(tmp_path):
    user = _seed(tmp_path / "user.db", 3)
    _make_stale(user, "rowid = 1")
    res = runner.invoke(app, ["export", str(tmp_path / "out.json"), "--cache", user])
    assert res.exit_code == 0, res.output
    assert "exported 2 rows" in res.stdout and "left out: 1 stale" in res.stdout
    assert "--include-stale" in res.stdout


def test_show_warns_in_one_line_about_an_unusable_system_cache(tmp_path, monkeypatch):
    user = _seed(tmp_path / "user.db", 2)
    broken = tmp_path / "shipped.db"
    broken.write_bytes(os.urandom(8192))
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", str(broken))
    res = runner.invoke(app, ["show", "--cache", user])
    assert res.exit_code == 0, res.output  # the user's rows are still there to show
    assert "2 rows" in res.stdout
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("attntune: warning: system cache") and "not a database" in line, line
