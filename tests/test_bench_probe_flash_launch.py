"""benchmarks/probe_flash_launch.py runs end to end on the CPU (--smoke): every call path is timed in both
launch modes, and the pinned variant is the one attntune.attention ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "probe_flash_launch.py"


def test_probe_flash_launch_smoke(tmp_path):
    out = tmp_path / "p.json"
    env = dict(os.environ, ATTNTUNE_SYSTEM_CACHE="", ATTNTUNE_CACHE=str(tmp_path / "cache.db"))
    p = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--reps", "2", "--inner", "2", "--out", str(out)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    (case,) = json.loads(out.read_text())["cases"].values()
    assert case["shape"]["window"] == [7, 0] and case["shape"]["pinned"] == "triton_local"
    assert set(case["paths"]) == {"fwd", "fwd_bwd", "attention_fwd_bwd"}  # SDPA's only on a GPU
    for rec in case["paths"].values():
        for mode in ("direct", "triton"):
            assert rec[mode]["host_us"] > 0 and rec[mode]["single_ms"] > 0 and rec[mode]["b2b_ms"] > 0
        assert set(rec["triton_over_direct"]) == {"host_us", "single_ms", "b2b_ms"}
