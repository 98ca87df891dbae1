"""benchmarks/probe_pdl.py: its kernels compile for sm_90 on a machine without that GPU, with the grid-dependency
instructions exactly where PDL asks for them (the timing itself needs a GPU)."""
from __future__ import annotations

import json

import pytest
from helpers import bench_module


def test_pdl_kernels_compile_for_sm90_with_griddepcontrol_only_under_pdl(capsys):
    pytest.importorskip("triton.language.extra.cuda")
    probe = bench_module("probe_pdl")
    probe.main(["--ptx"])
    counts = json.loads(capsys.readouterr().out)
    assert counts["pdl=0"] == {"stream_launch_dependents": 0, "reduce_wait": 0}, counts
    assert counts["pdl=1"] == {"stream_launch_dependents": 1, "reduce_wait": 1}, counts


def test_without_a_gpu_the_timing_says_so(monkeypatch):
    probe = bench_module("probe_pdl")
    monkeypatch.setattr(probe.torch.cuda, "is_available", lambda: False)  # as on a CPU machine, GPU or not
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        probe.main([])
