"""benchmarks/probe_graph_timer.py: its summary's arithmetic, and the run on a machine without CUDA."""

from __future__ import annotations

import doctest
import json

import pytest
import torch

from helpers import bench_module

probe = bench_module("probe_graph_timer")


def test_summary_examples():
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    tests = finder.find(probe.summarize, "summarize", globs={"summarize": probe.summarize})
    assert tests and all(runner.run(t).failed == 0 for t in tests)
    assert sum(len(t.examples) for t in tests) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: says it needs a CUDA GPU")
def test_without_cuda_says_so(tmp_path):
    probe.main(["--out", str(tmp_path / "p.json")])
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["skipped"] == "needs a CUDA GPU (graph timing)" and doc["keys"] == [] and "env" in doc
