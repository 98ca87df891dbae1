"""Declared source equivalences (attntune.kernels.equivalences) hold for the source they were declared against
and for no other: an edit of a hashed kernel module after a declaration stales the declared earlier rows too."""
from __future__ import annotations

import pytest
from helpers import doctest_results

from attntune.kernels import equivalences, registry
from attntune.kernels.equivalences import Equivalence, Scoped
from attntune.key import TuneKey


def test_every_declaration_names_its_variants_current_source():
    """A declaration whose ``current`` is not the variant's hash any more is dead: its rows (and the current
    ones) went stale with the edit. Either the edit re-tunes the rows and the declaration goes, or the edit is
    declared too (its replaced hash into ``earlier``, the new hash into ``current``)."""
    declared = equivalences.declared()
    assert declared
    for name, eq in declared.items():
        v = registry.get(name)
        assert eq.current == v.source_hash(), (
            f"{name}: declared against {eq.current}, the source is now {v.source_hash()} — re-tune its rows and drop "
            "the declaration, or declare this edit (kernels/equivalences.py)")
        assert eq.current not in eq.earlier and eq.current not in eq.scoped
        assert not set(eq.earlier) & set(eq.scoped)
        assert set(v.equivalent_sources) == set(eq.earlier) | set(eq.scoped)


def test_an_earlier_source_counts_only_while_the_declared_one_runs(monkeypatch):
    monkeypatch.setitem(equivalences._EQUIVALENCES, "v", Equivalence("cur0000000000000", {"old0000000000000": "why"}))
    assert equivalences.accepts("v", "cur0000000000000", "old0000000000000")
    assert equivalences.accepts("v", "cur0000000000000", "cur0000000000000")
    # the variant's source changed again without a declaration: the declared rows are stale with the rest
    assert not equivalences.accepts("v", "new0000000000000", "old0000000000000")
    assert not equivalences.accepts("v", "new0000000000000", "cur0000000000000")
    assert equivalences.accepts("v", "new0000000000000", "new0000000000000")
    assert not equivalences.accepts("v", "cur0000000000000", "unknown000000000")


def _key(**kw) -> TuneKey:
    """An H200 forward key (bf16 unless ``kw`` says otherwise)."""
    base = {"device": {"backend": "cuda", "arch": "sm_90", "name": "NVIDIA H200", "units": 132},
            "dtype": "bfloat16", "batch": 1, "heads_q": 32, "heads_kv": 8, "seqlen_q": 4096, "seqlen_kv": 4096,
            "head_dim": 128, "head_dim_v": 128, "causal": True, "causal_align": "top_left", "window": None,
            "kv_lens": False, "mode": "fwd", "approx": False}
    return TuneKey.model_validate({**base, **kw})


BF16, FP8, TF32 = _key(), _key(kv_dtype="float8_e4m3fn"), _key(dtype="float32", tf32=True)


@pytest.mark.parametrize("name", ["triton_local", "triton_flash", "sdpa_default", "flex"])
def test_a_registered_variant_accepts_its_declared_rows_only_under_the_declared_source(name):
    v = registry.get(name)
    earlier = next(iter(v.equivalent_sources))
    assert v.accepts_source(earlier, BF16) and v.accepts_source(v.source_hash())
    assert not v.accepts_source("0123456789abcdef", BF16)
    # what accepts_source asks for this variant once its hash is another (an undeclared edit)
    assert not equivalences.accepts(name, "fedcba9876543210", earlier, BF16)


def test_a_scoped_declaration_holds_for_its_keys_only(monkeypatch):
    only_bf16 = Scoped("why", "bf16 keys", lambda key: key.dtype == "bfloat16")
    monkeypatch.setitem(equivalences._EQUIVALENCES, "v",
                        Equivalence("cur0000000000000", {}, {"old0000000000000": only_bf16}))
    assert equivalences.accepts("v", "cur0000000000000", "old0000000000000", BF16)
    assert not equivalences.accepts("v", "cur0000000000000", "old0000000000000", TF32)
    assert not equivalences.accepts("v", "cur0000000000000", "old0000000000000")  # no key: not within any scope
    assert not equivalences.accepts("v", "new0000000000000", "old0000000000000", BF16)
    assert "only for bf16 keys" in equivalences.earlier("v")["old0000000000000"]


@pytest.mark.parametrize("name", ["triton_flash", "triton_local"])
def test_v_t_keeps_the_flash_rows_of_keys_without_the_v_copy(name):
    """V_T (descriptor loads over the FP8/TF32 V copy) changed only launches that copy V: the rows written before
    it stay valid for other keys, and the FP8 and TF32 rows read as stale."""
    v = registry.get(name)
    for earlier in v.equivalent_sources:
        assert v.accepts_source(earlier, BF16) and v.accepts_source(earlier, _key(dtype="float32"))
        assert not v.accepts_source(earlier, FP8) and not v.accepts_source(earlier, TF32)


def test_judge_passes_the_rows_key_to_a_scoped_declaration():
    """The cache reader judges a row written under a scoped earlier source valid for a key within the scope and
    stale outside it (the versions match, so the source is the only difference)."""
    from attntune.cache.models import WinnerRecord, judge, record_to_row, utcnow
    from attntune.device import software_fingerprint

    v = registry.get("triton_flash")
    scoped = next(h for h, why in v.equivalent_sources.items() if "only for" in why)
    config = {"BLOCK_M": 64, "BLOCK_N": 64, "LOADS": 0, "num_stages": 3, "num_warps": 4}
    status = {}
    for name, key in (("bf16", BF16), ("fp8", FP8), ("tf32", TF32)):
        rec = WinnerRecord(key=key, variant="triton_flash", config=config, median_ms=0.3,
                           fingerprint=software_fingerprint(scoped, "cuda"), created_at=utcnow())
        row = judge(record_to_row(rec), "test", registry)
        status[name] = (row.status, row.reasons)
    assert status["bf16"][0] == "valid", status
    assert status["fp8"][0] == status["tf32"][0] == "stale", status
    assert any("source" in r for r in status["fp8"][1]), status


def test_doctests():
    assert all(failed == 0 for _, failed in doctest_results(equivalences.accepts))
    assert sum(n for n, _ in doctest_results(equivalences.accepts)) >= 1
