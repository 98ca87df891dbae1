"""Runtime dispatch: every route equals torch SDPA; tuned / nearest / heuristic plans; policies and
environment switches; fallback + quarantine; broken caches; torch.compile; threads; telemetry; CLI."""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from typing import List

import pytest
import torch
import torch.nn.functional as F

import attntune
from attntune.cache import CacheStore, WinnerRecord, utcnow
from attntune.device import device_fingerprint, software_fingerprint
from attntune.kernels import registry
from attntune.kernels.base import Variant
from attntune.key import TuneKey
from attntune.policies import runtime
from attntune.policies.dispatch import original_sdpa
from attntune.policies.index import MAX_NEAREST_DISTANCE
from attntune.problem import problem_from_tensors
from helpers import bottom_right_mask, rand_qkv

TORCH_SDPA = original_sdpa()


@pytest.fixture(autouse=True)
def _fresh_runtime():
    """conftest gives every test its own ATTNTUNE_CACHE; reset() makes the runtime re-read it."""
    attntune.reset()
    yield
    while attntune.is_enabled():
        attntune.disable()
    attntune.reset()


_bottom_right_mask = bottom_right_mask


def _record(q, k, v, variant: str, ms: float = 0.05, config=None, **kw) -> WinnerRecord:
    """A cache row for the key of attention(q, k, v, **kw) choosing ``variant``."""
    p = problem_from_tensors(q, k, v, **kw)
    key = TuneKey.from_problem(p, device_fingerprint("cpu"))
    v_ = registry.get(variant)
    return WinnerRecord(key=key, variant=variant, config=config or {}, median_ms=ms, runner_up="eager",
                        runner_up_ms=ms * 3, fingerprint=software_fingerprint(v_.source_hash(), "cpu"),
                        created_at=utcnow())


def _user_store() -> CacheStore:
    import os

    return CacheStore(os.environ["ATTNTUNE_CACHE"])


def _attntune_warnings(rec) -> List[str]:
    return [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning) and "attntune" in str(w.message)]


# ---- every route equals torch SDPA -------------------------------------------------------------------
@pytest.mark.parametrize("b,hq,hkv,sq,skv,d", [(2, 4, 4, 16, 16, 32), (1, 8, 2, 7, 23, 16), (3, 4, 1, 1, 33, 64),
                                               (2, 2, 2, 15, 15, 80)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_equals_sdpa(b, hq, hkv, sq, skv, d, causal):
    q, k, v = rand_qkv(b, hq, hkv, sq, skv, d)
    out = attntune.attention(q, k, v, causal=causal)
    mask = _bottom_right_mask(sq, skv) if causal else None
    ref = TORCH_SDPA(q, k, v, attn_mask=mask, enable_gqa=hq != hkv)
    torch.testing.assert_close(out, ref, atol=3e-5, rtol=1e-5)
    assert out.shape == (b, hq, sq, d)


def test_attention_window_scale_kv_lens_equal_sdpa():
    q, k, v = rand_qkv(2, 4, 2, 9, 20, 16)
    out = attntune.attention(q, k, v, causal=True, window=(5, 0), scale=0.3)
    ref = TORCH_SDPA(q, k, v, attn_mask=_bottom_right_mask(9, 20, left=5), scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=3e-5, rtol=1e-5)
    # kv_lens with Sq = 1 (decode): keys past each sequence's length are padding.
    q1 = q[:, :, :1]
    lens = torch.tensor([7, 20])
    out = attntune.attention(q1, k, v, kv_lens=lens)
    pad = (torch.arange(20)[None, :] < lens[:, None])[:, None, None, :]
    torch.testing.assert_close(out, TORCH_SDPA(q1, k, v, attn_mask=pad, enable_gqa=True), atol=3e-5, rtol=1e-5)


@pytest.mark.parametrize("sq,skv", [(5, 12), (12, 5), (8, 8)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_dropin_is_torch_sdpa(sq, skv, is_causal):
    """Top-left is_causal (torch's) even with Sq != Skv, and GQA through enable_gqa."""
    q, k, v = rand_qkv(2, 4, 2, sq, skv, 16)
    out = attntune.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    ref = TORCH_SDPA(q, k, v, is_causal=is_causal, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=3e-5, rtol=1e-5)
    plan = attntune.stats()["plans"][0]
    assert plan["calls"] == 1 and plan["problem"].startswith("B2 H4/2")


def test_dropin_passes_uncovered_calls_to_torch():
    q, k, v = rand_qkv(2, 4, 4, 6, 6, 16)
    mask = torch.rand(6, 6) > 0.3
    torch.testing.assert_close(attntune.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               TORCH_SDPA(q, k, v, attn_mask=mask))
    torch.manual_seed(3)
    a = attntune.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    torch.testing.assert_close(a, TORCH_SDPA(q, k, v, dropout_p=0.5))
    q3, k3, v3 = q[0], k[0], v[0]  # 3-D inputs
    torch.testing.assert_close(attntune.scaled_dot_product_attention(q3, k3, v3, is_causal=True),
                               TORCH_SDPA(q3, k3, v3, is_causal=True))
    k1, v1 = k[:, :1], v[:, :1]  # heads 4 vs 1 without enable_gqa: torch broadcasts
    torch.testing.assert_close(attntune.scaled_dot_product_attention(q, k1, v1), TORCH_SDPA(q, k1, v1))
    with pytest.raises(RuntimeError):  # and torch's own errors surface unchanged
        attntune.scaled_dot_product_attention(q, k[:, :3], v[:, :3])
    s = attntune.stats()
    assert s["passthrough_calls"] == 5 and s["plans"] == [] and s["calls"] == 5


def test_patched_sdpa_inside_dispatch_and_restored():
    q, k, v = rand_qkv(1, 2, 2, 10, 14, 16)
    before = F.scaled_dot_product_attention
    with attntune.dispatch():
        assert F.scaled_dot_product_attention is not before
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=_bottom_right_mask(10, 14))
    assert F.scaled_dot_product_attention is before
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, is_causal=True), atol=3e-5, rtol=1e-5)
    torch.testing.assert_close(masked, TORCH_SDPA(q, k, v, attn_mask=_bottom_right_mask(10, 14)))
    s = attntune.stats()
    assert s["calls"] == 2 and s["passthrough_calls"] == 1


def test_enable_disable_nested_and_reentrant():
    orig = F.scaled_dot_product_attention
    attntune.enable()
    patched = F.scaled_dot_product_attention
    assert patched is not orig
    with attntune.dispatch():
        with attntune.dispatch():
            assert F.scaled_dot_product_attention is patched
        assert F.scaled_dot_product_attention is patched
    attntune.disable()
    assert F.scaled_dot_product_attention is orig and not attntune.is_enabled()
    attntune.disable()  # extra disable: a no-op
    assert F.scaled_dot_product_attention is orig
    with pytest.raises(KeyError):
        with attntune.dispatch():
            raise KeyError("boom")
    assert F.scaled_dot_product_attention is orig


def test_patch_from_many_threads_restores_once_all_exit():
    orig = F.scaled_dot_product_attention
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    ref = TORCH_SDPA(q, k, v, is_causal=True)
    barrier = threading.Barrier(6)
    errors = []

    def worker():
        try:
            for _ in range(20):
                with attntune.dispatch():
                    barrier.wait(timeout=30) if _ == 0 else None
                    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True), ref)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert F.scaled_dot_product_attention is orig


def test_concurrent_calls_from_threads():
    shapes = [(2, 4, 2, 5, 9, 16), (1, 2, 2, 16, 16, 32), (3, 8, 4, 1, 40, 16), (2, 4, 4, 12, 12, 64)]
    inputs = [rand_qkv(*s, seed=i) for i, s in enumerate(shapes)]
    refs = [TORCH_SDPA(q, k, v, attn_mask=_bottom_right_mask(q.shape[2], k.shape[2]),
                       enable_gqa=q.shape[1] != k.shape[1]) for q, k, v in inputs]
    errors = []
    n_threads, n_calls = 8, 40

    def worker(t):
        try:
            for i in range(n_calls):
                j = (i + t) % len(inputs)
                out = attntune.attention(*inputs[j], causal=True)
                torch.testing.assert_close(out, refs[j], atol=3e-5, rtol=1e-5)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = attntune.stats()
    assert len(s["plans"]) == len(shapes)  # one plan per signature, however many threads raced for it
    assert s["calls"] == n_threads * n_calls


def test_gradients_match_sdpa():
    q, k, v = rand_qkv(2, 4, 2, 7, 11, 16, requires_grad=True)
    out = attntune.attention(q, k, v, causal=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref = TORCH_SDPA(q, k, v, attn_mask=_bottom_right_mask(7, 11), enable_gqa=True)
    rgrads = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(grads, rgrads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert attntune.explain(q, k, v, causal=True).problem.mode == "fwd_bwd"
    with torch.no_grad():
        assert attntune.explain(q, k, v, causal=True).problem.mode == "fwd"


def test_bad_inputs_raise_value_error_naming_the_argument():
    q, k, v = rand_qkv(2, 4, 2, 8, 8, 16)
    attntune.attention(q, k, v)  # a valid call first: the checks must not depend on a cold cache
    with pytest.raises(ValueError, match="^q:"):
        attntune.attention(q[0], k, v)
    with pytest.raises(ValueError, match="k/v: dtype"):
        attntune.attention(q, k.double(), v)
    with pytest.raises(ValueError, match="^q: unsupported dtype torch.int32"):  # q's fault, not k's
        attntune.attention(q.int(), k.int(), v.int())
    with pytest.raises(ValueError, match="heads"):
        attntune.attention(q[:, :3], k, v)
    with pytest.raises(ValueError, match="window"):
        attntune.attention(q, k, v, window=(-5, 0))
    with pytest.raises(ValueError, match="window"):
        attntune.attention(q, k, v, window=3)
    with pytest.raises(ValueError, match="kv_lens"):
        attntune.attention(q, k, v, kv_lens=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="k:"):
        attntune.attention(q, "k", v)


# ---- tuned / nearest / heuristic -----------------------------------------------------------------------
def test_tuned_nearest_and_heuristic_plans():
    q, k, v = rand_qkv(2, 4, 4, 64, 64, 16)
    st = _user_store()
    st.upsert_winner(_record(q, k, v, "sdpa_math", causal=True))
    st.dispose()

    exact = attntune.explain(q, k, v, causal=True)
    assert (exact.source, exact.variant, exact.expected_ms, exact.runner_up) == ("tuned", "sdpa_math", 0.05, "eager")
    # 96 is the next bucket above 64 (log2 distance 0.58 per axis): the 64 row stands in for it.
    qn, kn, vn = rand_qkv(2, 4, 4, 90, 90, 16)
    near = attntune.explain(qn, kn, vn, causal=True)
    assert near.source == "nearest" and near.variant == "sdpa_math"
    assert any("nearest bucket" in r for r in near.reasons)
    # 1024 is 4 doublings away on both axes: farther than MAX_NEAREST_DISTANCE, so heuristics decide.
    qf, kf, vf = rand_qkv(1, 4, 4, 1024, 1024, 16)
    assert near.key.distance(attntune.explain(qf, kf, vf, causal=True).key) > MAX_NEAREST_DISTANCE
    far = attntune.explain(qf, kf, vf, causal=True)
    assert far.source == "heuristic" and far.variant == "sdpa_default"
    # Another family (not causal) never borrows the causal row.
    assert attntune.explain(q, k, v).source == "heuristic"

    # The calls themselves: correct results, and the plans explain() announced.
    for args in ((q, k, v), (qn, kn, vn)):
        out = attntune.attention(*args, causal=True)
        sq = args[0].shape[2]
        torch.testing.assert_close(out, TORCH_SDPA(*args, is_causal=True), atol=3e-5, rtol=1e-5)
        assert attntune.explain(*args, causal=True).variant == "sdpa_math"
    s = attntune.stats()
    by_problem = {p["problem"]: p for p in s["plans"]}
    assert by_problem["B2 H4/4 S64x64 D16 float32 causal fwd"]["source"] == "tuned"
    assert not by_problem["B2 H4/4 S64x64 D16 float32 causal fwd"]["miss"]
    assert by_problem["B2 H4/4 S90x90 D16 float32 causal fwd"]["miss"]
    assert sq == 90


def _on_device(rec: WinnerRecord, **device) -> WinnerRecord:
    """``rec`` as if tuned on another device (``device``: fields of the fingerprint that differ)."""
    key = rec.key.model_copy(update={"device": rec.key.device.model_copy(update=device)})
    return rec.model_copy(update={"key": key})


def test_rows_of_a_sibling_device_stand_in_where_this_device_has_none():
    """A row tuned on another device of this architecture (an H100's on an H200) serves a key this device
    has no usable row of its family for: source "sibling", counted as a miss; the same key's row of the
    sibling first, then its nearest bucket; another architecture never; this device's own nearest bucket
    before any sibling; of two siblings the one with this device's unit count first."""
    q, k, v = rand_qkv(2, 4, 4, 64, 64, 16)
    base = _record(q, k, v, "sdpa_math", causal=True)
    units = base.key.device.units
    st = _user_store()
    st.upsert_winner(_on_device(base, name="Sibling X", units=units * 2))  # same arch, twice the units
    st.upsert_winner(_on_device(_record(q, k, v, "eager", causal=True), name="Sibling Y"))  # same arch and units
    st.upsert_winner(_on_device(_record(q, k, v, "sdpa_default", causal=True), arch="other-arch", name="Z"))
    st.dispose()
    attntune.reset()
    plan = attntune.explain(q, k, v, causal=True)
    assert (plan.source, plan.variant) == ("sibling", "eager"), plan.describe()
    assert any("sibling device" in r and "Sibling Y" in r for r in plan.reasons)
    assert "measured on a sibling device" in plan.describe()
    out = attntune.attention(q, k, v, causal=True)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, is_causal=True), atol=3e-5, rtol=1e-5)
    assert [p["miss"] for p in attntune.stats()["plans"] if p["source"] == "sibling"] == [True]

    # a nearby bucket (96: distance 1.2 with Sibling Y's row) is still a sibling's
    qn, kn, vn = rand_qkv(2, 4, 4, 90, 90, 16)
    assert attntune.explain(qn, kn, vn, causal=True).source == "sibling"
    # another family (not causal): no row anywhere of it, heuristics decide
    assert attntune.explain(q, k, v).source == "heuristic"

    # this device's own neighbouring bucket beats the sibling's exact key
    q2, k2, v2 = rand_qkv(2, 4, 4, 90, 90, 16)
    st = _user_store()
    st.upsert_winner(_record(q2, k2, v2, "sdpa_math", causal=True))
    st.dispose()
    attntune.reset()
    plan = attntune.explain(q, k, v, causal=True)
    assert (plan.source, plan.variant) == ("nearest", "sdpa_math")


def test_doctor_counts_the_rows_of_sibling_devices():
    from typer.testing import CliRunner

    from attntune.cli import app

    q, k, v = rand_qkv(1, 2, 2, 32, 32, 16)
    st = _user_store()
    st.upsert_winner(_record(q, k, v, "eager"))
    st.upsert_winner(_on_device(_record(q, k, v, "eager", causal=True), name="Sibling Y", units=7))
    st.upsert_winner(_on_device(_record(q, k, v, "eager", causal=True), arch="other-arch", name="Z"))
    st.dispose()
    res = CliRunner().invoke(app, ["doctor", "--json"])
    rows = json.loads(res.output)["device_rows"]
    assert rows == {"this_device": 1, "siblings": {"Sibling Y (7 units)": 1}}, rows
    text = CliRunner().invoke(app, ["doctor"]).output
    assert "1 valid rows were tuned on this device; 1 on other" in " ".join(text.split()), text


def test_only_sibling_rows_of_another_architecture_leave_the_heuristic():
    q, k, v = rand_qkv(1, 2, 2, 32, 32, 16)
    st = _user_store()
    st.upsert_winner(_on_device(_record(q, k, v, "eager"), arch="other-arch", name="Z"))
    st.upsert_winner(_on_device(_record(q, k, v, "eager"), backend="rocm", name="W"))
    st.dispose()
    plan = attntune.explain(q, k, v)
    assert plan.source == "heuristic", plan.describe()


def test_cached_row_unusable_for_the_actual_problem_is_skipped():
    """A row whose variant cannot run this problem (here: excluded by ATTNTUNE_VARIANTS) is not used."""
    q, k, v = rand_qkv(2, 4, 4, 32, 32, 16)
    st = _user_store()
    st.upsert_winner(_record(q, k, v, "sdpa_math"))
    st.dispose()
    import os

    os.environ["ATTNTUNE_VARIANTS"] = "eager,sdpa_default"
    try:
        plan = attntune.explain(q, k, v)
    finally:
        del os.environ["ATTNTUNE_VARIANTS"]
    assert plan.source == "heuristic" and plan.variant == "sdpa_default"
    assert any("not in ATTNTUNE_VARIANTS" in r for r in plan.reasons)


class _Queries:
    """Counts SQL statements sent by any SQLAlchemy engine of this process while active."""

    def __init__(self):
        self.n = 0

    def _count(self, *_args, **_kw):
        self.n += 1

    def __enter__(self):
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "before_cursor_execute", self._count)
        return self

    def __exit__(self, *exc):
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.remove(Engine, "before_cursor_execute", self._count)


def test_misses_recorded_off_the_call_path(monkeypatch):
    monkeypatch.setattr(runtime, "MISS_FLUSH_SECONDS", 3600.0)  # this test flushes explicitly
    q, k, v = rand_qkv(1, 2, 2, 20, 20, 16)
    q2, k2, v2 = rand_qkv(1, 2, 2, 18, 18, 16)  # another shape of the same bucket (24)
    attntune.attention(q, k, v, causal=True)  # loads the cache index (the only database reads)
    with _Queries() as sql:
        for _ in range(4):
            attntune.attention(q, k, v, causal=True)
        for _ in range(2):
            attntune.attention(q2, k2, v2, causal=True)
        # a decode loop: a never-seen KV length every call, all in one bucket
        qd = torch.randn(1, 2, 1, 16)
        kd = torch.randn(1, 2, 3000, 16)
        for n in range(2100, 2140):
            out = attntune.attention(qd, kd[:, :, :n], kd[:, :, :n], causal=True)
            torch.testing.assert_close(out, TORCH_SDPA(qd, kd[:, :, :n], kd[:, :, :n]), atol=3e-5, rtol=1e-5)
    assert sql.n == 0, "a call touched the database"
    st = _user_store()
    assert st.misses() == []  # nothing written while calls ran
    assert attntune.explain(q2, k2, v2, causal=True).source == "heuristic"
    decode = [p for p in attntune.stats()["plans"] if p["problem"].startswith("B1 H2/2 S1x")]
    assert len(decode) == 40 and all(p["problem"].endswith("D16 float32 fwd") for p in decode)  # no causal:
    # one row bottom-right sees every key (canonical problem)
    attntune.reset()  # ... the misses are written at reset()/exit (and by the background flusher)
    misses = {json.loads(m["key_json"])["seqlen_kv"]: m for m in st.misses()}
    assert misses[24]["count"] == 7
    key = TuneKey.model_validate_json(misses[24]["key_json"])
    assert key.seqlen_q == 24 and key.causal  # 18 and 20 lie in the bucket of 24
    assert misses[3072]["count"] == 40 and not json.loads(misses[3072]["key_json"])["causal"]
    st.dispose()


def test_misses_written_by_the_background_flusher(monkeypatch):
    import time

    monkeypatch.setattr(runtime, "MISS_FLUSH_SECONDS", 0.05)
    q, k, v = rand_qkv(1, 2, 2, 20, 20, 16)
    attntune.attention(q, k, v, causal=True)
    st = _user_store()
    deadline = time.monotonic() + 30  # an event on another thread: wait for it, generously
    while not st.misses() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [m["count"] for m in st.misses()] == [1]
    st.dispose()


def test_new_shape_of_a_planned_family_reuses_its_plan():
    q, kbuf, vbuf = rand_qkv(2, 4, 2, 1, 400, 16)
    attntune.attention(q, kbuf[:, :, :300], vbuf[:, :, :300], causal=True)
    fam_plan = next(iter(runtime.FAMILIES.values())).plan
    calls = []
    orig = runtime.Runtime.resolve

    def spy(self, *a, **kw):
        calls.append(a)
        return orig(self, *a, **kw)

    runtime.Runtime.resolve = spy
    try:
        for n in (301, 333, 384):  # the bucket of 300 is 384: these reuse its plan
            out = attntune.attention(q, kbuf[:, :, :n], vbuf[:, :, :n], causal=True)
            ref = TORCH_SDPA(q, kbuf[:, :, :n].repeat_interleave(2, 1), vbuf[:, :, :n].repeat_interleave(2, 1))
            torch.testing.assert_close(out, ref, atol=3e-5, rtol=1e-5)
        attntune.attention(q, kbuf[:, :, :250], vbuf[:, :, :250], causal=True)  # bucket 256: resolved
    finally:
        runtime.Runtime.resolve = orig
    assert len(calls) == 1
    slots = [sl for sl in runtime.SLOTS.values() if sl.plan is fam_plan]
    assert sorted(sl.problem.seqlen_kv for sl in slots) == [300, 301, 333, 384]
    assert all(not sl.problem.causal for sl in slots)  # one decode row: canonically unmasked


def test_slot_overflow_keeps_working(monkeypatch):
    monkeypatch.setattr(runtime, "MAX_SLOTS", 3)
    outs = []
    for sq in range(1, 9):  # 8 distinct signatures through a 3-slot table
        q, k, v = rand_qkv(1, 2, 2, sq, 9, 16)
        outs.append((attntune.attention(q, k, v, causal=True), TORCH_SDPA(q, k, v, attn_mask=_bottom_right_mask(sq, 9))))
    assert len(runtime.SLOTS) <= 3
    for a, b in outs:
        torch.testing.assert_close(a, b, atol=3e-5, rtol=1e-5)


def test_plan_api_caches_and_runs():
    from attntune import plan as plan_fn

    q, k, v = rand_qkv(2, 4, 2, 6, 9, 16)
    problem = problem_from_tensors(q, k, v, causal=True)
    p1 = plan_fn(problem)
    assert plan_fn(problem) is p1
    torch.testing.assert_close(p1.run(q, k, v), attntune.attention(q, k, v, causal=True))
    assert "source" in str(p1) and p1.to_dict()["variant"] == p1.variant


# ---- policies and environment switches ---------------------------------------------------------------
def test_policy_heuristic_ignores_cache(monkeypatch):
    q, k, v = rand_qkv(2, 4, 4, 32, 32, 16)
    st = _user_store()
    st.upsert_winner(_record(q, k, v, "sdpa_math"))
    st.dispose()
    assert attntune.explain(q, k, v).source == "tuned"
    monkeypatch.setenv("ATTNTUNE_POLICY", "heuristic")
    attntune.reset()
    plan = attntune.explain(q, k, v)
    assert (plan.source, plan.variant) == ("heuristic", "sdpa_default")
    assert runtime.get()._index is None  # the heuristic policy never opens the cache


def test_policy_fixed(monkeypatch):
    q, k, v = rand_qkv(2, 4, 2, 9, 13, 16)
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:eager")
    attntune.reset()
    plan = attntune.explain(q, k, v, causal=True)
    assert (plan.source, plan.variant) == ("fixed", "eager")
    out = attntune.attention(q, k, v, causal=True)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, attn_mask=_bottom_right_mask(9, 13), enable_gqa=True),
                               atol=1e-5, rtol=1e-5)
    # A fixed variant that cannot run the problem: the safe fallback, with the reason, and one warning
    # for the process (not one per problem).
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:nystrom")
    attntune.reset()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        attntune.attention(q, k, v, causal=True)
        attntune.attention(q[:, :, :5], k, v, causal=True)
    assert _attntune_warnings(rec) == [
        f"attntune: ATTNTUNE_POLICY=fixed:nystrom cannot run {problem_from_tensors(q, k, v, causal=True).short()} "
        f"({'; '.join(registry.reasons(registry.get('nystrom'), problem_from_tensors(q, k, v, causal=True)))}); "
        "calls it cannot run use the safe fallback (shown once; attntune.explain() gives each call's reason)"]
    plan = attntune.explain(q, k, v, causal=True)
    assert plan.source == "fallback" and plan.variant == "sdpa_default"
    assert any("nystrom cannot run" in r for r in plan.reasons)
    # An unknown name: one warning, heuristic plans.
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:no_such_variant")
    attntune.reset()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        attntune.attention(q, k, v)
        attntune.attention(q, k, v, causal=True)
    assert len(_attntune_warnings(rec)) == 1
    assert attntune.explain(q, k, v).source == "heuristic"


def test_policy_bad_name_warns_and_uses_tuned(monkeypatch):
    monkeypatch.setenv("ATTNTUNE_POLICY", "fastest")
    attntune.reset()
    with pytest.warns(RuntimeWarning, match="ATTNTUNE_POLICY"):
        attntune.stats()
    assert attntune.stats()["policy"] == "tuned"


def test_policy_online_tunes_a_miss(monkeypatch):
    import attntune.autotune.runner as runner

    q, k, v = rand_qkv(2, 4, 4, 24, 24, 16)
    calls = []

    def fake_tune_one(problem, store, trials, time_limit):
        calls.append((problem, trials, time_limit))
        rec = _record(q, k, v, "sdpa_math", causal=True)
        store.upsert_winner(rec)
        return rec

    monkeypatch.setattr(runner, "tune_one", fake_tune_one)
    monkeypatch.setenv("ATTNTUNE_POLICY", "online")
    monkeypatch.setenv("ATTNTUNE_ONLINE_TRIALS", "3")
    attntune.reset()
    assert attntune.explain(q, k, v, causal=True).source == "heuristic"  # explain never tunes
    out = attntune.attention(q, k, v, causal=True)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, is_causal=True), atol=3e-5, rtol=1e-5)
    plan = attntune.explain(q, k, v, causal=True)
    assert (plan.source, plan.variant) == ("online", "sdpa_math")
    assert len(calls) == 1 and calls[0][1] == 3
    attntune.attention(q, k, v, causal=True)
    assert len(calls) == 1  # tuned once per key
    # The winner is in the user cache: the next process gets it as a tuned row.
    attntune.reset()
    monkeypatch.setenv("ATTNTUNE_POLICY", "tuned")
    assert attntune.explain(q, k, v, causal=True).source == "tuned"


def test_policy_online_tuner_failure_falls_back(monkeypatch):
    import attntune.autotune.runner as runner

    def broken(problem, store, trials, time_limit):
        raise RuntimeError("no device time left")

    monkeypatch.setattr(runner, "tune_one", broken)
    monkeypatch.setenv("ATTNTUNE_POLICY", "online")
    attntune.reset()
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = attntune.attention(q, k, v)
        attntune.attention(q[:, :, :5], k, v)  # another key: no second attempt, no second warning
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v), atol=3e-5, rtol=1e-5)
    assert len(_attntune_warnings(rec)) == 1 and "it is off for this process" in _attntune_warnings(rec)[0]
    assert attntune.explain(q, k, v).source == "heuristic"
    assert any("online tuning off for this process" in r
               for r in _online_notes(q[:, :, :3], k, v))


def _online_notes(q, k, v):
    """The reasons of a fresh (non-dry) resolution: explain() never tunes, so it never says why not."""
    from attntune.policies import runtime as rt_mod

    plan, _ = rt_mod.get().resolve(problem_from_tensors(q, k, v), q.device)
    return list(plan.reasons)


def test_policy_online_skips_a_locked_user_cache_without_stalling(monkeypatch, tmp_path):
    """Another process writing the user cache: each new key's first call stalled ~8 s in the tuner's
    lock retries (20 calls over 3 keys: 25 s); now the key is skipped (it stays a miss) at once."""
    import sqlite3

    import attntune.autotune.runner as runner

    calls = []
    monkeypatch.setattr(runner, "tune_one", lambda *a, **kw: calls.append(a))
    monkeypatch.setenv("ATTNTUNE_POLICY", "online")
    st = _user_store()
    st.dispose()
    attntune.reset()
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    attntune.attention(q, k, v)  # the runtime has opened its caches
    calls.clear()
    locker = sqlite3.connect(str(tmp_path / "user-cache.db"), timeout=0.1, isolation_level=None)
    try:
        locker.execute("BEGIN EXCLUSIVE")
        t0 = time.monotonic()
        for sq in (3, 5, 7):
            attntune.attention(q[:, :, :sq], k, v, causal=True)
        took = time.monotonic() - t0
        notes = _online_notes(q[:, :, :2], k, v)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert calls == [] and took < 3, (calls, took)
    assert any("the user cache is locked now" in r for r in notes), notes


def test_disable_switch(monkeypatch):
    monkeypatch.setenv("ATTNTUNE_DISABLE", "1")
    attntune.reset()
    q, k, v = rand_qkv(2, 4, 2, 6, 10, 16)
    st = _user_store()
    st.upsert_winner(_record(q, k, v, "sdpa_math", causal=True))
    st.dispose()
    plan = attntune.explain(q, k, v, causal=True)
    assert (plan.source, plan.variant) == ("fallback", "sdpa_default")
    out = attntune.attention(q, k, v, causal=True)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, attn_mask=_bottom_right_mask(6, 10), enable_gqa=True))
    with attntune.dispatch():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, is_causal=True, enable_gqa=True))
    assert attntune.stats()["passthrough_calls"] == 1
    assert runtime.get()._index is None  # no cache touched, no misses recorded


def test_max_seqlen_switch(monkeypatch):
    monkeypatch.setenv("ATTNTUNE_MAX_SEQLEN", "32")
    attntune.reset()
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    ql, kl, vl = rand_qkv(1, 2, 2, 8, 40, 16)
    assert attntune.explain(q, k, v).source == "heuristic"
    plan = attntune.explain(ql, kl, vl)
    assert plan.source == "fallback" and "ATTNTUNE_MAX_SEQLEN=32" in plan.reasons[0]
    torch.testing.assert_close(attntune.attention(ql, kl, vl), TORCH_SDPA(ql, kl, vl))


def test_allow_approx_switch(monkeypatch):
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:nystrom")
    q, k, v = rand_qkv(1, 2, 2, 32, 32, 16)
    attntune.reset()
    assert attntune.explain(q, k, v).source == "fallback"  # approximation not allowed
    assert attntune.explain(q, k, v, approx=True).variant == "nystrom"  # ... unless the call allows it
    monkeypatch.setenv("ATTNTUNE_ALLOW_APPROX", "1")
    attntune.reset()
    assert attntune.explain(q, k, v).variant == "nystrom"
    assert attntune.explain(q, k, v, approx=False).source == "fallback"  # the call's word wins
    # The SDPA drop-in is never approximate.
    out = attntune.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v), atol=3e-5, rtol=1e-5)


def test_triton_and_variants_switches(monkeypatch):
    q, k, v = rand_qkv(1, 4, 2, 1, 64, 16)
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:triton_decode")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton_decode supports the CPU only interpreted
    monkeypatch.setenv("ATTNTUNE_TRITON", "0")
    attntune.reset()
    plan = attntune.explain(q, k, v)
    assert plan.source == "fallback" and any("ATTNTUNE_TRITON=0" in r for r in plan.reasons)
    monkeypatch.setenv("ATTNTUNE_POLICY", "heuristic")
    monkeypatch.delenv("ATTNTUNE_TRITON")
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "eager")
    attntune.reset()
    plan = attntune.explain(q, k, v)
    assert plan.variant == "eager" and plan.source == "heuristic"


def test_log_switch_logs_plans_not_calls(monkeypatch, caplog):
    monkeypatch.setenv("ATTNTUNE_LOG", "info")
    attntune.reset()
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    with caplog.at_level(logging.INFO, logger="attntune"):
        for _ in range(3):
            attntune.attention(q, k, v, causal=True)
    plans = [r for r in caplog.records if r.name == "attntune" and r.getMessage().startswith("plan ")]
    assert len(plans) == 1 and "sdpa_default" in plans[0].getMessage()
    logging.getLogger("attntune").setLevel(logging.NOTSET)


def test_latency_sampling_and_metrics(monkeypatch):
    pytest.importorskip("prometheus_client")
    monkeypatch.setenv("ATTNTUNE_LATENCY_SAMPLE", "2")
    attntune.reset()
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    for _ in range(10):
        attntune.attention(q, k, v)
    s = attntune.stats()
    lat = s["plans"][0]["latency"]
    assert lat["samples"] == 5 and 0 < lat["p50_ms"] <= lat["p95_ms"] <= lat["p99_ms"]
    key = s["plans"][0]["key_id"]
    assert s["keys"][key]["calls"] == 10 and s["misses"] == 10
    text = attntune.metrics_text()
    assert f'attntune_calls_total{{key="{key}"' in text
    assert 'attntune_latency_seconds{key="' in text and 'quantile="0.99"' in text
    assert "attntune_misses_total 10.0" in text


def test_no_latency_samples_by_default():
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    for _ in range(4):
        attntune.attention(q, k, v)
    assert attntune.stats()["plans"][0]["latency"] is None


# ---- failures -----------------------------------------------------------------------------------------
class _Boom(Variant):
    name = "test_boom"
    family = "test"
    description = "raises on every call (tests the runtime's fallback)"
    runs = 0

    def supports(self, problem):
        return []

    def run(self, q, k, v, problem, config, kv_lens=None):
        type(self).runs += 1
        raise RuntimeError("kernel exploded")


@pytest.fixture
def boom():
    _Boom.runs = 0
    registry.register(_Boom())
    yield _Boom
    registry.unregister(_Boom.name)


def test_failing_plan_falls_back_and_is_quarantined(boom):
    q, k, v = rand_qkv(2, 4, 4, 32, 32, 16)
    qn, kn, vn = rand_qkv(2, 4, 4, 40, 40, 16)  # a neighbouring bucket: nearest would pick boom too
    st = _user_store()
    st.upsert_winner(_record(q, k, v, boom.name, causal=True))
    st.dispose()
    assert attntune.explain(q, k, v, causal=True).variant == boom.name
    ref = TORCH_SDPA(q, k, v, is_causal=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out1 = attntune.attention(q, k, v, causal=True)
        out2 = attntune.attention(q, k, v, causal=True)
        outn = attntune.attention(qn, kn, vn, causal=True)
    msgs = _attntune_warnings(rec)
    assert len(msgs) == 1 and "quarantined" in msgs[0] and "kernel exploded" in msgs[0]
    assert boom.runs == 1  # the second call did not retry it, and the neighbour never tried it
    torch.testing.assert_close(out1, ref, atol=3e-5, rtol=1e-5)
    torch.testing.assert_close(out2, ref, atol=3e-5, rtol=1e-5)
    torch.testing.assert_close(outn, TORCH_SDPA(qn, kn, vn, is_causal=True), atol=3e-5, rtol=1e-5)
    plan = attntune.explain(q, k, v, causal=True)
    assert plan.source == "fallback" and any("kernel exploded" in r for r in plan.reasons)
    assert attntune.explain(qn, kn, vn, causal=True).source == "heuristic"
    s = attntune.stats()
    assert s["quarantined"][0]["variant"] == boom.name


def test_failing_sdpa_default_serves_the_call_on_eager_and_is_never_quarantined(monkeypatch):
    """When the failing plan *is* torch's own SDPA (the fallback's first choice), eager serves that call,
    said once; nothing is quarantined (eager is O(S^2) and many times slower: one failure must not send the
    process's later calls there), and the next call tries torch SDPA again."""
    q, k, v = rand_qkv(2, 4, 2, 10, 10, 16)
    st = _user_store()
    st.upsert_winner(_record(q, k, v, "sdpa_default"))
    st.dispose()
    real = registry.get("sdpa_default").run
    fails = [2]

    def broken(*a, **kw):
        if fails[0]:
            fails[0] -= 1
            raise RuntimeError("sdpa broke")
        return real(*a, **kw)

    # in the instance's __dict__, removed afterwards: monkeypatch.setattr on an instance would restore the
    # bound method as an instance attribute, hiding every later class-level patch of run (a later test's)
    monkeypatch.setitem(vars(registry.get("sdpa_default")), "run", broken)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        outs = [attntune.attention(q, k, v) for _ in range(3)]
    msgs = _attntune_warnings(rec)
    assert len(msgs) == 1 and "torch SDPA failed" in msgs[0] and "served by eager" in msgs[0], msgs
    for out in outs:
        torch.testing.assert_close(out, TORCH_SDPA(q, k, v, enable_gqa=True), atol=3e-5, rtol=1e-5)
    assert fails == [0]  # the third call ran torch SDPA again, and it worked
    plan = attntune.explain(q, k, v)
    assert (plan.source, plan.variant) == ("tuned", "sdpa_default")
    assert attntune.stats()["quarantined"] == []


class _Strict(Variant):
    """torch's SDPA under another name: a tuned variant that refuses what torch refuses."""

    name = "test_strict"
    family = "test"

    def supports(self, problem):
        return []

    def run(self, q, k, v, problem, config, kv_lens=None):
        return TORCH_SDPA(q, k, v, is_causal=problem.causal, enable_gqa=problem.group > 1)


@pytest.mark.parametrize("tuned", [None, "test_strict"])
def test_an_error_torch_itself_raises_is_the_callers_and_quarantines_nothing(tuned):
    """An inference-mode tensor in a call that needs autograd: torch raises, and so does attntune — the
    planned variant (torch's own SDPA, or a tuned one that refuses it too) is not quarantined for it, and
    later valid calls keep their plans (audit: it sent every later call of the process to eager, 9x
    slower)."""
    q, k, v = rand_qkv(1, 2, 2, 6, 6, 8)
    kg, vg = k.clone().requires_grad_(True), v.clone().requires_grad_(True)
    registry.register(_Strict())
    try:
        if tuned:
            st = _user_store()
            st.upsert_winner(_record(q, kg, vg, tuned))
            st.dispose()
        with torch.inference_mode():
            qi = q.clone()
        with pytest.raises(RuntimeError) as want:
            TORCH_SDPA(qi, kg, vg)
        with pytest.raises(RuntimeError) as got:
            attntune.attention(qi, kg, vg)
        assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]
        with attntune.dispatch():
            with pytest.raises(RuntimeError):
                F.scaled_dot_product_attention(qi, kg, vg)
        assert attntune.stats()["quarantined"] == []
        assert attntune.explain(q, kg, vg).variant == (tuned or "sdpa_default")
        out = attntune.attention(q, kg, vg)
        torch.testing.assert_close(out, TORCH_SDPA(q, kg, vg), atol=3e-5, rtol=1e-5)
    finally:
        registry.unregister(_Strict.name)


def test_a_users_sdpa_kernel_block_does_not_outlive_itself():
    """Inside a user's ``sdpa_kernel`` restriction torch's SDPA may refuse a call (on the CPU, the efficient
    backend alone: no viable backend): attntune serves it, and after the block every call is planned as
    before — nothing quarantined."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = rand_qkv(1, 2, 2, 9, 9, 16)
    with pytest.warns(RuntimeWarning, match="torch SDPA failed"):
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), attntune.dispatch():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, is_causal=True), atol=3e-5, rtol=1e-5)
    assert attntune.stats()["quarantined"] == []
    assert attntune.explain(q, k, v, causal=True).variant == "sdpa_default"


def test_failure_of_the_fallback_itself_raises(monkeypatch):
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    monkeypatch.setenv("ATTNTUNE_DISABLE", "1")
    attntune.reset()
    attntune.attention(q, k, v)

    def explode(*a, **kw):
        raise RuntimeError("torch itself failed")

    slot = next(iter(runtime.SLOTS.values()))
    monkeypatch.setattr(slot, "fn", explode)
    with pytest.raises(RuntimeError, match="torch itself failed"):
        attntune.attention(q, k, v)


@pytest.mark.parametrize("which", ["ATTNTUNE_CACHE", "ATTNTUNE_SYSTEM_CACHE"])
def test_broken_cache_file_one_warning_correct_results(tmp_path, monkeypatch, which):
    bad = tmp_path / f"garbage-{which}.db"
    bad.write_bytes(b"\x00\x17 this is not a database " * 64)
    monkeypatch.setenv(which, str(bad))
    attntune.reset()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for sq, skv, causal in ((8, 8, True), (3, 17, True), (12, 12, False)):
            q, k, v = rand_qkv(2, 4, 2, sq, skv, 16)
            out = attntune.attention(q, k, v, causal=causal)
            mask = _bottom_right_mask(sq, skv) if causal else None
            torch.testing.assert_close(out, TORCH_SDPA(q, k, v, attn_mask=mask, enable_gqa=True), atol=3e-5, rtol=1e-5)
            assert attntune.explain(q, k, v, causal=causal).source == "heuristic"
        attntune.reset()  # the flush of misses at reset must not warn again
    msgs = _attntune_warnings(rec)
    assert len(msgs) == 1 and str(bad) in msgs[0]


# ---- torch.compile -----------------------------------------------------------------------------------
def test_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()
    q, k, v = rand_qkv(2, 4, 2, 8, 12, 16, requires_grad=True)

    def f(q, k, v):
        return attntune.attention(q * 2.0, k, v, causal=True).sin()

    cf = torch.compile(f, fullgraph=True)
    out = cf(q, k, v)
    ref = torch.sin(TORCH_SDPA(q * 2.0, k, v, attn_mask=_bottom_right_mask(8, 12), enable_gqa=True))
    torch.testing.assert_close(out, ref, atol=3e-5, rtol=1e-5)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    rgrads = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(grads, rgrads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # The op resolved its plan at run time through the same plan cache (a fwd_bwd plan).
    modes = {p["problem"].split()[-1] for p in attntune.stats()["plans"]}
    assert "fwd_bwd" in modes


def test_compile_fullgraph_patched_sdpa():
    torch._dynamo.reset()
    q, k, v = rand_qkv(1, 4, 2, 6, 9, 16)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) + 1

    with attntune.dispatch(), torch.no_grad():
        out = torch.compile(f, fullgraph=True)(q, k, v)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, is_causal=True, enable_gqa=True) + 1, atol=3e-5, rtol=1e-5)
    assert attntune.stats()["calls"] == 1  # it went through the op, i.e. through attntune
    torch._dynamo.reset()


# ---- CLI -------------------------------------------------------------------------------------------
def test_cli_explain_and_bench():
    from typer.testing import CliRunner

    from attntune.cli import app

    r = CliRunner().invoke(app, ["explain", "--shape", "b=2,hq=8,hkv=2,sq=16,skv=64,d=32,causal=1",
                                 "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)[0]
    assert doc["source"] == "heuristic" and doc["variant"] == "sdpa_default" and doc["policy"] == "tuned"
    assert {c["variant"] for c in doc["candidates"]} >= {"eager", "sdpa_default"}
    r = CliRunner().invoke(app, ["explain", "--shape", "b=2,hq=8,sq=16", "--device", "cpu"])
    assert r.exit_code == 2 and "d" in r.output
    r = CliRunner().invoke(app, ["bench", "--stress", "--seconds", "0.3", "--device", "cpu", "--json",
                                 "--shape", "b=1,hq=2,sq=8,d=16,causal=1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    row = doc["shapes"][0]
    assert doc["stress"] and row["calls"] > 10 and row["p50_ms"] <= row["p99_ms"] and doc["peak_memory_mb"] > 0


# ---- GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["prefill", "decode", "window"])
def test_cuda_graph_capture(kind):
    dev = torch.device("cuda")
    if kind == "prefill":
        q, k, v = rand_qkv(2, 8, 2, 128, 128, 64, dtype=torch.float16, device=dev)
        kw = dict(causal=True)
    elif kind == "decode":
        q, k, v = rand_qkv(4, 16, 4, 1, 1024, 128, dtype=torch.float16, device=dev)
        kw = dict(kv_lens=torch.tensor([1024, 5, 700, 333], device=dev, dtype=torch.int32))
    else:
        q, k, v = rand_qkv(1, 8, 8, 512, 512, 64, dtype=torch.float16, device=dev)
        kw = dict(causal=True, window=(64, 0))
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                attntune.attention(q, k, v, **kw)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = attntune.attention(q, k, v, **kw)
        for seed in (1, 2):
            nq, nk, nv = rand_qkv(*q.shape[:2], k.shape[1], q.shape[2], k.shape[2], q.shape[3], dtype=torch.float16,
                                  device=dev, seed=seed)
            q.copy_(nq), k.copy_(nk), v.copy_(nv)
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(out, attntune.attention(q, k, v, **kw), atol=4e-3, rtol=4e-4)
    print(attntune.explain(q, k, v, **kw))


@pytest.mark.gpu
def test_gpu_routes_equal_sdpa():
    dev = torch.device("cuda")
    q, k, v = rand_qkv(2, 8, 2, 100, 300, 64, dtype=torch.float16, device=dev)
    out = attntune.attention(q, k, v, causal=True)
    ref = TORCH_SDPA(q, k, v, attn_mask=_bottom_right_mask(100, 300).to(dev), enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=4e-3, rtol=4e-4)
    out = attntune.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, is_causal=True, enable_gqa=True), atol=4e-3, rtol=4e-4)


@pytest.mark.gpu
def test_gpu_compile_fullgraph():
    torch._dynamo.reset()
    dev = torch.device("cuda")
    q, k, v = rand_qkv(2, 8, 2, 64, 64, 64, dtype=torch.bfloat16, device=dev, requires_grad=True)
    cf = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True), fullgraph=True)
    out = cf(q, k, v)
    ref = TORCH_SDPA(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=5e-3)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=0.9, rtol=0.1)


# ---- a decode family: one slot for every KV length ----------------------------------------------------
def _decode_family_env(monkeypatch):
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:triton_decode")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton_decode runs on the CPU only interpreted
    attntune.reset()


def _gqa_ref(q, k, v):
    g = q.shape[1] // k.shape[1]
    return TORCH_SDPA(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))


def test_decode_family_is_served_by_one_slot_and_one_prepared_launch_per_plan(monkeypatch):
    """A decode loop (views into one cache, a new KV length every call) keeps one slot for its family and
    prepares one launch per split plan and class of the length: the other lengths launch it with their
    length. A new tensor (HF's torch.cat cache: other strides) and another batch of the same bucket take
    the same slot."""
    from attntune.kernels import triton_decode_variant as tdv

    _decode_family_env(monkeypatch)
    prepared = []
    real_prepare = tdv.prepare_decode
    monkeypatch.setattr(tdv, "prepare_decode", lambda *a, **kw: prepared.append(a[1].shape[2]) or real_prepare(*a, **kw))
    q, kbuf, vbuf = rand_qkv(2, 4, 2, 1, 400, 16)
    lengths = list(range(321, 336))  # one tile count, one split plan, none divisible by 16 (Triton's class)
    for n in lengths:
        out = attntune.attention(q, kbuf[:, :, :n], vbuf[:, :, :n], causal=True)
        torch.testing.assert_close(out, _gqa_ref(q, kbuf[:, :, :n], vbuf[:, :, :n]), atol=3e-5, rtol=1e-5)
    assert prepared == [321]
    for n in (300, 330, 301):  # another range, back to the first (kept), the second again: no new launch
        torch.testing.assert_close(attntune.attention(q, kbuf[:, :, :n], vbuf[:, :, :n], causal=True),
                                   _gqa_ref(q, kbuf[:, :, :n], vbuf[:, :, :n]), atol=3e-5, rtol=1e-5)
    assert prepared == [321, 300]
    lengths += [300, 301]
    k2, v2 = kbuf[:, :, :350].clone(), vbuf[:, :, :350].clone()  # contiguous: other strides
    torch.testing.assert_close(attntune.attention(q, k2, v2, causal=True), _gqa_ref(q, k2, v2), atol=3e-5, rtol=1e-5)
    q3, k3, v3 = rand_qkv(17, 4, 2, 1, 340, 16, seed=5)  # batches 17..24 share a bucket
    q4 = torch.cat([q3, q3[:1]])
    k4, v4 = torch.cat([k3, k3[:1]]), torch.cat([v3, v3[:1]])
    for qq, kk, vv in ((q3, k3, v3), (q4, k4, v4)):
        torch.testing.assert_close(attntune.attention(qq, kk, vv, causal=True), _gqa_ref(qq, kk, vv),
                                   atol=3e-5, rtol=1e-5)
    slots = {id(s): s for s in runtime.SLOTS.values()}
    assert len(runtime.SLOTS) == len(lengths) + 3 and len(slots) == 2  # B=2 and B=17..24: two families
    plans = attntune.stats()["plans"]
    assert sorted(p["calls"] for p in plans) == [2, len(lengths) + 2]  # + the contiguous call, + 330 again
    assert all(p["family"] and p["variant"] == "triton_decode" for p in plans)


def test_a_dynamic_cache_decode_loop_prepares_one_launch_per_range_not_one_per_step(monkeypatch):
    """HF's dynamic cache hands a new contiguous K/V tensor every step (torch.cat): other lengths *and*
    other batch/head strides. A launch prepared for one step serves the next ones of its length range with
    the new strides swapped in (it prepared one launch per step before); each is what prepare_decode would
    build for that step, and the results are exact. A stride of another Triton class prepares anew."""
    from attntune.kernels import triton_decode_variant as tdv
    from attntune.kernels.triton_common import dot_precision
    from attntune.kernels.triton_decode import launch as dl

    _decode_family_env(monkeypatch)
    prepared, launched = [], []
    real_prepare, real_launch = tdv.prepare_decode, dl.DecodeLaunch.launch
    monkeypatch.setattr(tdv, "prepare_decode", lambda *a, **kw: prepared.append(a[1].shape[2]) or real_prepare(*a, **kw))
    monkeypatch.setattr(dl.DecodeLaunch, "launch", lambda self, *a, **kw: launched.append((self, a[1])) or
                        real_launch(self, *a, **kw))
    q, kbuf, vbuf = rand_qkv(2, 4, 2, 1, 400, 16)
    lengths = [n for n in range(321, 336)]  # one length range; none divisible by 16
    for n in lengths:
        k, v = kbuf[:, :, :n].contiguous(), vbuf[:, :, :n].contiguous()  # a new tensor a step
        torch.testing.assert_close(attntune.attention(q, k, v, causal=True), _gqa_ref(q, k, v), atol=3e-5, rtol=1e-5)
    assert prepared == [321]
    out = torch.empty(2, 4, 1, 16)
    for launch, k in launched:  # each step's launch is the one a full prepare would make for its tensors
        causal, window = launch.plan_args[10:12]  # the plan's canonical mask (causal over one query: none)
        want = real_prepare(q, k, k, None, out, causal, 0.25, launch.cfg, dot_precision(q.dtype), window)
        assert launch._replace(lo=want.lo, hi=want.hi) == want and want.lo <= launch.lo <= launch.hi <= want.hi
    # strides of another class (a batch stride not divisible by 16): a launch of its own
    k = torch.randn(2, 2, 336 + 1, 17)[..., :16]
    n_before = len(prepared)
    torch.testing.assert_close(attntune.attention(q, k[:, :, :330], k[:, :, :330], causal=True),
                               _gqa_ref(q, k[:, :, :330], k[:, :, :330]), atol=3e-5, rtol=1e-5)
    assert len(prepared) == n_before + 1


def test_decode_family_slot_failure_falls_back_for_the_exact_shape(monkeypatch):
    """A failure inside a family-generic slot quarantines the variant and serves *this* call's shape (not
    the family's first shape) from the safe fallback; later lengths of the family are re-resolved."""
    from attntune.kernels import triton_decode_variant as tdv

    _decode_family_env(monkeypatch)
    q, kbuf, vbuf = rand_qkv(2, 4, 2, 1, 400, 16)
    attntune.attention(q, kbuf[:, :, :321], vbuf[:, :, :321], causal=True)
    real = tdv.BoundDecode.__call__

    def flaky(self, q, k, v, *a, **kw):
        if k.shape[2] == 330:
            raise RuntimeError("injected launch failure")
        return real(self, q, k, v, *a, **kw)

    monkeypatch.setattr(tdv.BoundDecode, "__call__", flaky)
    with pytest.warns(RuntimeWarning, match="quarantined"):
        out = attntune.attention(q, kbuf[:, :, :330], vbuf[:, :, :330], causal=True)
    torch.testing.assert_close(out, _gqa_ref(q, kbuf[:, :, :330], vbuf[:, :, :330]), atol=3e-5, rtol=1e-5)
    for n in (321, 331):  # the family's old signature and a new one: the fallback, correct
        out = attntune.attention(q, kbuf[:, :, :n], vbuf[:, :, :n], causal=True)
        torch.testing.assert_close(out, _gqa_ref(q, kbuf[:, :, :n], vbuf[:, :, :n]), atol=3e-5, rtol=1e-5)
    s = attntune.stats()
    assert [x["variant"] for x in s["quarantined"]] == ["triton_decode"]
    assert {p["problem"].split(" S1x")[1].split(" ")[0] for p in s["plans"] if p["source"] == "fallback"} \
        == {"330", "321", "331"}


def test_decode_family_slot_keeps_the_length_limit(monkeypatch):
    """ATTNTUNE_MAX_SEQLEN still applies to each exact length a family-generic slot would take."""
    _decode_family_env(monkeypatch)
    monkeypatch.setenv("ATTNTUNE_MAX_SEQLEN", "340")
    attntune.reset()
    q, kbuf, vbuf = rand_qkv(2, 4, 2, 1, 400, 16)
    for n in (321, 339, 345):  # one bucket (384); 345 is over the limit
        out = attntune.attention(q, kbuf[:, :, :n], vbuf[:, :, :n], causal=True)
        torch.testing.assert_close(out, _gqa_ref(q, kbuf[:, :, :n], vbuf[:, :, :n]), atol=3e-5, rtol=1e-5)
    by_source = {p["source"]: p for p in attntune.stats()["plans"]}
    assert by_source["fallback"]["problem"].startswith("B2 H4/2 S1x345") and by_source["fallback"]["calls"] == 1
    assert sum(p["calls"] for p in attntune.stats()["plans"] if p["variant"] == "triton_decode") == 2


def test_explain_says_how_a_row_was_timed():
    """A GPU decode row was timed under CUDA graphs (two-kernel split-K) and its eager calls fuse the
    combine; every other row was timed eagerly with the host's launch gaps held out."""
    from attntune.device import fingerprint_from_gpu_props
    from attntune.policies.policy import _timing_note

    h200 = fingerprint_from_gpu_props({"name": "NVIDIA H200", "major": 9, "minor": 0, "multi_processor_count": 132})
    q, k = torch.empty(3, 8, 1, 40), torch.empty(3, 2, 777, 40)
    decode = TuneKey.from_problem(problem_from_tensors(q, k, k, causal=True), h200)
    assert "CUDA graphs" in _timing_note(decode) and "last split combines" in _timing_note(decode) \
        and "EAGER_FUSE_MAX_BYTES" in _timing_note(decode)
    prefill = TuneKey.from_problem(problem_from_tensors(torch.empty(3, 8, 17, 40), k, k), h200)
    assert "held out" in _timing_note(prefill)
    cpu = TuneKey.from_problem(problem_from_tensors(q, k, k), device_fingerprint("cpu"))
    assert "CUDA graphs" not in _timing_note(cpu)
    assert "TF32" not in _timing_note(prefill)
    fp32 = problem_from_tensors(torch.empty(3, 8, 17, 40), k, k).model_copy(update={"device_type": "cuda",
                                                                                   "tf32": True})
    assert "TF32 dots" in _timing_note(TuneKey.from_problem(fp32, h200))


def test_threads_meeting_a_new_shape_at_once_share_one_slot_and_every_call_is_counted(monkeypatch):
    """A new exact shape of a known family: threads that reach it together all build its slot from the
    family's plan; the first stored one must serve them all, or the calls counted on a replaced slot vanish
    (a loaded CI machine counted 318 of 320). The variant's bind is slowed so that they do meet."""
    from attntune.kernels import registry as reg

    q, k, v = rand_qkv(2, 4, 2, 5, 33, 16, seed=1)
    attntune.attention(q, k, v, causal=True)  # the family's plan
    [plan] = attntune.stats()["plans"]
    impl = reg.get(plan["variant"])
    real_bind = impl.bind
    barrier = threading.Barrier(8)

    def slow_bind(problem, config):
        time.sleep(0.05)  # every thread is inside the slot's construction before any stores it
        return real_bind(problem, config)

    monkeypatch.setitem(vars(impl), "bind", slow_bind)  # removed afterwards (see the sdpa "run" patch above)
    q2, k2, v2 = rand_qkv(2, 4, 2, 5, 34, 16, seed=2)  # one key more: the same family, a new signature

    def worker():
        barrier.wait()
        attntune.attention(q2, k2, v2, causal=True)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = attntune.stats()
    assert s["calls"] == 9, s["plans"]


_RESET_RACE = r"""
import sys, threading, time
import torch, attntune
errors = []
def worker(seed):
    try:
        g = torch.Generator().manual_seed(seed)
        for s in range(1, 250):  # a never-seen KV length every call: each one resolves under the runtime lock
            q = torch.randn(1, 2, 1, 8, generator=g)
            k = torch.randn(1, 2, s, 8, generator=g)
            out = attntune.attention(q, k, k, causal=True)
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, k)
            if not torch.allclose(out, ref, atol=1e-5, rtol=1e-5):
                errors.append(f"wrong result at length {s}")
    except Exception as e:
        errors.append(repr(e))
stop = threading.Event()
def resetter():
    try:
        while not stop.is_set():
            attntune.reset()
    except Exception as e:
        errors.append("reset: " + repr(e))
ws = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(2)]
r = threading.Thread(target=resetter, daemon=True)
r.start(); [w.start() for w in ws]
deadline = time.time() + 30
for w in ws:
    w.join(timeout=max(0.1, deadline - time.time()))
hung = any(w.is_alive() for w in ws)
stop.set(); r.join(timeout=10)
print("HUNG" if hung or r.is_alive() else "OK", errors[:3])
sys.stdout.flush()
import os; os._exit(0 if not hung and not r.is_alive() and not errors else 1)
"""


def test_reset_while_other_threads_resolve_new_shapes_never_deadlocks(tmp_path):
    """reset() held the module's runtime lock while waiting for the runtime's own lock, and a thread
    resolving a plan held that one while asking for the first (hung 3 of 3 runs); closing the old
    runtime could also join its miss flusher before it had started. In a subprocess, so a regression
    fails this test instead of hanging the suite."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ATTNTUNE_CACHE=str(tmp_path / "c.db"), ATTNTUNE_SYSTEM_CACHE=str(tmp_path / "none.db"))
    try:
        p = subprocess.run([sys.executable, "-c", _RESET_RACE], env=env, capture_output=True, text=True,
                           timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("reset() racing new-shape calls did not finish in 90 s")
    assert p.returncode == 0 and p.stdout.startswith("OK"), (p.stdout, p.stderr[-2000:])


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_nested_tensors_go_to_torch_through_the_dropin(layout):
    """torch's SDPA takes nested tensors ([B, H, (S), D]); the drop-in hands them over as they are (audit:
    the strided layout's sizes raise RuntimeError, which the drop-in did not catch)."""
    g = torch.Generator().manual_seed(0)

    def nt():
        if layout == torch.strided:  # [B, H, (S), D] directly
            return torch.nested.nested_tensor([torch.randn(4, s, 16, generator=g) for s in (3, 5)])
        # jagged nests [B, (S), H, D]: SDPA takes its transpose [B, H, (S), D]
        parts = [torch.randn(s, 4, 16, generator=g) for s in (3, 5)]
        return torch.nested.nested_tensor(parts, layout=torch.jagged).transpose(1, 2)

    q, k, v = nt(), nt(), nt()
    want = TORCH_SDPA(q, k, v)
    got = attntune.scaled_dot_product_attention(q, k, v)
    with attntune.dispatch():
        got2 = F.scaled_dot_product_attention(q, k, v)
    for out in (got, got2):
        assert out.is_nested
        for a, b in zip(out.unbind(), want.unbind()):
            torch.testing.assert_close(a, b)


def test_torchscript_inside_dispatch_compiles_torchs_sdpa(tmp_path):
    """torch.jit.script of a stock module inside dispatch() compiled the patched F.sdpa (a Python function it
    cannot compile: the script failed, and the failure broke TorchScript for the rest of the process, audit).
    It now compiles torch's own op: the scripted module runs, equals the module, and saves."""
    import torch.nn as nn

    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with attntune.dispatch():
        scripted = torch.jit.script(mha)
        got = scripted(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(got, mha(x, x, x, need_weights=False)[0])
    torch.jit.save(scripted, str(tmp_path / "mha.pt"))
    layer = torch.jit.script(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval())  # still works
    assert layer(x).shape == x.shape
