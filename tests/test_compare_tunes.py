"""benchmarks/compare_tunes.py: cross-process reproducibility of two tune runs' stored times."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "compare_tunes", Path(__file__).resolve().parents[1] / "benchmarks" / "compare_tunes.py")
ct = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ct)


def _row(kid, variant, ms, config=None, seqlen=1000):
    key = {"device": {"backend": "cuda", "arch": "sm_90", "name": "NVIDIA H200", "units": 132},
           "batch": 3, "heads_q": 8, "heads_kv": 2, "seqlen_q": seqlen, "seqlen_kv": seqlen, "head_dim": 72,
           "head_dim_v": 72, "dtype": "bfloat16", "causal": True, "causal_align": "bottom_right", "window": None,
           "kv_lens": False, "mode": "fwd", "approx": False}
    return {"key_id": kid, "record": {"key": key, "variant": variant, "config": config or {"BLOCK_M": 64},
                                      "median_ms": ms, "spread": 0.01}}


def test_same_winners_give_relative_differences_others_are_listed_apart(tmp_path):
    a = [_row("k1", "sdpa_default", 1.0), _row("k2", "triton_flash", 2.0), _row("k3", "triton_decode", 0.01),
         _row("k4", "triton_flash", 0.5, {"BLOCK_M": 128})]
    b = [_row("k1", "sdpa_default", 1.1), _row("k2", "triton_flash", 1.92), _row("k3", "triton_decode", 0.02),
         _row("k4", "triton_flash", 0.4, {"BLOCK_M": 64})]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    res = ct.compare(ct.rows(str(pa)), ct.rows(str(pb)), {"triton_decode"})
    diffs = sorted(r["relative_difference"] for r in res["same"])
    assert diffs == pytest.approx([-0.04, 0.1])
    assert res["summary"] == {"same_winner_keys": 2, "different_winner_keys": 1,
                              "median_abs_difference": pytest.approx(0.07),
                              "max_abs_difference": pytest.approx(0.1), "within_5_percent": 1}
    assert res["different"][0]["a"] == ["triton_flash", 0.5]
