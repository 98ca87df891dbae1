"""The autotuner on the CPU: suites → gate → timing → optuna → cache, resume, workers, CLI."""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from datetime import timedelta

import optuna
import pytest
import torch
from typer.testing import CliRunner

from attntune.autotune import gate
from attntune.autotune import claims
from attntune.autotune.runner import run_tuning, run_worker, tune, tune_one
from attntune.autotune.shapes import ShapeSpecError, parse_shape
from attntune.autotune.space import SearchSpace, config_id
from attntune.autotune.study import default_storage_url
from attntune.autotune.sweep import LOCAL_SHARE, SweepOptions
from attntune.autotune.suites import SUITES, materialize
from attntune.autotune.timing import TimingOptions
from attntune.cache import CacheStore, WinnerRecord, judge, utcnow
from attntune.cache.models import record_to_row
from attntune.cli import app
from attntune.device import DeviceFingerprint, SoftwareFingerprint, device_fingerprint, software_fingerprint
from attntune.kernels import registry
from attntune.kernels.base import Param, Space, Variant
from attntune.kernels.reference import masked_softmax_attention
from attntune.key import TuneKey
from attntune.problem import AttentionProblem

BUILTIN = "eager,sdpa_default,sdpa_flash,sdpa_math"
QUICK = TimingOptions.quick()
runner = CliRunner()


@pytest.fixture(autouse=True)
def _builtin_candidates(monkeypatch):
    # Only the CPU torch variants (plus a test's own): variants other modules add (Triton under the
    # interpreter) would make these tests slow and their outcomes depend on unrelated code.
    monkeypatch.setenv("ATTNTUNE_VARIANTS", BUILTIN)


def allow(monkeypatch, *names):
    monkeypatch.setenv("ATTNTUNE_VARIANTS", ",".join([BUILTIN, *names]))


def prob(b=2, hq=4, hkv=4, sq=64, skv=64, d=32, **kw) -> AttentionProblem:
    return AttentionProblem(
        batch=b,
        heads_q=hq,
        heads_kv=hkv,
        seqlen_q=sq,
        seqlen_kv=skv,
        head_dim=d,
        head_dim_v=d,
        dtype="float32",
        device_type="cpu",
        **kw,
    )


def key_of(p: AttentionProblem) -> TuneKey:
    return TuneKey.from_problem(p, device_fingerprint("cpu"))


def sdpa_exact(q, k, v, problem, kv_lens=None):
    return masked_softmax_attention(q, k, v, problem, kv_lens).to(q.dtype)


class _TestVariant(Variant):
    family = "test"

    def supports(self, problem):
        return []


class Throws(_TestVariant):
    name = "t_throws"

    def run(self, q, k, v, problem, config, kv_lens=None):
        raise RuntimeError("boom from the kernel")


class Wrong(_TestVariant):
    name = "t_wrong"

    def run(self, q, k, v, problem, config, kv_lens=None):
        return sdpa_exact(q, k, v, problem, kv_lens) * 1.05


class Slow(_TestVariant):
    name = "t_slow"

    def run(self, q, k, v, problem, config, kv_lens=None):
        time.sleep(0.05)
        return sdpa_exact(q, k, v, problem, kv_lens)


class Unwritten(_TestVariant):
    """Takes ``out=`` and forgets to write the last query row."""

    name = "t_unwritten"

    def run(self, q, k, v, problem, config, kv_lens=None, out=None):
        res = sdpa_exact(q, k, v, problem, kv_lens)
        out[:, :, :-1] = res[:, :, :-1]
        return out


class BadSpace(_TestVariant):
    name = "t_bad_space"

    def space(self, problem):
        raise ValueError("no space for you")

    def run(self, q, k, v, problem, config, kv_lens=None):
        raise AssertionError("never run: its space() fails")


class IgnoresLens(_TestVariant):
    """Attends over the whole KV tensor: the padding leaks."""

    name = "t_ignores_lens"

    def run(self, q, k, v, problem, config, kv_lens=None):
        return sdpa_exact(q, k, v, problem, None)


class _DoubleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return 2 * g


class WrongGrad(_TestVariant):
    name = "t_wrong_grad"

    def run(self, q, k, v, problem, config, kv_lens=None):
        return _DoubleGrad.apply(sdpa_exact(q, k, v, problem, kv_lens))


class Approx(_TestVariant):
    name = "t_approx"
    exact = False

    def run(self, q, k, v, problem, config, kv_lens=None):
        return sdpa_exact(q, k, v, problem, kv_lens) * 1.02


class Tunable(_TestVariant):
    """A variant with a conditional space: 4*4*4 = 64 raw configs, those with a*b > 8 invalid."""

    name = "t_tunable"
    calls: Counter = Counter()

    def space(self, problem):
        return Space(
            params=(Param("a", (1, 2, 4, 8)), Param("b", (1, 2, 4, 8)), Param("c", (0, 1, 2, 3))),
            constraint=lambda cfg: [f"a*b={cfg['a'] * cfg['b']} > 8"] if cfg["a"] * cfg["b"] > 8 else [],
            default={"a": 2, "b": 2, "c": 0},
        )

    def run(self, q, k, v, problem, config, kv_lens=None):
        Tunable.calls[json.dumps(config, sort_keys=True)] += 1
        return sdpa_exact(q, k, v, problem, kv_lens)


class Interrupter(_TestVariant):
    """Correct, but raises KeyboardInterrupt (as Ctrl-C would) on the ``at``-th key it sees when armed."""

    name = "t_interrupter"
    armed = False
    at = 3
    seen: list = []

    def run(self, q, k, v, problem, config, kv_lens=None):
        if problem not in Interrupter.seen:
            Interrupter.seen.append(problem)
        if Interrupter.armed and len(Interrupter.seen) == Interrupter.at:
            Interrupter.armed = False
            raise KeyboardInterrupt
        time.sleep(0.02)  # never the winner, so never a neighbour's warm start: it runs last in every key
        return sdpa_exact(q, k, v, problem, kv_lens)


@pytest.fixture
def register():
    added = []

    def add(*variants):
        for v in variants:
            registry.register(v)
            added.append(v.name)

    yield add
    for name in added:
        registry.unregister(name)


def trials_by_variant(store: CacheStore, key: TuneKey) -> dict:
    return {t["variant"]: t for t in store.trials(key.key_id)}


def measured_counts(storage_url: str, key: TuneKey) -> Counter:
    """How many times each (variant, config) of the key was measured, from the optuna storage."""
    study = optuna.load_study(study_name=key.key_id, storage=storage_url)
    c: Counter = Counter()
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("measured"):
            c[t.user_attrs["variant"] + t.user_attrs["config"]] += 1
    return c


# ---- a full tune through the CLI ------------------------------------------------------------------


def test_cli_tune_suite_writes_valid_winners_that_show_lists(tmp_path):
    cache = str(tmp_path / "c.db")
    res = runner.invoke(app, ["tune", "--suite", "demo", "--cache", cache, "--device", "cpu", "--quick"])
    assert res.exit_code == 0, res.output
    n = len(SUITES["demo"].templates())
    assert f"{n} keys tuned" in res.output
    res = runner.invoke(app, ["show", "--json", "--cache", cache])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert len(rows) == n and all(r["status"] == "valid" for r in rows)
    store = CacheStore(cache)
    for raw in store.raw_winners():
        rec = judge(raw, "user").record
        assert rec.variant in BUILTIN.split(",")
        assert rec.trials == 4 and rec.median_ms > 0 and rec.max_error < 1e-5
        assert rec.rel_error is not None and rec.rel_error < 1e-5
        assert rec.sdpa_default_ms is not None and rec.runner_up is not None and rec.runner_up != rec.variant
        p = rec.key.representative()
        assert rec.tflops == pytest.approx(p.flops() / (rec.median_ms * 1e-3) / 1e12)
        for t in store.trials(rec.key_id):  # the CPU torch variants are all correct: ok, or slower
            assert t["status"] == "ok" or (
                t["status"] == "pruned" and t["reason"].startswith("early stop")
            ), t
    # the optuna studies sit next to the cache, one per key, openable as plain RDB storage
    assert default_storage_url(cache).endswith("/optuna.db")
    assert len(optuna.get_all_study_summaries(default_storage_url(cache))) == n
    # a rerun keeps every finished key
    res = runner.invoke(app, ["tune", "--suite", "demo", "--cache", cache, "--device", "cpu", "--quick"])
    assert res.exit_code == 0 and f"0 keys tuned, {n} already valid" in res.output, res.output


# ---- losing for the right reason ------------------------------------------------------------------


def test_bad_variants_lose_for_the_recorded_reason(tmp_path, monkeypatch, register):
    register(Throws(), Wrong(), Slow(), Unwritten(), BadSpace())
    allow(monkeypatch, "t_throws", "t_wrong", "t_slow", "t_unwritten", "t_bad_space")
    store = CacheStore(tmp_path / "c.db")
    p = prob(causal=True)
    [rec] = tune([p], cache=store, timing=QUICK)
    assert rec.variant in BUILTIN.split(",")
    t = trials_by_variant(store, key_of(p))
    assert t["t_throws"]["status"] == "failed" and "boom from the kernel" in t["t_throws"]["reason"]
    assert t["t_wrong"]["status"] == "wrong" and "outside atol" in t["t_wrong"]["reason"]
    assert t["t_unwritten"]["status"] == "wrong" and "NaN" in t["t_unwritten"]["reason"]
    assert t["t_slow"]["status"] == "pruned" and "early stop" in t["t_slow"]["reason"]
    assert t["t_slow"]["median_ms"] >= 50  # the cheap measurement that pruned it
    assert t["t_bad_space"]["status"] == "failed" and "no space for you" in t["t_bad_space"]["reason"]
    assert rec.trials == 8  # 4 builtin + 4 test variants, each measured once


def test_runner_up_falls_back_to_an_early_stopped_variant(tmp_path, monkeypatch, register):
    register(Slow())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "sdpa_default,t_slow")
    [rec] = tune([prob()], cache=CacheStore(tmp_path / "c.db"), timing=QUICK)
    assert rec.variant == "sdpa_default" and rec.sdpa_default_ms == rec.median_ms
    assert rec.runner_up == "t_slow" and rec.runner_up_config == {} and rec.runner_up_ms >= 50


def test_gate_catches_leaking_padding_and_wrong_gradients(tmp_path, monkeypatch, register):
    register(IgnoresLens(), WrongGrad())
    allow(monkeypatch, "t_ignores_lens", "t_wrong_grad")
    store = CacheStore(tmp_path / "c.db")
    decode = prob(b=4, hq=4, hkv=2, sq=1, skv=64, kv_lens=True)
    train = prob(sq=32, skv=32, causal=True, mode="fwd_bwd")
    recs = tune([decode, train], cache=store, timing=QUICK)
    assert len(recs) == 2
    t = trials_by_variant(store, key_of(decode))
    assert t["t_ignores_lens"]["status"] == "wrong", t["t_ignores_lens"]
    assert t["t_wrong_grad"]["status"] in ("ok", "pruned")  # forward-only key: its forward passes the gate
    t = trials_by_variant(store, key_of(train))
    assert t["t_wrong_grad"]["status"] == "wrong" and "dq:" in t["t_wrong_grad"]["reason"]
    assert "dv:" in t["t_wrong_grad"]["reason"]


def test_approximate_variants_only_when_allowed_and_record_their_error(tmp_path, monkeypatch, register):
    register(Approx())
    allow(monkeypatch, "t_approx")
    store = CacheStore(tmp_path / "c.db")
    exact_p, approx_p = prob(), prob(approx=True)
    tune([exact_p, approx_p], cache=store, timing=QUICK)
    assert "t_approx" not in trials_by_variant(store, key_of(exact_p))
    t = trials_by_variant(store, key_of(approx_p))["t_approx"]
    assert t["status"] in ("ok", "pruned")  # passed the gate (then maybe slower than the rest)
    rel = float(re.search(r"approximate: relative error (\S+)", t["reason"]).group(1))
    assert rel == pytest.approx(0.02, rel=1e-3)


def test_large_space_uses_tpe_prunes_invalid_configs_and_never_measures_twice(
    tmp_path, monkeypatch, register
):
    register(Tunable())
    Tunable.calls.clear()
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "sdpa_default,t_tunable")
    store = CacheStore(tmp_path / "c.db")
    p = prob()
    [rec] = tune([p], cache=store, trials=10, timing=QUICK, refine=0)  # the budget alone (refine: below)
    assert rec.trials == 11  # the budget is for the tunable variant; the fixed sdpa_default is on top
    rows = store.trials(key_of(p).key_id)
    measured = [r for r in rows if r["status"] != "pruned" or (r["reason"] or "").startswith("early stop")]
    assert len(measured) == 11 and sum(r["variant"] == "t_tunable" for r in measured) == 10
    ids = [config_id(r["variant"], json.loads(r["config_json"])) for r in measured]
    assert len(set(ids)) == len(ids)
    for r in rows:
        cfg = json.loads(r["config_json"])
        if r["variant"] == "t_tunable" and cfg["a"] * cfg["b"] > 8:
            assert r["status"] == "pruned" and r["reason"].startswith("invalid config"), r
    # the gate runs each measured config once and timing a few times; invalid configs never run
    assert all(json.loads(c)["a"] * json.loads(c)["b"] <= 8 for c in Tunable.calls)
    assert {"a": 2, "b": 2, "c": 0} in [json.loads(r["config_json"]) for r in measured]  # the default first


def test_moves_are_the_valid_one_step_neighbours(register, monkeypatch):
    register(Tunable())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "t_tunable")
    space = SearchSpace(prob())
    got = space.moves("t_tunable", {"a": 2, "b": 2, "c": 0})
    # a 1|4, b 1|4, c 1 (c has no value below 0); a=4,b=4 would be invalid but needs two steps
    assert sorted(map(json.dumps, got)) == sorted(map(json.dumps, [
        {"a": 1, "b": 2, "c": 0}, {"a": 4, "b": 2, "c": 0}, {"a": 2, "b": 1, "c": 0}, {"a": 2, "b": 4, "c": 0},
        {"a": 2, "b": 2, "c": 1}]))
    assert space.moves("t_tunable", {"a": 8, "b": 1, "c": 3}) == [{"a": 4, "b": 1, "c": 3}, {"a": 8, "b": 1, "c": 2}]
    assert space.moves("nope", {"a": 1}) == []


def test_the_budget_tail_refines_the_incumbent_by_one_step_moves(tmp_path, monkeypatch, register):
    """Every config costs a fixed virtual time far apart from the others (1 s steps, a seeded order), so
    which config is the incumbent never depends on this machine's noise: with real timings of equal
    kernels a loaded CPU reordered them and the run went another way (a flaky failure)."""
    from attntune.autotune import timing

    register(Tunable())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "t_tunable")
    valid = [{"a": a, "b": b, "c": c} for a in (1, 2, 4, 8) for b in (1, 2, 4, 8) for c in range(4) if a * b <= 8]
    random.Random(0).shuffle(valid)
    # 1 s apart (virtual: nothing sleeps): far beyond the real time a loaded CPU adds to each timing (20 ms
    # steps were overrun on a busy CI machine)
    cost_s = {json.dumps(c, sort_keys=True): 0.001 + 1.0 * i for i, c in enumerate(valid)}
    virtual = {"s": 0.0}
    real_run = Tunable.run

    def run(self, q, k, v, problem, config, kv_lens=None):
        virtual["s"] += cost_s[json.dumps(config, sort_keys=True)]
        return real_run(self, q, k, v, problem, config, kv_lens)

    monkeypatch.setattr(Tunable, "run", run)
    monkeypatch.setattr(timing, "CLOCK", lambda: time.perf_counter() + virtual["s"])
    store = CacheStore(tmp_path / "c.db")
    p = prob()
    [rec] = tune([p], cache=store, trials=9, timing=QUICK, refine=0)  # the budget alone (refine: below)
    study = optuna.load_study(study_name=key_of(p).key_id, storage=default_storage_url(store.url))
    done = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("measured")]
    assert len(done) == 9 and rec.trials == 9
    for t in done:  # the timer ran on the virtual clock: each value is its config's cost (+ real noise)
        if t.state == optuna.trial.TrialState.COMPLETE:
            cost_ms = 1e3 * cost_s[json.dumps(space_cfg(t), sort_keys=True)]
            assert cost_ms <= t.value < cost_ms + 500, (t.value, cost_ms)
    space = SearchSpace(p)
    local_n = int(9 * LOCAL_SHARE)
    assert local_n == 3
    for i in range(len(done) - local_n, len(done)):
        before = [t for t in done[:i] if t.state == optuna.trial.TrialState.COMPLETE]
        best = min(before, key=lambda t: t.value)
        _, best_cfg = space.from_params(best.params)
        _, cfg = space.from_params(done[i].params)
        assert cfg in space.moves("t_tunable", best_cfg), (i, cfg, best_cfg)
    ids = [config_id(*space.from_params(t.params)) for t in done]
    assert len(set(ids)) == len(ids)  # never a config twice


class TunableSibling(Tunable):
    """Tunable's knobs and space under another name: a sibling variant (one kernel, another schedule)."""

    name = "t_tunable_sibling"


class TunableOther(_TestVariant):
    """A tunable variant with other knobs: never a sibling of Tunable."""

    name = "t_tunable_other"

    def space(self, problem):
        return Space(params=(Param("a", (1, 2, 4, 8)), Param("z", (0, 1))), default={"a": 2, "z": 0})

    def run(self, q, k, v, problem, config, kv_lens=None):
        return sdpa_exact(q, k, v, problem, kv_lens)


def test_siblings_are_the_same_config_on_variants_with_the_same_knobs(register, monkeypatch):
    register(Tunable(), TunableSibling(), TunableOther())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "sdpa_default,t_tunable,t_tunable_sibling,t_tunable_other")
    space = SearchSpace(prob())
    cfg = {"a": 2, "b": 4, "c": 1}
    assert space.siblings("t_tunable", cfg) == [("t_tunable_sibling", cfg)]
    assert space.siblings("t_tunable_sibling", cfg) == [("t_tunable", cfg)]
    assert space.siblings("t_tunable", {"a": 4, "b": 4, "c": 0}) == []  # invalid there too (a*b > 8)
    assert space.siblings("t_tunable_other", {"a": 2, "z": 0}) == []
    assert space.siblings("sdpa_default", {}) == [] and space.siblings("nope", cfg) == []


class TileWarps(_TestVariant):
    """A tile knob and warps whose cost needs both to move together: balanced configs (BLOCK_N = 32 *
    num_warps) are fast and faster with bigger tiles, every unbalanced one is slow."""

    name = "t_tile_warps"
    virtual = {"s": 0.0}

    def space(self, problem):
        return Space(params=(Param("BLOCK_N", (32, 64, 128, 256)), Param("num_warps", (1, 2, 4, 8)),
                             Param("num_stages", (1, 2))), default={"BLOCK_N": 32, "num_warps": 1, "num_stages": 1})

    @staticmethod
    def cost_s(cfg) -> float:
        balanced = cfg["BLOCK_N"] == 32 * cfg["num_warps"]
        # virtual seconds, far apart (a loaded CPU adds real milliseconds to every timing)
        return (1.0 + 8.0 * 32 / cfg["BLOCK_N"] if balanced else 30.0) + 0.5 * cfg["num_stages"]

    def run(self, q, k, v, problem, config, kv_lens=None):
        TileWarps.virtual["s"] += self.cost_s(config)
        return sdpa_exact(q, k, v, problem, kv_lens)


def test_moves_make_auto_adjacent_to_every_concrete_value(monkeypatch):
    """The decode op's "auto" splits and stages (0) resolve per call to any count: from auto every concrete
    count is one move away, and auto from each of them (the H200's 3.5 % regret key: auto splits, resolved
    to 4, against the reference's 8 — two moves in declaration order, 0 -> 1 -> 2 ... before)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton_decode is a candidate on the CPU only interpreted
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "triton_decode")
    space = SearchSpace(prob(b=8, hq=32, hkv=8, sq=1, skv=1024, d=64))
    start = {"BLOCK_N": 64, "num_splits": 0, "num_warps": 2, "num_stages": 0}
    moves = space.moves("triton_decode", start)
    splits = {m["num_splits"] for m in moves if {**m, "num_splits": 0} == start}
    assert splits == {1, 2, 4, 8, 16, 32, 64}
    stages = {m["num_stages"] for m in moves if {**m, "num_stages": 0} == start}
    assert stages == {1, 2, 3, 4}  # every count fits 64-key fp32 tiles at D=64
    back = space.moves("triton_decode", {**start, "num_splits": 16})
    assert {**start, "num_splits": 0} in back and {**start, "num_splits": 8} in back
    assert len(moves) == len({json.dumps(m, sort_keys=True) for m in moves})  # no move listed twice


def test_moves_step_a_tile_and_its_warps_together(register, monkeypatch):
    register(TileWarps())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "t_tile_warps")
    space = SearchSpace(prob())
    moves = space.moves("t_tile_warps", {"BLOCK_N": 64, "num_warps": 2, "num_stages": 1})
    pairs = {(m["BLOCK_N"], m["num_warps"], m["num_stages"]) for m in moves}
    assert pairs == {(32, 2, 1), (128, 2, 1), (64, 1, 1), (64, 4, 1), (64, 2, 2),  # one knob
                     (128, 4, 1), (32, 1, 1)}  # the coupled steps
    edge = space.moves("t_tile_warps", {"BLOCK_N": 256, "num_warps": 4, "num_stages": 1})
    # at the end of BLOCK_N's domain the coupled step goes down only (no 512 with 8 warps)
    assert {(m["BLOCK_N"], m["num_warps"], m["num_stages"]) for m in edge} == {
        (128, 4, 1), (256, 2, 1), (256, 8, 1), (256, 4, 2), (128, 2, 1)}


class RowTile(_TestVariant):
    """A forward's row tile, warps and stages: the default's coupled step down (64 rows, 4 warps) is the one
    fast config; every other one, the default's single-knob neighbours included, is slow."""

    name = "t_row_tile"
    virtual = {"s": 0.0}
    BEST = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 3}

    def space(self, problem):
        return Space(params=(Param("BLOCK_M", (32, 64, 128)), Param("num_warps", (2, 4, 8)),
                             Param("num_stages", (1, 2, 3, 4))),
                     default={"BLOCK_M": 128, "num_warps": 8, "num_stages": 3})

    def run(self, q, k, v, problem, config, kv_lens=None):
        RowTile.virtual["s"] += 1.0 if dict(config) == self.BEST else 30.0  # virtual seconds, far apart
        return sdpa_exact(q, k, v, problem, kv_lens)


def test_a_forward_that_leaves_units_idle_is_seeded_with_fewer_rows_and_warps(register, monkeypatch):
    register(RowTile())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "t_row_tile")
    small = prob(b=1, hq=4, hkv=4, sq=200, skv=300)  # ceil(200 / 128) * 1 * 4 = 8 programs at the default
    assert SearchSpace(small).occupancy_seeds(132) == [("t_row_tile", RowTile.BEST)]
    assert SearchSpace(small).occupancy_seeds(8) == []  # 8 programs fill 8 units
    assert SearchSpace(small).occupancy_seeds(None) == []  # a CPU: no units to fill
    assert SearchSpace(prob(b=1, hq=4, hkv=4, sq=200, skv=300, mode="fwd_bwd")).occupancy_seeds(132) == []
    # a decode row (or any Sq <= 64) is one program at 128 rows and at 64: halving the tile adds none
    assert SearchSpace(prob(b=1, hq=4, hkv=4, sq=1, skv=300)).occupancy_seeds(132) == []
    assert SearchSpace(prob(b=1, hq=4, hkv=4, sq=64, skv=300)).occupancy_seeds(132) == []


def test_the_tuner_measures_the_occupancy_seed_right_after_the_defaults(tmp_path, monkeypatch, register):
    """The chunked-prefill case of both cards' regret runs (the seed is the exhaustive best, two moves from the
    budget's winner): with a budget of two trials, the default and then the seed."""
    from attntune.autotune import sweep, timing

    register(RowTile())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "t_row_tile")
    monkeypatch.setattr(sweep, "parallel_units", lambda device: 132)
    RowTile.virtual["s"] = 0.0
    monkeypatch.setattr(timing, "CLOCK", lambda: time.perf_counter() + RowTile.virtual["s"])
    [rec] = tune([prob(b=1, hq=4, hkv=4, sq=200, skv=300)], cache=CacheStore(tmp_path / "c.db"), trials=2,
                 timing=QUICK, refine=0)
    assert rec.variant == "t_row_tile" and dict(rec.config) == RowTile.BEST, rec.config


@pytest.mark.parametrize("coupled", [True, False])
def test_refine_crosses_a_ridge_of_single_moves_by_coupled_steps(tmp_path, monkeypatch, register, coupled):
    """From the default (a balanced config), every single-knob move is slower: a climb of single moves stops
    there; with the coupled steps it walks the balanced ridge to the biggest tile, the true optimum."""
    from attntune.autotune import space as space_mod
    from attntune.autotune import timing

    if not coupled:
        monkeypatch.setattr(space_mod, "COUPLED", ())
    register(TileWarps())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "t_tile_warps")
    TileWarps.virtual["s"] = 0.0
    monkeypatch.setattr(timing, "CLOCK", lambda: time.perf_counter() + TileWarps.virtual["s"])
    [rec] = tune([prob()], cache=CacheStore(tmp_path / "c.db"), trials=1, timing=QUICK, refine=20)
    got = (rec.config["BLOCK_N"], rec.config["num_warps"], rec.config["num_stages"])
    assert got == ((256, 8, 1) if coupled else (32, 1, 1)), got


def _virtual_costs(monkeypatch, variants, seed: int) -> dict:
    """Every (variant, config) of Tunable's space costs a fixed virtual time, 1 s apart in a seeded
    order (see the refinement test above: real timings of equal kernels would make the test flaky)."""
    from attntune.autotune import timing

    valid = [(n, {"a": a, "b": b, "c": c}) for n in variants
             for a in (1, 2, 4, 8) for b in (1, 2, 4, 8) for c in range(4) if a * b <= 8]
    random.Random(seed).shuffle(valid)
    cost_s = {config_id(n, c): 0.001 + 1.0 * i for i, (n, c) in enumerate(valid)}  # 1 s apart: see above
    virtual = {"s": 0.0}
    real_run = Tunable.run

    def run(self, q, k, v, problem, config, kv_lens=None):
        virtual["s"] += cost_s[config_id(self.name, dict(config))]
        return real_run(self, q, k, v, problem, config, kv_lens)

    monkeypatch.setattr(Tunable, "run", run)
    monkeypatch.setattr(timing, "CLOCK", lambda: time.perf_counter() + virtual["s"])
    return cost_s


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_refine_climbs_to_a_local_optimum_over_moves_and_siblings(tmp_path, monkeypatch, register, seed):
    """``refine``: after the budget the tuner climbs until no one-step move of the winner, nor its config
    on the sibling variant, is untried — so the stored winner is a local optimum — within the extra trials."""
    register(Tunable(), TunableSibling())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "t_tunable,t_tunable_sibling")
    cost_s = _virtual_costs(monkeypatch, ("t_tunable", "t_tunable_sibling"), seed)
    store = CacheStore(tmp_path / "c.db")
    p = prob()
    [rec] = tune([p], cache=store, trials=6, timing=QUICK, refine=60)
    study = optuna.load_study(study_name=key_of(p).key_id, storage=default_storage_url(store.url))
    done = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("measured")]
    tried = {config_id(*SearchSpace(p).from_params(t.params)) for t in done}
    assert 6 < len(done) < 6 + 60 and rec.trials == len(done)  # it stopped at an optimum, not at the cap
    space = SearchSpace(p)
    neighbours = [(rec.variant, m) for m in space.moves(rec.variant, rec.config)]
    neighbours += space.siblings(rec.variant, rec.config)
    assert neighbours and all(config_id(*n) in tried for n in neighbours)
    assert all(cost_s[config_id(*n)] > cost_s[config_id(rec.variant, rec.config)] for n in neighbours)
    # without refine the same run measures exactly its budget
    (tmp_path / "off").mkdir()
    store0 = CacheStore(tmp_path / "off" / "c.db")  # its own optuna.db too (a study resumes by key)
    [rec0] = tune([p], cache=store0, trials=6, timing=QUICK, refine=0)
    assert rec0.trials == 6
    # and the default climbs (DEFAULT_REFINE): the same seeded run as an explicit refine=DEFAULT_REFINE
    from attntune.autotune.runner import DEFAULT_REFINE

    runs = {}
    for name, kw in (("default", {}), ("explicit", {"refine": DEFAULT_REFINE})):
        (tmp_path / name).mkdir()
        [runs[name]] = tune([p], cache=CacheStore(tmp_path / name / "c.db"), trials=6, timing=QUICK, **kw)
    assert DEFAULT_REFINE > 0 and runs["default"].trials == runs["explicit"].trials > 6
    assert cost_s[config_id(rec.variant, rec.config)] <= cost_s[config_id(rec0.variant, rec0.config)]


def space_cfg(trial) -> dict:
    """A measured trial's config, as the tuner recorded it."""
    return json.loads(trial.user_attrs["config"])


def test_warm_start_tries_the_nearest_tuned_neighbours_winners_first(tmp_path, monkeypatch, register):
    register(Tunable())
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "t_tunable")
    store = CacheStore(tmp_path / "c.db")
    fp = software_fingerprint(registry.get("t_tunable").source_hash(), "cpu")

    def winner(p, cfg):
        store.upsert_winner(
            WinnerRecord(
                key=key_of(p),
                variant="t_tunable",
                config=cfg,
                median_ms=1.0,
                fingerprint=fp,
                created_at=utcnow(),
            )
        )

    winner(prob(sq=64, skv=64), {"a": 1, "b": 8, "c": 3})  # nearest
    winner(prob(sq=16, skv=16), {"a": 8, "b": 1, "c": 2})  # next nearest
    winner(prob(sq=96, skv=96, causal=True), {"a": 4, "b": 2, "c": 1})  # other family: never a neighbour
    new = prob(sq=96, skv=96)
    tune([new], cache=store, trials=4, timing=QUICK)
    study = optuna.load_study(study_name=key_of(new).key_id, storage=default_storage_url(store.url))
    first = [json.loads(t.user_attrs["config"]) for t in study.get_trials(deepcopy=False)[:3]]
    assert first == [{"a": 1, "b": 8, "c": 3}, {"a": 8, "b": 1, "c": 2}, {"a": 2, "b": 2, "c": 0}]


# ---- resume -----------------------------------------------------------------------------------------


def test_interrupt_then_resume_tunes_each_key_once(tmp_path, monkeypatch, register):
    register(Interrupter())
    allow(monkeypatch, "t_interrupter")
    cache = str(tmp_path / "c.db")
    storage = default_storage_url(cache)
    problems = [prob(sq=s, skv=s) for s in (16, 32, 48, 64)]
    keys = [key_of(p) for p in problems]
    Interrupter.seen, Interrupter.armed, Interrupter.at = [], True, 3
    res = runner.invoke(
        app,
        [
            "tune",
            "--cache",
            cache,
            "--device",
            "cpu",
            "--quick",
            *sum((["--shape", f"b=2,hq=4,sq={s},d=32"] for s in (16, 32, 48, 64)), []),
        ],
    )
    assert res.exit_code == 130, res.output
    assert "interrupted" in res.output
    store = CacheStore(cache)
    first = {r["key_id"]: r["created_at"] for r in store.raw_winners()}
    assert set(first) == {keys[0].key_id, keys[1].key_id}
    # the interrupted key kept the trials measured before the interrupt, and holds no claim any more
    assert sum(measured_counts(storage, keys[2]).values()) == 4
    assert claims.claim_state(store, keys[2].key_id) is None

    results = run_tuning(problems, cache=cache, timing=QUICK)
    assert [r.status for r in results] == ["skipped", "skipped", "tuned", "tuned"]
    rows = {r["key_id"]: r for r in store.raw_winners()}
    assert len(rows) == 4
    assert all(rows[k]["created_at"] == first[k] for k in first)  # finished keys untouched
    for k in keys:
        counts = measured_counts(storage, k)
        assert len(counts) == 5 and set(counts.values()) == {1}, counts  # every config measured exactly once
    assert results[2].record.trials == 5


@pytest.mark.parametrize("where", ["after_claim", "while_finishing"])
def test_an_interrupt_at_any_point_leaves_no_live_claim(tmp_path, monkeypatch, where):
    """Ctrl-C / SIGTERM can land between taking a key's claim and the block that releases it, or while a
    finished key's claim is being marked done (the SIGTERM test's race: the winner row is visible and
    the signal arrives during the claim update). Either way the run stops with Interrupted and no claim
    stays live: a rerun never waits for a claim of a dead run."""
    from attntune.autotune import runner as runner_mod

    cache = str(tmp_path / "c.db")
    problems = [prob(sq=s, skv=s) for s in (16, 32)]
    if where == "after_claim":
        real = claims.try_claim
        calls = []

        def claim_then_interrupt(*a, **k):
            ok = real(*a, **k)
            calls.append(ok)
            if len(calls) == 2:  # the second key: claimed, then the interrupt before its try block
                raise KeyboardInterrupt
            return ok

        monkeypatch.setattr(runner_mod.claims, "try_claim", claim_then_interrupt)
    else:
        def finish_interrupted(store, key_id, owner):
            raise KeyboardInterrupt  # as if the signal arrived just before the update

        monkeypatch.setattr(runner_mod.claims, "finish", finish_interrupted)
    with pytest.raises(runner_mod.Interrupted):
        run_worker(problems, cache=cache, storage="memory", options=SweepOptions(trials=2, timing=QUICK),
                   run_start=utcnow())
    store = CacheStore(cache)
    live = [claims.claim_state(store, key_of(p).key_id) for p in problems]
    assert all(st is None or st["done"] for st in live), live
    assert len(store.raw_winners()) == 1  # the first key finished (and kept its winner)


def test_a_swallowed_sigterm_still_stops_the_run_at_the_next_key(tmp_path, monkeypatch):
    """SIGTERM's KeyboardInterrupt can be raised inside a finalizer, where Python prints and drops it; the
    flag its handler set stops the run before the next key (finished keys kept, no live claim)."""
    from attntune.autotune import runner as runner_mod

    monkeypatch.setattr(runner_mod, "_TERMINATED", False)
    real = claims.finish

    def finish_then_swallowed_sigterm(store, key_id, owner):
        real(store, key_id, owner)
        runner_mod._TERMINATED = True  # the handler ran; its exception was lost in a finalizer

    monkeypatch.setattr(runner_mod.claims, "finish", finish_then_swallowed_sigterm)
    cache = str(tmp_path / "c.db")
    problems = [prob(sq=s, skv=s) for s in (16, 32)]
    with pytest.raises(runner_mod.Interrupted):
        run_worker(problems, cache=cache, storage="memory", options=SweepOptions(trials=2, timing=QUICK),
                   run_start=utcnow())
    store = CacheStore(cache)
    assert len(store.raw_winners()) == 1
    assert all(st is None or st["done"] for st in (claims.claim_state(store, key_of(p).key_id) for p in problems))


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_both_set_the_stop_flag(signame):
    """Ctrl-C's KeyboardInterrupt was Python's default, which sets no flag: when a finalizer swallowed
    it (5 of 10 runs of an audit) the tune went on to the last key and exited 0. Both stop signals now
    go through the handler that sets the flag; only SIGTERM is passed on to worker processes."""
    import os
    import signal

    from attntune.autotune import runner as runner_mod

    sig = getattr(signal, signame)
    old = runner_mod.stop_signals_as_interrupt()
    try:
        assert set(old) == {signal.SIGINT, signal.SIGTERM}
        assert not runner_mod._TERMINATED
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
            time.sleep(0.5)
        assert runner_mod._TERMINATED and runner_mod._BY_SIGTERM == (signame == "SIGTERM")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        runner_mod._TERMINATED = runner_mod._BY_SIGTERM = False


def test_interrupts_deferred_holds_a_signal_until_the_section_ends():
    import os
    import signal

    from attntune.autotune.runner import interrupts_deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here: it must only record the signal
            done.append(True)
    assert done == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_time_limit_leaves_the_key_in_progress_to_the_next_run(tmp_path, monkeypatch, register):
    register(Slow())
    allow(monkeypatch, "t_slow")
    cache = str(tmp_path / "c.db")
    problems = [prob(sq=s, skv=s) for s in (16, 32, 48)]
    results = run_tuning(problems, cache=cache, timing=QUICK, time_limit=0.5)
    assert "unfinished" in [r.status for r in results]
    results = run_tuning(problems, cache=cache, timing=QUICK)
    assert all(r.status in ("tuned", "skipped") for r in results)
    storage = default_storage_url(cache)
    for p in problems:
        counts = measured_counts(storage, key_of(p))
        assert len(counts) == 5 and set(counts.values()) == {1}, counts


def test_force_and_stale_rows_are_retuned(tmp_path):
    store = CacheStore(tmp_path / "c.db")
    p = prob()
    [rec] = tune([p], cache=store, timing=QUICK)
    # a stale row (measured under another torch) that claims to be much faster is still replaced
    stale = rec.model_copy(update={"median_ms": 1e-6, "fingerprint": SoftwareFingerprint(torch="1.0.0")})
    assert store.upsert_winner(stale, force=True)
    assert judge(store.raw_winner(rec.key_id), "user").status == "stale"
    [new] = tune([p], cache=store, timing=QUICK)
    assert judge(store.raw_winner(rec.key_id), "user").status == "valid"
    assert new.median_ms > 1e-6 and new.created_at > rec.created_at
    # --force re-measures a valid key from scratch
    [forced] = tune([p], cache=store, timing=QUICK, force=True)
    assert forced.created_at > new.created_at
    assert (
        json.loads(store.raw_winner(rec.key_id)["fingerprint_json"])["torch"]
        == torch.__version__.split("+")[0]
    )


# ---- workers and claims -----------------------------------------------------------------------------


def test_two_worker_processes_on_one_sqlite_cache_lose_nothing(tmp_path):
    cache = str(tmp_path / "c.db")
    problems = [prob(b=b, sq=s, skv=s) for b in (1, 2) for s in (16, 32, 64, 96)]
    events = []
    results = run_tuning(problems, cache=cache, timing=QUICK, workers=2, on_event=events.append)
    assert [r.status for r in results].count("tuned") == len(problems)
    store = CacheStore(cache)
    assert store.count() == len(problems)
    storage = default_storage_url(cache)
    for p in problems:
        counts = measured_counts(storage, key_of(p))
        assert len(counts) == 4 and set(counts.values()) == {1}, counts
    with store.session() as s:
        from attntune.cache.schema import Claim

        claims = s.query(Claim).all()
    assert len(claims) == len(problems) and all(c.done == 1 for c in claims)
    started = Counter(ev["key_id"] for ev in events if ev["type"] == "key_start")
    assert set(started.values()) == {1} and len(started) == len(problems)  # each key started once, fleet-wide
    assert not [ev for ev in events if ev["type"] == "worker_errors"]


def test_claims_are_respected_and_expired_claims_taken_over(tmp_path):
    store = CacheStore(tmp_path / "c.db")
    busy, dead = prob(sq=16, skv=16), prob(sq=32, skv=32)
    assert store.claim(key_of(busy).key_id, "other-host:1:0", 600)  # a live worker
    assert store.claim(key_of(dead).key_id, "other-host:2:0", 0.01)  # a worker that died
    time.sleep(0.05)
    res = run_worker(
        [busy, dead],
        cache=store,
        storage="memory",
        options=SweepOptions(timing=QUICK),
        run_start=utcnow(),
        wait_for_others=False,
    )
    st = {r.key_id: r.status for r in res}
    assert st[key_of(busy).key_id] == "unfinished"
    assert st[key_of(dead).key_id] == "tuned"
    assert store.raw_winner(key_of(busy).key_id) is None
    # a done claim from an earlier run does not block a new run
    store.upsert_winner(
        judge(store.raw_winner(key_of(dead).key_id), "u").record.model_copy(
            update={"fingerprint": SoftwareFingerprint(torch="1.0.0")}
        ),
        force=True,
    )
    res = run_worker(
        [dead],
        cache=store,
        storage="memory",
        options=SweepOptions(timing=QUICK),
        run_start=utcnow() + timedelta(seconds=200),
        wait_for_others=False,
    )
    assert res[0].status == "tuned"


# ---- CLI details ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, field",
    [
        ("hq=4,sq=x,d=8", "field sq"),
        ("hq=32,hkv=5,sq=4,d=8", "field hkv"),
        ("hq=4,sq=4", "field d"),
        ("hq=4,sq=4,d=8,bogus=1", "unknown field 'bogus'"),
        ("hq=4,sq=4,d=8,window=3", "field window"),
        ("hq=4,sq=4,d=8,causal=maybe", "field causal"),
        ("hq=4,sq=4,d=8,dtype=int8", "field dtype"),
        ("hq=4,sq=4,d=0", "field d"),
        ("hq=4,sq=1,skv=9,d=8,kv=int8", "field kv"),
        ("hq=4,sq=0,d=8", "field sq"),
        ("b=0,hq=4,sq=4,d=8", "field b"),
        ("hq=4,sq=4,skv=-3,d=8", "field skv"),
    ],
)
def test_shape_spec_errors_name_the_field(spec, field):
    with pytest.raises(ShapeSpecError, match=field):
        parse_shape(spec, device_type="cpu", dtype="float32")
    res = runner.invoke(app, ["tune", "--device", "cpu", "--shape", spec])
    assert res.exit_code == 2
    assert field.split("'")[0].strip() in " ".join(res.output.split())


def test_shape_spec_parses_every_field():
    p = parse_shape(
        "b=4,hq=32,hkv=8,sq=2048,skv=4096,d=128,dv=64,causal=1,align=tl,window=256:0,kv_lens=1,"
        "dtype=bfloat16,mode=fwd_bwd,approx=1",
        device_type="cpu",
        dtype="float32",
    )
    assert (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_kv, p.head_dim, p.head_dim_v) == (
        4,
        32,
        8,
        2048,
        4096,
        128,
        64,
    )
    assert p.causal and p.causal_align == "top_left" and p.window == (256, 0) and p.kv_lens
    assert p.dtype == "bfloat16" and p.mode == "fwd_bwd" and p.approx
    for raw in ("e4m3fn", "float8_e4m3fn"):  # FP8 K/V codes, the float8_ prefix optional
        f8 = parse_shape(f"hq=8,hkv=2,sq=1,skv=64,d=64,kv_lens=1,kv={raw}", device_type="cpu", dtype="bfloat16")
        assert f8.kv_dtype == "float8_e4m3fn"
    q = parse_shape("hq=8,sq=100,d=64", device_type="cpu", dtype="float16", mode="fwd_bwd")
    assert (q.batch, q.heads_kv, q.seqlen_kv, q.head_dim_v, q.dtype, q.mode) == (
        1,
        8,
        100,
        64,
        "float16",
        "fwd_bwd",
    )


def test_from_misses_tunes_this_devices_misses_and_clears_them(tmp_path):
    cache = str(tmp_path / "c.db")
    store = CacheStore(cache)
    mine = [prob(sq=16, skv=16), prob(b=3, sq=20, skv=20, causal=True)]  # 20 is bucketed to 24
    for p in mine:
        store.record_miss(key_of(p), count=3)
    other_dev = DeviceFingerprint(backend="cuda", arch="sm_90", name="NVIDIA H200", units=132)
    foreign = TuneKey.from_problem(prob().model_copy(update={"device_type": "cuda"}), other_dev)
    store.record_miss(foreign)
    res = runner.invoke(app, ["tune", "--from-misses", "--cache", cache, "--device", "cpu", "--quick"])
    assert res.exit_code == 0, res.output
    assert {r["key_id"] for r in store.raw_winners()} == {key_of(p).key_id for p in mine}
    assert [m["key_id"] for m in store.misses()] == [foreign.key_id]
    res = runner.invoke(app, ["tune", "--from-misses", "--cache", cache, "--device", "cpu"])
    assert res.exit_code == 0 and "No misses recorded for this device" in res.output


def test_from_misses_clears_settled_misses_and_keeps_unfinished_and_failed_ones(tmp_path, monkeypatch):
    """A miss whose key ended without any passing variant is settled (a rerun would spend its tuning time for
    the same result) and cleared with a note; keys left unfinished or failed by an error stay for the next run.
    The tuner is replaced by one outcome per key, so only the command's bookkeeping is under test."""
    from attntune.autotune import runner as tuner
    from attntune.autotune.sweep import KeyResult

    cache = str(tmp_path / "c.db")
    store = CacheStore(cache)
    problems = [prob(sq=16 + 8 * i, skv=16 + 8 * i) for i in range(4)]
    keys = [key_of(p) for p in problems]
    for k in keys:
        store.record_miss(k)
    outcomes = ["tuned", "no-winner", "unfinished", "error"]

    def fake_run_tuning(problems, **kw):
        by_id = {k.key_id: s for k, s in zip(keys, outcomes)}
        return [KeyResult(key=k, status=by_id[k.key_id], reason=None if by_id[k.key_id] == "tuned" else "why")
                for k in (key_of(p) for p in problems)]

    monkeypatch.setattr(tuner, "run_tuning", fake_run_tuning)
    res = runner.invoke(app, ["tune", "--from-misses", "--cache", cache, "--device", "cpu", "--quick"])
    assert res.exit_code == 1, res.output  # the error key fails the run, as in any tune
    assert "cleared 2 misses (1 without a passing variant" in " ".join(res.output.split())
    assert sorted(m["key_id"] for m in store.misses()) == sorted(k.key_id for k in keys[2:])


def test_tune_one_for_the_online_policy(tmp_path):
    store = CacheStore(tmp_path / "c.db")
    p = prob(sq=40, skv=40)
    rec = tune_one(p, store, trials=3, time_limit=30)
    # the CPU's candidates are all fixed (one config each): measured once each, on top of the 3 trials
    space = SearchSpace(p)
    assert space.fixed_count() == len(space.candidates) == space.grid_size(100)
    assert rec is not None and rec.key == key_of(p) and rec.trials == len(space.candidates)
    assert judge(record_to_row(rec), "x").status == "valid"
    assert judge(store.raw_winner(rec.key_id), "user").record == rec
    assert tune_one(p, store, trials=3, time_limit=30) == rec  # already tuned: returned, not re-measured


def test_suites_materialize_with_dtype_and_mode():
    for name, s in SUITES.items():
        ps = materialize(s.templates(), "cuda")
        assert ps and all(p.device_type == "cuda" for p in ps), name
        # bfloat16 unless the template pins float32 with TF32 dots
        assert all((p.dtype, p.tf32) == (("float32", True) if t.tf32 else ("bfloat16", False))
                   for t, p in zip(s.templates(), ps)), name
        fp = DeviceFingerprint(backend="cuda", arch="sm_90", name="x", units=1)
        for p in ps:  # suite sizes are bucket values: the tuner measures exactly the listed problem
            assert TuneKey.from_problem(p, fp).representative() == p, (name, p.short())
    assert 25 <= len(SUITES["default"].templates()) <= 37
    assert {p.mode for p in SUITES["training"].templates()} == {"fwd_bwd"}
    assert {p.mode for p in SUITES["seed"].templates()} == {"fwd", "fwd_bwd"}
    demo = materialize(SUITES["demo"].templates(), "cpu", dtype="float64", mode="fwd_bwd")
    assert all(p.dtype == "float64" and p.mode == "fwd_bwd" for p in demo)
    res = runner.invoke(app, ["suites", "--json"])
    assert json.loads(res.output)["default"]["problems"] == len(SUITES["default"].templates())


def test_default_suite_tf32_templates_keep_float32_unless_dtype_is_given():
    """The default suite's float32 keys are tuned as float32 with TF32 dots on a GPU (the key a float32
    call under precision "high" takes), as exact float32 on the CPU, and follow an explicit --dtype."""
    tf32 = [t for t in SUITES["default"].templates() if t.tf32]
    assert len(tf32) == 3 and {t.mode for t in tf32} == {"fwd", "fwd_bwd"}
    on_gpu = [p for p in materialize(SUITES["default"].templates(), "cuda") if p.dtype == "float32"]
    assert len(on_gpu) == 3 and all(p.tf32 for p in on_gpu)
    on_cpu = [p for p in materialize(tf32, "cpu")]
    assert all(p.dtype == "float32" and not p.tf32 and p.device_type == "cpu" for p in on_cpu)
    forced = materialize(tf32, "cuda", dtype="float16")
    assert all(p.dtype == "float16" and not p.tf32 for p in forced)
    fp = DeviceFingerprint(backend="cuda", arch="sm_90", name="x", units=1)
    keys = {TuneKey.from_problem(p, fp).key_id for p in on_gpu}
    assert keys.isdisjoint(TuneKey.from_problem(p, fp).key_id for p in materialize(tf32, "cuda", dtype="float32"))


@pytest.mark.parametrize("budget_units", [0, 1, 3, 8, 16])
def test_gate_reference_is_chunked_without_changing_the_result(monkeypatch, budget_units):
    # hq 8 / hkv 2 (groups of 4), B 3: budgets of 0, 1, 3, 8 and 16 query heads' worth of scores give
    # chunks of one query head, three query heads of one kv head, one batch element, two batch elements.
    p = prob(b=3, hq=8, hkv=2, sq=24, skv=40, causal=True, kv_lens=True, mode="fwd_bwd")
    whole = gate.prepare(p, torch.device("cpu"), seed=1)
    per_q = p.seqlen_q * p.seqlen_kv * 8 * 6
    expected = {0: (1, 1, 1), 1: (1, 1, 1), 3: (1, 1, 3), 8: (1, 2, 4), 16: (2, 2, 4)}[budget_units]
    assert gate.reference_chunks(p, torch.float64, True, max(budget_units * per_q, 1)) == expected
    monkeypatch.setitem(gate.REF_CHUNK_BYTES, "cpu", max(budget_units * per_q, 1))
    parts = gate.prepare(p, torch.device("cpu"), seed=1)
    assert torch.equal(whole.q, parts.q) and torch.equal(whole.kv_lens, parts.kv_lens)
    torch.testing.assert_close(parts.ref_out, whole.ref_out, rtol=0, atol=1e-12)
    for a, b in zip(parts.ref_grads, whole.ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert int(whole.kv_lens[0]) == p.seqlen_kv and whole.kv_lens.min() >= 1
    assert bool((whole.q != 0).all() and (whole.v != 0).all())  # random, never zeros
    assert whole.ref_dtype == torch.float64


@pytest.mark.parametrize("b,skv,expected", [(1, 40, [40]), (3, 40, [40, 34, 27]), (4, 7, [7, 7, 6, 5])])
def test_timed_calls_use_seed_free_kv_lens(b, skv, expected):
    """The gate draws kv_lens per seed; timing must not: every timed call of a kv_lens key uses the same
    lengths (the first the full length, the rest spread down to just above half), whatever the seed."""
    from types import SimpleNamespace

    from attntune.autotune.timing import make_call

    p = prob(b=b, hq=4, hkv=2, sq=1, skv=skv, kv_lens=True)
    draws = [gate.prepare(p, torch.device("cpu"), seed=s) for s in (1, 2, 3, 4)]
    assert len({tuple(d.kv_lens.tolist()) for d in draws}) > 1  # the gate's draws differ ...
    for d in draws:  # ... the timed lengths do not
        assert d.timing_kv_lens.dtype == torch.int32 and d.timing_kv_lens.tolist() == expected
    seen = []
    fake = SimpleNamespace(bind=lambda prob_, cfg: (lambda q, k, v, pp, c, lens: seen.append(lens)))
    fn, _ = make_call(fake, {}, draws[0], grads=False)
    fn()
    assert seen[0] is draws[0].timing_kv_lens
    assert gate.prepare(prob(b=2, hq=4, hkv=2, sq=1, skv=9), torch.device("cpu"), seed=1).timing_kv_lens is None


# ---- on a GPU (skipped without one) ---------------------------------------------------------------


def gpu_prob(**kw) -> AttentionProblem:
    base = dict(
        batch=2,
        heads_q=8,
        heads_kv=2,
        seqlen_q=256,
        seqlen_kv=256,
        head_dim=64,
        head_dim_v=64,
        dtype="bfloat16",
        device_type="cuda",
    )
    base.update(kw)
    return AttentionProblem(**base)


# one item per problem, so that pytest-xdist spreads them (as one test it was the GPU suite's longest
# item, 129 s on the H200, and set the whole suite's wall time)
GPU_TUNE_PROBLEMS = {
    "causal": dict(causal=True),
    "decode-kv_lens": dict(seqlen_q=1, seqlen_kv=1024, kv_lens=True),
    "causal-fwd_bwd": dict(causal=True, mode="fwd_bwd"),
    "window": dict(causal=True, window=(64, 0)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("kw", list(GPU_TUNE_PROBLEMS.values()), ids=list(GPU_TUNE_PROBLEMS))
def test_gpu_tune_with_every_registered_variant(kw, tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNTUNE_VARIANTS")  # the real candidates: SDPA backends and the Triton kernels
    store = CacheStore(tmp_path / "c.db")
    (r,) = run_tuning([gpu_prob(**kw)], cache=store, trials=8, timing=QUICK)
    assert r.status == "tuned", (r.status, r.reason)
    assert judge(store.raw_winner(r.key_id), "user").status == "valid"
    assert r.record.sdpa_default_ms is not None and r.record.max_error is not None
    assert r.record.key.device.backend in ("cuda", "rocm")
    for t in store.trials(r.key_id):
        assert t["status"] in ("ok", "pruned") or t["reason"], t


class GpuUnwritten(_TestVariant):
    """Allocates its output with torch.empty and leaves the last query row unwritten."""

    name = "t_gpu_unwritten"

    def run(self, q, k, v, problem, config, kv_lens=None):
        out = torch.empty(q.shape[:3] + (v.shape[-1],), device=q.device, dtype=q.dtype)
        ref = sdpa_exact(q, k, v, problem, kv_lens)
        out[:, :, :-1] = ref[:, :, :-1]
        return out


@pytest.mark.gpu
def test_gpu_gate_poisons_the_allocator_so_unwritten_outputs_fail():
    p = gpu_prob(heads_kv=8)
    inp = gate.prepare(p, torch.device("cuda"), seed=3)
    res = gate.check(GpuUnwritten(), {}, inp)
    assert res.status == "wrong" and "NaN" in res.reason, res
    assert inp.ref_dtype == torch.float64  # a small problem: float64 reference on the GPU too


def test_approximate_winner_stores_its_relative_error(tmp_path, monkeypatch):
    """An approximate variant's figure of merit, ||out - ref|| / ||ref|| on the tuning inputs, is stored
    with the winner (here Nystrom is the only candidate)."""
    p = AttentionProblem(batch=1, heads_q=2, heads_kv=2, seqlen_q=256, seqlen_kv=256, head_dim=32, head_dim_v=32,
                         dtype="float32", device_type="cpu", approx=True)
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "nystrom")
    [rec] = tune([p], cache=str(tmp_path / "c.db"), storage="memory", trials=3)
    assert rec.variant == "nystrom"
    assert rec.rel_error is not None and 0 < rec.rel_error < 2
    [raw] = CacheStore(str(tmp_path / "c.db")).raw_winners()
    assert judge(raw, "user").record.rel_error == rec.rel_error


def test_sigterm_stops_like_ctrl_c_and_releases_the_claim(tmp_path):
    """`timeout`/`kill` send SIGTERM: finished keys are kept and the key in progress is released at once
    (not left claimed until its TTL), so an immediate rerun tunes the rest."""
    import signal
    import sqlite3
    import subprocess
    import sys

    cache = tmp_path / "c.db"
    cmd = [sys.executable, "-m", "attntune", "tune", "--suite", "demo", "--device", "cpu", "--cache", str(cache),
           "--claim-ttl", "3600"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    n = 0
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        try:
            with sqlite3.connect(cache) as c:
                n = c.execute("SELECT COUNT(*) FROM winners").fetchone()[0]
        except sqlite3.Error:
            continue
        if n >= 1:
            break
    assert proc.poll() is None and n >= 1, "the tune ended before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-2000:]
    total = len(SUITES["demo"].templates())
    with sqlite3.connect(cache) as c:
        kept = c.execute("SELECT COUNT(*) FROM winners").fetchone()[0]
        live = c.execute("SELECT COUNT(*) FROM claims WHERE done = 0").fetchone()[0]
    assert 1 <= kept < total and live == 0
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stdout[-2000:]
    with sqlite3.connect(cache) as c:
        assert c.execute("SELECT COUNT(*) FROM winners").fetchone()[0] == total
