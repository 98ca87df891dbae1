"""A shipped cache that outlives an upgrade (issue #13): rows tuned on this device under other torch /
triton / CUDA versions but with today's variant sources serve as hints — below an exact valid row, above
nearest buckets and heuristics — and ``attntune tune --revalidate`` re-times them into valid rows."""

from __future__ import annotations

import json
import pytest
import torch
from typer.testing import CliRunner

import attntune
from attntune.cache import CacheStore, LayeredCache, WinnerRecord, utcnow
from attntune.cli import app
from attntune.device import device_fingerprint, software_fingerprint
from attntune.kernels import registry
from attntune.key import TuneKey
from attntune.problem import AttentionProblem


def problem(sq: int) -> AttentionProblem:
    return AttentionProblem(batch=1, heads_q=2, heads_kv=2, seqlen_q=sq, seqlen_kv=sq, head_dim=16, head_dim_v=16,
                            dtype="float32", device_type="cpu")


def old_record(p: AttentionProblem, variant: str = "sdpa_math", same_source: bool = True) -> WinnerRecord:
    fp = software_fingerprint(registry.get(variant).source_hash(), "cpu")
    old = fp.model_copy(update={"torch": "1.0.0", "variant_hash": fp.variant_hash if same_source else "0" * 16})
    return WinnerRecord(key=TuneKey.from_problem(p, device_fingerprint("cpu")), variant=variant, config={},
                        median_ms=0.5, runner_up="eager", runner_up_config={}, runner_up_ms=0.9, fingerprint=old,
                        created_at=utcnow())


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A 'shipped' cache written under torch 1.0: one hint (same source), one truly stale row."""
    path = tmp_path / "shipped.db"
    st = CacheStore(path)
    st.upsert_winner(old_record(problem(64)))
    st.upsert_winner(old_record(problem(200), same_source=False))
    st.prepare_for_shipping()
    st.dispose()
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", str(path))
    attntune.reset()
    yield path
    attntune.reset()


def _explain(sq: int):
    q = torch.randn(1, 2, sq, 16)
    return attntune.explain(q, q, q)


def test_rows_stale_by_versions_only_are_hints(shipped):
    by_id = {r.key_id: r for r in LayeredCache([("system", CacheStore(shipped, readonly=True))]).all_rows()}
    rows = {sq: by_id[TuneKey.from_problem(problem(sq), device_fingerprint("cpu")).key_id] for sq in (64, 200)}
    assert rows[64].status == "stale" and rows[64].hint and any("torch 1.0.0" in x for x in rows[64].reasons)
    assert rows[200].status == "stale" and not rows[200].hint  # the variant source changed: no hint


def test_dispatch_uses_a_hint_and_says_so(shipped):
    plan = _explain(64)
    assert plan.source == "hint" and plan.variant == "sdpa_math", plan
    assert any("--revalidate" in r for r in plan.reasons)
    assert _explain(200).source != "hint"  # a changed source never serves


def test_show_and_doctor_name_hints(shipped, tmp_path):
    runner = CliRunner()
    show = runner.invoke(app, ["show", "--status", "all"])
    assert show.exit_code == 0 and "used as a hint" in show.output, show.output
    doctor = runner.invoke(app, ["doctor"])
    assert "1 stale rows were tuned under other" in doctor.output, doctor.output


def test_doctor_counts_rows_of_other_devices_apart(tmp_path, monkeypatch):
    """The shipped cache as a CPU machine sees it: GPU rows (stale here by versions, same sources) are neither
    listed one by one nor counted as hints — dispatch on this device never reads them — but counted per
    device in one line; this device's own hint still is."""
    path = tmp_path / "shipped.db"
    st = CacheStore(path)
    st.upsert_winner(old_record(problem(64)))
    here = old_record(problem(128))
    for i, name in enumerate(("NVIDIA H200", "NVIDIA H200", "NVIDIA H100")):
        gpu = here.key.device.model_copy(update={"backend": "cuda", "arch": "sm_90", "name": name, "units": 132})
        key = here.key.model_copy(update={"device": gpu, "seqlen_q": 128 + i})
        assert st.upsert_winner(here.model_copy(update={"key": key}))
    st.prepare_for_shipping()
    st.dispose()
    monkeypatch.setenv("ATTNTUNE_SYSTEM_CACHE", str(path))
    monkeypatch.setenv("ATTNTUNE_CACHE", str(tmp_path / "user.db"))
    res = CliRunner().invoke(app, ["doctor", "--json"])
    [system] = [c for c in json.loads(res.stdout)["caches"] if c["layer"] == "system"]
    assert (system["rows"], system["stale"], system["hints"]) == (4, 4, 1), system
    assert system["other_devices"] == {"sm_90 NVIDIA H100 (132 units)": 1, "sm_90 NVIDIA H200 (132 units)": 2}
    assert len(system["problems"]) == 1
    text = " ".join(CliRunner().invoke(app, ["doctor"]).stdout.split())
    assert "1 stale rows were tuned under other" in text, text
    show = " ".join(CliRunner().invoke(app, ["show", "--status", "all"]).stdout.split())
    assert show.count("used as a hint") == 1 and show.count("another device: not used here") == 3, show
    assert ("3 rows of other devices (sm_90 NVIDIA H100 (132 units): 1, sm_90 NVIDIA H200 (132 units): 2): "
            "not used on this device") in text, text
    attntune.reset()


def test_revalidate_promotes_hints_into_the_user_cache(shipped, tmp_path, monkeypatch):
    user = tmp_path / "user.db"
    monkeypatch.setenv("ATTNTUNE_CACHE", str(user))
    res = CliRunner().invoke(app, ["tune", "--revalidate", "--cache", str(user), "--device", "cpu", "--quick"])
    assert res.exit_code == 0, res.output
    assert "1 of 1 hints revalidated" in res.output
    [row] = LayeredCache([("user", CacheStore(user, readonly=True))]).all_rows()
    assert row.status == "valid" and row.record.sdpa_default_ms is not None
    assert row.record.median_ms <= row.record.sdpa_default_ms  # confirmed beside the baseline
    attntune.reset()
    assert _explain(64).source == "tuned"
    again = CliRunner().invoke(app, ["tune", "--revalidate", "--cache", str(user), "--device", "cpu", "--quick"])
    assert again.exit_code == 0 and "No hints" in again.output
