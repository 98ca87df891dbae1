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
    out.write_text(json.dumps(doc))
    dst = tmp_path / "dst.db"
    r = runner.invoke(app, ["import", str(out), "--cache", str(dst)])
    assert r.exit_code == 1
    assert "3 rejected" in r.output and "unknown variant" in r.output and "malformed" in r.output
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
