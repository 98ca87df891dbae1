"""benchmarks/bench_window_train.py runs end to end on the CPU (--smoke): each pinned variant either runs as
itself or is reported as an error (never timed under another variant's name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_window_train.py"


def test_bench_window_train_smoke(tmp_path):
    out = tmp_path / "wt.json"
    env = dict(os.environ, ATTNTUNE_SYSTEM_CACHE="", ATTNTUNE_CACHE=str(tmp_path / "cache.db"))
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--reps", "2", "--out", str(out)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    (case,) = json.loads(out.read_text())["cases"].values()
    assert case["shape"]["window"] == [7, 0]
    # the Triton variants run on the CPU through the interpreter; Flex needs a GPU here: an error, not a time
    assert case["ms"]["triton_local"] > 0 and case["ms"]["triton_flash"] > 0
    assert "flex" not in case["ms"] and "not flex" in case["errors"]["flex"]
    assert "gluon_flash" not in case["ms"] and "not gluon_flash" in case["errors"]["gluon_flash"]  # sm_90 only
    assert case["vs_triton_local"]["triton_local"] == 1.0
