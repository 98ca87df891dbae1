"""CLI inspection commands through typer's test runner."""

import json

import pytest

from typer.testing import CliRunner

from attntune.cache import CacheStore
from attntune.cli import app

from test_cache import make_key, make_rec

runner = CliRunner()


def _seed(path, n=3):
    st = CacheStore(path)
    for i in range(n):
        st.upsert_winner(make_rec(key=make_key(sq=64 * (i + 1)), ms=1.0 + i, sdpa_default_ms=2.0 + i))
    return st


def test_show_table_and_json(tmp_path, monkeypatch):
    db = tmp_path / "u.db"
    monkeypatch.setenv("ATTNTUNE_CACHE", str(db))
    _seed(db)
    r = runner.invoke(app, ["show"])
    assert r.exit_code == 0, r.output
    assert "sdpa_math" in r.output and "3 rows" in r.output
    r = runner.invoke(app, ["show", "--json"])
    rows = json.loads(r.output)
    assert len(rows) == 3 and all(row["status"] == "valid" for row in rows)
    r = runner.invoke(app, ["show", "--json", "--dtype", "float16"])
    assert json.loads(r.output) == []
    r = runner.invoke(app, ["show", "--status", "bogus"])
    assert r.exit_code != 0 and "--status" in r.output


def test_show_says_how_many_left_out_rows_belong_to_other_devices(tmp_path, monkeypatch):
    """On a CPU machine the shipped cache's GPU rows are stale (other torch): the line under the table says
    they are another device's, not a broken cache."""
    db = tmp_path / "u.db"
    monkeypatch.setenv("ATTNTUNE_CACHE", str(db))
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", "")
    st = _seed(db, n=1)
    rec = make_rec(key=make_key(sq=512))
    gpu = rec.key.device.model_copy(update={"backend": "cuda", "arch": "sm_90", "name": "NVIDIA H200", "units": 132})
    st.upsert_winner(rec.model_copy(update={"key": rec.key.model_copy(update={"device": gpu}),
                                            "fingerprint": rec.fingerprint.model_copy(update={"torch": "1.0"})}))
    st.dispose()
    r = runner.invoke(app, ["show"])
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "1 more row not shown (1 stale)" in text, r.output
    assert "1 of them was tuned on other devices (NVIDIA H200: 1)." in text, r.output
    r = runner.invoke(app, ["show", "--status", "stale"])
    assert "tuned on other devices" not in " ".join(r.output.split())  # the valid CPU row left out is this device's


def test_export_import_round_trip(tmp_path, monkeypatch):
    src = tmp_path / "src.db"
    monkeypatch.setenv("ATTNTUNE_CACHE", str(src))
    _seed(src)
    out = tmp_path / "export.json"
    r = runner.invoke(app, ["export", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "attntune-cache" and len(doc["records"]) == 3
    dst = tmp_path / "dst.db"
    r = runner.invoke(app, ["import", str(out), "--cache", str(dst)])
    assert r.exit_code == 0, r.output
    assert "imported 3 rows" in r.output
    a = sorted(CacheStore(src).raw_winners(), key=lambda x: x["key_id"])
    b = sorted(CacheStore(dst).raw_winners(), key=lambda x: x["key_id"])
    assert a == b
    r = runner.invoke(app, ["import", str(out), "--cache", str(dst)])  # again: nothing changes, and it says so
    assert r.exit_code == 0 and "imported 0 rows" in r.output and "3 already there" in r.output, r.output


def test_import_rejects_bad_records(tmp_path, monkeypatch):
    src = tmp_path / "src.db"
    monkeypatch.setenv("ATTNTUNE_CACHE", str(src))
    _seed(src, n=2)
    out = tmp_path / "export.json"
    runner.invoke(app, ["export", str(out)])
    doc = json.loads(out.read_text())
    doc["records"][0]["variant"] = "rm_rf_variant"
    doc["records"][1]["config"] = {"BLOCK_M": 7}
    doc["records"].append({"garbage": True})
    doc["records"].append(dict(doc["records"][0], variant="sdpa_math", tflops=float("inf")))  # "Infinity"
    out.write_text(json.dumps(doc))
    dst = tmp_path / "dst.db"
    r = runner.invoke(app, ["import", str(out), "--cache", str(dst)])
    assert r.exit_code == 2  # a problem with the file (the user's to fix), not a bug
    assert "4 rejected" in r.output and "unknown variant" in r.output and "malformed" in r.output
    assert "tflops: Value error, must be a finite number >= 0" in " ".join(r.output.split())
    assert "every record was rejected" in r.output
    assert CacheStore(dst).count() == 0
    (tmp_path / "notjson.json").write_text("{")
    r = runner.invoke(app, ["import", str(tmp_path / "notjson.json"), "--cache", str(dst)])
    assert r.exit_code == 2 and "not valid JSON" in r.output


def test_doctor(tmp_path, monkeypatch):
    db = tmp_path / "u.db"
    monkeypatch.setenv("ATTNTUNE_CACHE", str(db))
    st = _seed(db, n=2)
    import sqlite3

    with sqlite3.connect(st.engine.url.database) as c:
        c.execute("UPDATE winners SET variant = 'ghost' WHERE rowid = 1")
    r = runner.invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["device"]["backend"] == "cpu"
    [user] = [c for c in rep["caches"] if c["layer"] == "user"]
    assert (user["rows"], user["valid"], user["rejected"]) == (2, 1, 1)
    by_name = {v["variant"]: v for v in rep["variants"]}
    assert by_name["sdpa_math"]["prefill"] == []
    assert by_name["sdpa_cudnn"]["prefill"] == ["needs a CUDA/ROCm device"]
    assert rep["float32_tf32"]["active"] is False and rep["float32_tf32"]["supported"] is False
    r = runner.invoke(app, ["doctor"])
    assert r.exit_code == 0 and "ghost" in r.output and "no TF32 on this device" in r.output


@pytest.mark.parametrize("hip, precision, active, says", [
    (None, "highest", False, "set_float32_matmul_precision('high')"),
    (None, "high", True, "use TF32 dots"),
    ("6.2", "high", False, "ROCm kernels keep IEEE float32"),
])
def test_doctor_says_how_float32_calls_run_on_a_gpu(monkeypatch, hip, precision, active, says):
    """The fp32 line of ``doctor`` on a GPU: TF32 in use or not, and how to turn it on (CUDA only)."""
    import torch

    from attntune.cli.inspect_cmds import _tf32_line

    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: precision)
    line = _tf32_line("cuda")
    assert line["active"] is active and line["supported"] is (hip is None) and says in line["why"]


def test_export_and_report_never_overwrite_a_cache(tmp_path, monkeypatch):
    """`export cache.db --cache cache.db` replaced the cache with JSON (every row lost); an output file
    that is any SQLite database is refused too, and a refused write leaves the file as it was."""
    db = tmp_path / "u.db"
    monkeypatch.setenv("ATTNTUNE_CACHE", str(db))
    _seed(db)
    other = tmp_path / "other.db"
    _seed(other, n=1)
    for cmd in (["export"], ["report", "--out"]):
        for target, why in ((db, "is the user cache itself"), (other, "is an SQLite database")):
            r = runner.invoke(app, [*cmd, str(target)])
            assert r.exit_code == 2 and why in r.output, r.output
        assert CacheStore(db).count() == 3 and CacheStore(other).count() == 1
    out = tmp_path / "out.json"
    out.write_text("old")
    assert runner.invoke(app, ["export", str(out)]).exit_code == 0
    assert len(json.loads(out.read_text())["records"]) == 3
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_import_replaces_a_stored_row_that_is_not_valid(tmp_path, monkeypatch):
    """A stale stored row (tuned under other software) timed faster kept its place ("existing row
    faster") and the key was never served from a valid row; the tuner replaces such rows, import too."""
    import sqlite3

    src = tmp_path / "src.db"
    monkeypatch.setenv("ATTNTUNE_CACHE", str(src))
    _seed(src, n=1)
    out = tmp_path / "export.json"
    assert runner.invoke(app, ["export", str(out)]).exit_code == 0
    con = sqlite3.connect(src)
    fp = json.loads(con.execute("select fingerprint_json from winners").fetchone()[0])
    fp["torch"] = "1.0.0"
    con.execute("update winners set fingerprint_json=?, median_ms=median_ms/10", (json.dumps(fp),))
    con.commit()
    con.close()
    r = runner.invoke(app, ["show", "--json", "--status", "all"])
    assert [row["status"] for row in json.loads(r.output)] == ["stale"]
    r = runner.invoke(app, ["import", str(out)])
    assert r.exit_code == 0 and "imported 1 rows" in r.output, r.output
    r = runner.invoke(app, ["show", "--json", "--status", "all"])
    assert [row["status"] for row in json.loads(r.output)] == ["valid"]


@pytest.mark.parametrize("content,match", [(b"\xff\xfe\x00garbage", "not valid JSON"),
                                           (b'{"format": "attntune-cache", "version": "1", "records": []}',
                                            "export version must be a non-negative integer"),
                                           (b'{"format": "attntune-cache", "version": null, "records": []}',
                                            "export version must be a non-negative integer")])
def test_import_names_a_malformed_file(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_bytes(content)
    r = runner.invoke(app, ["import", str(f), "--cache", str(tmp_path / "c.db")])
    assert r.exit_code == 2 and match in r.output and "internal error" not in r.output, r.output


def test_runtime_warnings_are_one_cli_line(tmp_path):
    """explain reaches an unusable cache through the runtime, whose warning Python printed as two lines
    ending in attntune's own source line; the CLI prints it as its one ``attntune: warning:`` line."""
    import os
    import subprocess
    import sys

    bad = tmp_path / "cache.db"
    bad.write_bytes(os.urandom(4096))
    env = dict(os.environ, ATTNTUNE_CACHE=str(bad), ATTNTUNE_SYSTEM_CACHE="")
    p = subprocess.run([sys.executable, "-m", "attntune", "explain", "--shape", "b=1,hq=2,sq=64,d=32"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("attntune: warning: ") for ln in lines), p.stderr
    assert any("is unusable" in ln for ln in lines) and "RuntimeWarning" not in p.stderr


@pytest.mark.parametrize("args,option", [
    (["show", "--cache", ""], "--cache"), (["show", "--mode", "bogus"], "--mode"),
    (["show", "--dtype", "int8"], "--dtype"), (["export", "x.json", "--cache", " "], "--cache"),
    (["tune", "--suite", "", "--device", "cpu"], "--suite"),
    (["tune", "--suite", "demo", "--device", "cpu", "--cache", ""], "--cache")])
def test_empty_or_impossible_options_are_refused(args, option):
    """An empty --cache/--suite (a script's unset variable) meant the default (tuning into ~/.cache); a
    --mode/--dtype no row can have printed "No rows"."""
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and option in r.output, r.output


def test_a_cache_with_a_malformed_schema_version_is_named(tmp_path):
    import sqlite3

    from attntune.cache.store import CacheError

    db = tmp_path / "c.db"
    _seed(db, n=1).dispose()
    con = sqlite3.connect(db)
    con.execute("update attntune_meta set value='x1' where name='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(CacheError, match="schema version 'x1' is not a number"):
        CacheStore(db)


def test_import_into_a_locked_cache_names_it_and_says_what_to_do(tmp_path, monkeypatch):
    import sqlite3

    from attntune.cache import retry

    src = tmp_path / "src.db"
    monkeypatch.setenv("ATTNTUNE_CACHE", str(src))
    _seed(src, n=2)
    out = tmp_path / "export.json"
    assert runner.invoke(app, ["export", str(out)]).exit_code == 0
    dst = tmp_path / "dst.db"
    CacheStore(dst).dispose()
    tries = []

    def locked(self, rec, force=False):
        tries.append(rec.key_id)
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(CacheStore, "upsert_winner", locked)
    monkeypatch.setattr(retry.time, "sleep", lambda s: None)  # the retries' back-off, not their count
    r = runner.invoke(app, ["import", str(out), "--cache", str(dst)])
    assert r.exit_code == 2, r.output
    assert f"cache {dst}" in " ".join(r.output.split()) or f"cache sqlite:///{dst}" in " ".join(r.output.split())
    assert "locked by another process" in r.output and "run the same import again" in " ".join(r.output.split())
    assert len(tries) == 8  # retried (busy timeout aside) before giving up
