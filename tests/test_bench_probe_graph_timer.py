"""benchmarks/probe_graph_timer.py: its summary's arithmetic, and the run on a machine without CUDA."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import bench_module, doctest_results

probe = bench_module("probe_graph_timer")


def test_summary_examples():
    res = doctest_results(probe.summarize)
    assert res and all(failed == 0 for _, failed in res)
    assert sum(n for n, _ in res) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: says it needs a CUDA GPU")
def test_without_cuda_says_so(tmp_path):
    probe.main(["--out", str(tmp_path / "p.json")])
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["skipped"] == "needs a CUDA GPU (graph timing)" and doc["keys"] == [] and "env" in doc
