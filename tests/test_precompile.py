"""Compiling Triton configs ahead of their trials: ``FastKernel`` under ``precompiling`` and
``autotune.precompile`` (the sweep's batching is tested in test_tuner.py). CPU: a stand-in JIT function and a
stand-in of Triton's ``AsyncCompileMode``; on a GPU, a real flash config compiled ahead and then launched."""

from __future__ import annotations

import pytest
import torch

from attntune.autotune import gate, precompile as pc
from attntune.kernels import registry, triton_launch
from attntune.kernels.triton_launch import FastKernel, precompiling
from attntune.problem import AttentionProblem


class FakeJit:
    """Records launches (``fn[grid](...)``) and warm-ups (``fn.warmup(...)``)."""

    def __init__(self):
        self.launches, self.warmups = [], []

    def __getitem__(self, grid):
        def launch(*args, **opts):
            self.launches.append((grid, args, opts))
            return object()  # not a usable CompiledKernel: FastKernel keeps Triton's path

        return launch

    def warmup(self, *args, grid, **opts):
        self.warmups.append((grid, args, opts))


class FakeAsyncMode:
    """Triton's AsyncCompileMode as a context manager over an executor (3.4/3.5 signature: no kwargs)."""

    entered = []

    def __init__(self, executor):
        self.executor = executor

    def __enter__(self):
        FakeAsyncMode.entered.append(self.executor)
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def async_mode(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_launch, "_async_compile_mode", lambda: FakeAsyncMode)
    FakeAsyncMode.entered.clear()
    return FakeAsyncMode


def test_launches_inside_precompiling_are_warmups_and_nothing_runs(async_mode):
    fn = FakeJit()
    fk = FastKernel(fn)
    with precompiling(3) as active:
        assert active
        fk(("k",), (5, 1, 1), (1, 2), 4, 2, 0)
        fk(("k",), (5, 1, 1), (1, 2), 8, None, 0, {"num_warps": 8, "waves_per_eu": 2})
    assert fn.launches == [] and fk._compiled == {}
    assert fn.warmups == [((5, 1, 1), (1, 2), {"num_warps": 4, "num_stages": 2}),
                          ((5, 1, 1), (1, 2), {"num_warps": 8, "waves_per_eu": 2})]
    assert len(async_mode.entered) == 1 and async_mode.entered[0]._max_workers == 3
    fk(("k",), (5, 1, 1), (1, 2), 4, 2, 0)  # after the block: a real launch again
    assert len(fn.launches) == 1 and len(fn.warmups) == 2


@pytest.mark.parametrize("why", ["no-async-mode", "interpreter", "no-workers"])
def test_precompiling_changes_nothing_where_it_cannot_compile_ahead(async_mode, monkeypatch, why):
    if why == "no-async-mode":
        monkeypatch.setattr(triton_launch, "_async_compile_mode", lambda: None)
    if why == "interpreter":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    fn = FakeJit()
    with precompiling(0 if why == "no-workers" else 2) as active:
        assert not active
        FastKernel(fn)(("k",), (1, 1, 1), (), 4, 1, 0)
    assert len(fn.launches) == 1 and fn.warmups == [] and async_mode.entered == []


def test_the_installed_triton_has_an_async_compile_mode_taking_ignore_errors():
    pytest.importorskip("triton")
    mode = triton_launch._async_compile_mode()
    if mode is None:
        pytest.skip("this Triton has no triton.runtime._async_compile: precompiling is off (tested above)")
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        try:
            mode(pool, ignore_errors=True)
        except TypeError:
            mode(pool)  # Triton 3.4/3.5: precompiling takes this form


def _problem(device_type: str, mode: str = "fwd") -> AttentionProblem:
    return AttentionProblem(batch=1, heads_q=2, heads_kv=1, seqlen_q=67, seqlen_kv=67, head_dim=64, head_dim_v=64,
                            dtype="float16" if device_type == "cuda" else "float32", device_type=device_type,
                            causal=True, mode=mode)


def test_precompile_only_compiles_cuda_keys_of_precompiling_variants(monkeypatch, async_mode):
    calls = []
    monkeypatch.setattr(pc, "make_call", lambda v, c, inp, grads: (lambda: calls.append((v.name, c)), []))
    inputs = gate.prepare(_problem("cpu"), torch.device("cpu"), 0)
    flash, sdpa = registry.get("triton_flash"), registry.get("sdpa_default")
    assert flash.precompiles and not sdpa.precompiles
    # a CPU key: nothing (the interpreter compiles nothing ahead)
    assert pc.precompile([(flash, {})], inputs, False, 4) is None and calls == []

    class CudaInputs:  # the same inputs, seen as a CUDA key's
        device = torch.device("cuda")

    assert pc.precompile([(sdpa, {})], CudaInputs(), False, 4) is None  # no precompiling variant
    assert pc.precompile([(flash, {"BLOCK_M": 64})], CudaInputs(), False, 0) is None  # workers 0: off
    stats = pc.precompile([(sdpa, {}), (flash, {"BLOCK_M": 64}), (flash, {"BLOCK_M": 128})], CudaInputs(), False, 4)
    assert stats["configs"] == 2 and calls == [("triton_flash", {"BLOCK_M": 64}), ("triton_flash", {"BLOCK_M": 128})]

    def failing(v, c, inp, grads):
        raise RuntimeError("a config whose host path fails")

    monkeypatch.setattr(pc, "make_call", failing)  # never raises: the trial reports it
    assert pc.precompile([(flash, {"BLOCK_M": 64})], CudaInputs(), False, 4)["configs"] == 0


def test_default_workers_share_the_cores_between_worker_processes(monkeypatch):
    monkeypatch.setattr(pc.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert pc.default_workers() == 15 and pc.default_workers(2) == 7 and pc.default_workers(32) == 1
    monkeypatch.setattr(pc.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert pc.default_workers() == pc.MAX_DEFAULT_WORKERS


def test_run_tuning_compiles_ahead_on_gpus_only_by_default(monkeypatch, tmp_path):
    from attntune.autotune import runner

    seen = []
    monkeypatch.setattr(runner, "run_worker", lambda problems, **kw: seen.append(kw["options"].compile_workers) or [])
    runner.run_tuning([_problem("cpu")], cache=str(tmp_path / "c.db"), storage="memory")
    runner.run_tuning([_problem("cpu")], cache=str(tmp_path / "c.db"), storage="memory", compile_workers=3)
    assert seen == [0, 3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_gpu_configs_compiled_ahead_then_run_without_compiling(mode):
    """A real flash key: three configs compiled ahead on three threads (forward, and the backward's kernels for
    fwd_bwd); their launches then find every kernel compiled (no new compile) and pass the gate."""
    if triton_launch._async_compile_mode() is None:
        pytest.skip("this Triton has no async compile mode")
    from attntune.kernels.triton_flash import launch

    p = _problem("cuda", mode).model_copy(update={"seqlen_q": 1031, "seqlen_kv": 1031, "head_dim": 72,
                                                   "head_dim_v": 72})  # a shape no other test compiles
    inputs = gate.prepare(p, torch.device("cuda"), 0)
    flash = registry.get("triton_flash")
    configs = [{"BLOCK_M": bm, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "LOADS": 0}
               for bm in (32, 64, 128)]
    if mode == "fwd_bwd":
        configs = [dict(c, BLOCK_M=64, num_stages=2, BWD_BLOCK_M=bm, BWD_BLOCK_N=64, BWD_WARPS=4, BWD_STAGES=2)
                   for c, bm in zip(configs, (16, 32, 64))]
    kernels = (launch._FWD, launch._PRE, launch._DKDV, launch._DQ) if mode == "fwd_bwd" else (launch._FWD,)

    def cached():
        return sum(len(c[0]) for k in kernels for c in k.fn.device_caches.values())

    before = cached()
    stats = pc.precompile([(flash, c) for c in configs], inputs, mode == "fwd_bwd", 3)
    assert stats["configs"] == 3
    after = cached()
    assert after > before
    for c in configs:
        assert gate.check(flash, c, inputs).ok
    assert cached() == after  # every launch found its kernel compiled ahead


def test_bench_tune_time_smoke(tmp_path):
    """benchmarks/bench_tune_time.py on one tiny CPU key: both runs finish and the JSON has its summary."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_tune_time

    out = tmp_path / "t.json"
    assert bench_tune_time.main(["--smoke", "--out", str(out), "--trials", "1"]) == 0
    doc = json.loads(out.read_text())
    assert doc["summary"]["keys"] == 1 and doc["summary"]["both_ok"]
    assert [r["workers"] for r in doc["runs"]] == [0, None] and all(len(r["keys"]) == 1 for r in doc["runs"])
