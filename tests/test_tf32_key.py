"""float32 numerics are part of the problem and its tune key: ``tf32`` (CUDA float32 with
``float32_matmul_precision`` below "highest"). The TF32 forward is ~4.7x SDPA on the H200 and the exact one
is not, so a row tuned under one precision must not serve the other; every other key keeps its id."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attntune
from attntune.autotune import gate
from attntune.autotune.shapes import ShapeSpecError, parse_shape
from attntune.cache.store import CacheStore
from attntune.key import DeviceFingerprint, TuneKey
from attntune.policies import dispatch, runtime
from attntune.problem import AttentionProblem
from attntune.tolerances import tf32_active

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def precision():
    old = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(old)


def _prob(**kw):
    base = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=37, seqlen_kv=37, head_dim=64, head_dim_v=64,
                dtype="float32", device_type="cuda")
    base.update(kw)
    return AttentionProblem(**base)


def test_tf32_active_only_for_cuda_float32_with_tf32_allowed(precision, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    precision("high")
    assert tf32_active("float32", "cuda")
    assert not tf32_active("bfloat16", "cuda") and not tf32_active("float32", "cpu")
    precision("highest")
    assert not tf32_active("float32", "cuda")
    precision("high")
    monkeypatch.setattr(torch.version, "hip", "6.2")  # ROCm kernels keep IEEE float32 dots
    assert not tf32_active("float32", "cuda")


def test_tf32_problem_field_is_validated_and_shown():
    assert " tf32" in _prob(tf32=True).short() and " tf32" not in _prob().short()
    for kw in (dict(dtype="bfloat16"), dict(device_type="cpu")):
        with pytest.raises(ValueError, match="tf32"):
            _prob(tf32=True, **kw)


def test_tf32_enters_the_key_only_when_set():
    fp = DeviceFingerprint(backend="cuda", arch="sm_90", name="NVIDIA H200", units=132)
    off, on = TuneKey.from_problem(_prob(), fp), TuneKey.from_problem(_prob(tf32=True), fp)
    assert off.key_id != on.key_id and off.family() != on.family() and on.representative().tf32
    assert "tf32" not in off.model_dump_json(exclude={"kv_dtype", "tf32"})
    # the id of a key without the flag is the JSON without the field: ids from before the field exist
    import hashlib

    legacy = off.model_dump(exclude={"tf32", "kv_dtype"})
    assert off.key_id == hashlib.sha1(TuneKey.model_validate(legacy).model_dump_json(
        exclude={"tf32", "kv_dtype"}).encode()).hexdigest()[:20]


def test_every_shipped_row_keeps_its_key_id():
    """The shipped cache was written before the field existed: a new key field that entered key_id by
    default would orphan every row (the runtime looks rows up by id)."""
    store = CacheStore(ROOT / "cache.db")
    try:
        rows = store.raw_winners()
    finally:
        store.dispose()
    assert rows
    assert [r["key_id"] for r in rows] == [TuneKey.model_validate_json(r["key_json"]).key_id for r in rows]


def test_shape_spec_takes_tf32():
    assert parse_shape("hq=4,sq=64,d=64,tf32=1", device_type="cuda", dtype="float32").tf32
    assert not parse_shape("hq=4,sq=64,d=64", device_type="cuda", dtype="float32").tf32
    with pytest.raises(ShapeSpecError, match="field tf32"):
        parse_shape("hq=4,sq=64,d=64,tf32=1", device_type="cpu", dtype="float32")


@pytest.mark.parametrize("key_tf32, before, inside", [(True, "highest", "high"), (False, "high", "highest"),
                                                      (True, "medium", "medium"), (False, "highest", "highest")])
def test_tuner_measures_a_key_under_its_numerics(key_tf32, before, inside, precision, monkeypatch):
    """The tuner sets the precision the key says while it measures it and restores the caller's after; a
    key whose numerics are already in force (online tuning of the caller's own call) is left alone."""
    monkeypatch.setattr(torch.version, "hip", None)
    precision(before)
    with gate.key_numerics(_prob(tf32=key_tf32)):
        assert torch.get_float32_matmul_precision() == inside
    assert torch.get_float32_matmul_precision() == before
    with gate.key_numerics(_prob(dtype="bfloat16")):  # other dtypes: untouched
        assert torch.get_float32_matmul_precision() == before


def test_a_float32_plan_is_not_reused_across_precisions(precision):
    """The dispatch signature of a float32 call holds the precision: a plan made under one is never
    served under the other (bf16 calls: no precision read, one identity check)."""
    attntune.reset()
    q = torch.randn(1, 2, 9, 16)
    bf = q.bfloat16()
    precision("highest")
    assert dispatch._numerics(q) is False and dispatch._numerics(bf) is None
    attntune.attention(q, q, q)
    n = len(runtime.SLOTS)
    attntune.attention(q, q, q)
    assert len(runtime.SLOTS) == n  # same precision: the same slot
    precision("high")
    assert dispatch._numerics(q) is True
    attntune.attention(q, q, q)
    assert len(runtime.SLOTS) == n + 1
    attntune.reset()


def test_heuristic_sends_tf32_float32_to_the_triton_forward_and_exact_float32_elsewhere(monkeypatch):
    """The heuristic's ``fp32-tf32`` rule reads the problem's own numerics (not torch's setting at plan
    time): the TF32 problem goes to our forward, the exact one does not (a GPU faked: every variant usable)."""
    from attntune.policies import policy

    monkeypatch.setattr(policy, "usable", lambda name, config, problem, quarantine: [])
    tf32 = policy.heuristic_plan(_prob(tf32=True, causal=True), None, set())
    assert tf32.impl.name == "triton_flash" and any("rule fp32-tf32" in r for r in tf32.reasons), tf32.reasons
    exact = policy.heuristic_plan(_prob(causal=True), None, set())
    assert not any("rule fp32-tf32" in r for r in exact.reasons), exact.reasons


def test_no_tf32_key_on_rocm(monkeypatch):
    """ROCm kernels keep IEEE float32 dots: a float32 call there is never keyed tf32, so neither the
    default suite's TF32 templates nor ``--shape ...,tf32=1`` make a TF32 key on ROCm (exact float32 keys
    instead / a clear error naming the field)."""
    from attntune.autotune.suites import SUITES, materialize

    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert not tf32_active("float32", "cuda")
    fp32 = [p for p in materialize(SUITES["default"].templates(), "cuda") if p.dtype == "float32"]
    assert len(fp32) == 3 and not any(p.tf32 for p in fp32)
    with pytest.raises(ShapeSpecError, match="field tf32"):
        parse_shape("hq=4,sq=64,d=64,tf32=1", device_type="cuda", dtype="float32")
