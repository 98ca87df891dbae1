"""CPU smoke test of benchmarks/bench_fp8.py's prefill part (the FP8 flash forward against SDPA): a tiny run
under the Triton interpreter, timed with a plain wall clock (the GPU timers need CUDA), so that the record
and the summary it feeds are built end to end before a GPU call spends its minutes on them."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
bench_fp8 = pytest.importorskip("bench_fp8")


def test_prefill_record_and_summary(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CPU smoke test: it runs the kernel on CPU tensors under the Triton interpreter, which "
                    "conftest enables only without a GPU; on a GPU run_gpu.sh's fp8 stage runs the benchmark")

    def wall_us(fn):
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6

    monkeypatch.setattr(bench_fp8, "time_eager", wall_us)
    grid = dict(BLOCK_M=(16,), BLOCK_N=(16, 32), num_warps=(4,), num_stages=(1,), LOADS=(0,))
    rows = [bench_fp8.bench_prefill(1, 40, 4, 2, causal, device="cpu", d=16, grid=grid) for causal in (False, True)]
    for r in rows:
        # two configs in each of V's two memory layouts, all of which ran
        assert len(r["sweep_ms"]) == 4 and all(x[0] is not None for x in r["sweep_ms"]), r["sweep_ms"]
        assert sorted(x[2] for x in r["sweep_ms"]) == ["d", "d", "n", "n"]
        assert [r["fp8_best_config"], r["fp8_best_v_layout"]] in [x[1:3] for x in r["sweep_ms"]]
        assert r["fp8_tflops"] > 0 and r["ms"]["v_transpose"] > 0
        # the interpreter's FP8 dots are exact: the error is FP8's own (q and P quantised), a few percent
        assert 1e-3 < r["rel_error"]["fp8_flash"] < 0.1, r["rel_error"]
        assert "cudnn" in r.get("sdpa_unavailable", {}) or "sdpa_cudnn" in r["ms"]  # no cuDNN on a CPU
    s = bench_fp8.summarize([], rows)
    assert s["prefill_fp8_tflops"] == rows[0]["fp8_tflops"] and s["max_rel_error"] == max(
        r["rel_error"]["fp8_flash"] for r in rows)
