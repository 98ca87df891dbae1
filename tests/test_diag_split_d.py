"""CPU smoke test of benchmarks/diag_split_d.py (the one-process-per-config diagnosis of the split-head-dim
series, which needs a GPU to mean anything): its hazard probe runs and is exact under the interpreter, a
child that dies is reported as a crash of its own config, and the judgement applies the dtype's bound —
so a GPU call does not spend its minutes finding a bug in the script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
diag = pytest.importorskip("diag_split_d")

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke test under the Triton interpreter "
                              "(conftest enables it only without a GPU); on a GPU the script itself runs")


@CPU_ONLY
def test_probe_loop_matches_its_reference_with_one_and_two_register_a_dots():
    for two in (0, 1):
        r = diag.probe_one({"bm": 16, "bn": 16, "warps": 4, "stages": 1, "bd2": 16, "two": two})
        assert r["err"] < 1e-5 and (not two or r["err2"] < 1e-5), r


@CPU_ONLY
def test_a_child_that_dies_is_reported_as_its_own_crash(tmp_path, monkeypatch):
    # a payload the child cannot run (a config the launcher rejects): the parent records the crash, its
    # exit status and the error's last lines for that config, and goes on
    bad = {"d": 80, "dtype": "float16", "fwd": {"BLOCK_M": 3}, "bwd": None}
    r = diag._child("case", bad, timeout=120)
    assert r["status"] == "crash" and r["rc"] != 0 and r["error"], r
    ok = diag._child("probe", {"bm": 16, "bn": 16, "warps": 4, "stages": 1, "bd2": 16, "two": 1}, timeout=120)
    assert ok["status"] == "ran" and ok["err2"] < 1e-5, ok


def test_judgement_uses_the_dtype_bound_and_keeps_non_runs():
    c = {"dtype": "float16", "bwd": None}
    assert diag._judge(c, {"status": "ran", "split": {"out": 1e-3}})["status"] == "ok"
    assert diag._judge(c, {"status": "ran", "split": {"out": 0.5}})["status"] == "wrong"
    assert diag._judge(dict(c, bwd={"BWD_SPLIT_D": 1}), {"status": "ran", "split": {"out": 1e-3, "dq": 1e-2}}
                       )["status"] == "ok"  # gradients: the looser bound
    assert diag._judge(c, {"status": "crash", "error": "x"}) == {"status": "crash", "error": "x"}
    assert json.dumps(diag.probes())  # payloads are JSON for the child's argv
