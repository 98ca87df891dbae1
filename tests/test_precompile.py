"""benchmarks/precompile.py: candidates run once in spawned worker processes (counts come back), only
compiling families are sent, and a deadline terminates the pool so nothing runs on when it returns."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers import bench_module, doctest_results

from attntune.problem import AttentionProblem

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def precompile():
    return bench_module("precompile")  # it keeps benchmarks/ on sys.path: spawned workers import it by name


def _cpu_problem(**kw) -> AttentionProblem:
    return AttentionProblem(batch=1, heads_q=3, heads_kv=1, seqlen_q=7, seqlen_kv=13, head_dim=8, head_dim_v=8,
                            dtype="float32", device_type="cpu", **kw)


def test_workers_run_each_task_and_report_failures(precompile):
    p, q = _cpu_problem(causal=True), _cpu_problem(mode="fwd_bwd")
    tasks = [(p, "eager", {}), (p, "no_such_variant", {}), (q, "eager", {})]
    with precompile.Precompiler("cpu", workers=2) as pre:
        out = pre.compile(tasks, deadline=time.time() + 240)
        # the pool is kept for the next key
        again = pre.compile([(p, "eager", {})], deadline=time.time() + 240)
    assert out["complete"] and out["done"] == 3 and out["ok"] == 2 and out["failed"] == 1, out
    assert out["errors"] and "no_such_variant" in out["errors"][0]
    assert again["ok"] == 1 and again["complete"]


def test_a_passed_deadline_cancels_what_has_not_started_and_keeps_the_pool(precompile):
    p = _cpu_problem()
    pre = precompile.Precompiler("cpu", workers=1).start()
    try:
        out = pre.compile([(p, "eager", {})] * 3, deadline=time.time() - 1)
        # every task came back (none runs on after the call) and none of them ran
        assert not out["complete"] and out["cancelled"] == 3 and out["done"] == 0, out
        assert pre._pool is not None and not out.get("terminated")
        out = pre.compile([(p, "eager", {})], deadline=time.time() + 240)  # the same pool, uncancelled
        assert out["complete"] and out["ok"] == 1 and out["cancelled"] == 0, out
    finally:
        pre.close()


def test_a_task_outliving_the_drain_terminates_the_pool(precompile, monkeypatch):
    p = _cpu_problem(mode="fwd_bwd")
    # a task that cannot finish in 1 s on any CPU (~10 s here): new inputs with a float64 reference forward
    # and backward over 8 x 3072 x 3072 scores (~20 GFLOP), which the worker must prepare first; the idle
    # worker takes it within milliseconds, long before the deadline
    slow = AttentionProblem(batch=1, heads_q=8, heads_kv=8, seqlen_q=3072, seqlen_kv=3072, head_dim=64,
                            head_dim_v=64, dtype="float32", device_type="cpu", mode="fwd_bwd")
    pre = precompile.Precompiler("cpu", workers=1).start()
    monkeypatch.setattr(pre, "DRAIN_S", 0.0)
    try:
        pre.compile([(p, "eager", {})], deadline=time.time() + 240)  # the worker is up
        out = pre.compile([(slow, "eager", {})] * 2, deadline=time.time() + 1.0)
        assert not out["complete"] and out.get("terminated") and pre._pool is None, out
        assert pre.compile([(p, "eager", {})], deadline=time.time() + 240)["ok"] == 1  # a new pool
    finally:
        pre.close()


def test_only_compiling_families_are_sent(precompile):
    from attntune.kernels import registry

    p = _cpu_problem()
    names = ["eager", "sdpa_default", "triton_flash", "triton_decode", "flex", "gone"]
    sent = {name for _, name, _ in precompile.compiled_tasks(p, [(n, {}) for n in names])}
    assert sent == {n for n in names if registry.exists(n) and registry.get(n).family in ("triton", "flex")}
    assert {"triton_flash", "triton_decode"} <= sent and not sent & {"eager", "sdpa_default", "gone"}


def test_worker_count_is_bounded(precompile):
    assert 1 <= precompile.default_workers() <= 12
    with pytest.raises(ValueError, match="workers"):
        precompile.Precompiler("cpu", workers=0)


def test_workers_that_cannot_start_disable_the_precompiler_at_once(precompile):
    # a device this machine cannot open (no CUDA here, or no 100th GPU): the initializer must not raise —
    # a pool respawns raising workers forever, and every call waited out its deadline with nothing done
    p = _cpu_problem()
    t0 = time.time()
    with precompile.Precompiler("cuda:99", workers=2).start() as pre:
        assert pre.disabled and "worker start" in pre.disabled and pre._pool is None
        out = pre.compile([(p, "eager", {})] * 4, deadline=time.time() + 240)
    assert not out["complete"] and out["disabled"] == pre.disabled and out["done"] == 0, out
    assert time.time() - t0 < 120


def test_a_worker_that_dies_while_starting_disables_the_precompiler(precompile, monkeypatch):
    # a worker that cannot even import its module (here: the folder is not on the path it inherits, which
    # start() normally ensures) dies before its initializer; the pool would respawn it forever
    import sys

    monkeypatch.setattr(precompile, "_HERE", "/nonexistent")
    monkeypatch.setattr(precompile.Precompiler, "START_S", 5.0)
    monkeypatch.setattr(sys, "path", [x for x in sys.path if x != str(BENCH)])
    with precompile.Precompiler("cpu", workers=1).start() as pre:
        assert pre.disabled and "no worker answered" in pre.disabled and pre._pool is None


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the Triton kernels on the CPU: needs "
                    "the interpreter (on a GPU the regret run exercises this path)")
def test_triton_candidates_of_a_reference_list_run_in_the_workers(precompile):
    # the regret script's own list (reference_configs) through compiled_tasks: forward and training keys
    regret = bench_module("regret")
    for p in (_cpu_problem(causal=True), _cpu_problem(mode="fwd_bwd", window=(5, 0))):
        listed, _ = regret.reference_configs(p, 2, [], seed=1)
        tasks = precompile.compiled_tasks(p, listed)
        names = {name for _, name, _ in tasks}
        assert "triton_flash" in names and names <= {"triton_flash", "triton_local", "triton_decode", "flex"}
        with precompile.Precompiler("cpu", workers=2) as pre:
            out = pre.compile(tasks, deadline=time.time() + 240)
        assert out["complete"] and out["ok"] == len(tasks), out


def test_no_task_starts_that_would_end_past_the_deadline(precompile):
    """The examples in stop_starting's docstring."""
    res = doctest_results(precompile.stop_starting)
    assert res and all(failed == 0 for _, failed in res)
    assert sum(n for n, _ in res) == 3


def test_tasks_of_a_problem_run_only_as_many_at_once_as_fit_in_memory(precompile, monkeypatch):
    # 12 workers each running a B32 x 8192 decode task at once ran an H100 out of memory (2026-12-07)
    p = _cpu_problem()
    with precompile.Precompiler("cpu", workers=2) as pre:
        roomy = pre.compile([(p, "eager", {})] * 4, deadline=time.time() + 240)
        # a device with room for less than one task's footprint: one at a time, all still done
        monkeypatch.setattr(pre, "free_bytes", lambda: precompile.footprint_estimate(p) // 2)
        tight = pre.compile([(p, "eager", {})] * 4, deadline=time.time() + 240)
    assert roomy["complete"] and roomy["ok"] == 4 and roomy["most_at_once"] == 2, roomy
    assert tight["complete"] and tight["ok"] == 4 and tight["most_at_once"] == 1, tight


def test_a_worker_drops_inputs_too_large_to_hold_while_idle(precompile):
    p = _cpu_problem(mode="fwd_bwd")
    with precompile.Precompiler("cpu", workers=1) as pre:
        assert pre.compile([(p, "eager", {})], deadline=time.time() + 240)["ok"] == 1
        held = pre._pool.apply(precompile._held_bytes)
        pre.KEEP_INPUTS_BYTES = held - 1  # these inputs are now "too large"
        assert pre.compile([(p, "eager", {})], deadline=time.time() + 240)["ok"] == 1
        dropped = pre._pool.apply(precompile._held_bytes)
    # q, k, v, dout, the reference output and its three gradients (float64 on a CPU) were kept, then not
    assert held > 7 * 13 * 8 and dropped == 0, (held, dropped)


def test_memory_bounds_of_compiling_ahead(precompile):
    """The examples in footprint_estimate's and parallel_limit's docstrings."""
    for fn, n in ((precompile.footprint_estimate, 3), (precompile.parallel_limit, 3)):
        res = doctest_results(fn)
        assert res and all(failed == 0 for _, failed in res) and sum(k for k, _ in res) == n, fn.__name__
