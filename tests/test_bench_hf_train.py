"""benchmarks/bench_hf_train.py runs end to end on the CPU (--smoke) and writes what its README figures need."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_hf_train.py"


def test_bench_hf_train_smoke(tmp_path):
    out = tmp_path / "hf_train.json"
    env = dict(os.environ, ATTNTUNE_SYSTEM_CACHE="", ATTNTUNE_CACHE=str(tmp_path / "cache.db"))
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--models", "mistral", "--modes", "eager,compiled",
           "--out", str(out)]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["smoke"] and doc["environment"]["torch"] and doc["transformers"]
    assert [(c["model"], c["mode"]) for c in doc["cases"]] == [("mistral", "eager"), ("mistral", "compiled")]
    for c in doc["cases"]:
        assert c["ms"]["sdpa"] > 0 and c["ms"]["attntune"] > 0 and c["ratio"] > 0
        assert c["warmup_loss"]["sdpa"] == pytest.approx(c["warmup_loss"]["attntune"], rel=1e-4)
        assert c["plans"], "attntune served no attention call"  # compiled too: the window is described
    assert doc["summary"]["mistral_compiled_vs_sdpa"] == doc["cases"][1]["ratio"]
