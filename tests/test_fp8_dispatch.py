"""FP8 K/V caches through the runtime: ``attntune.attention(q, k_codes, v_codes, k_scale=, v_scale=)``.

The problem model and key carry ``kv_dtype`` (without changing any existing key's id), only variants that
declare the format serve such calls (``triton_decode`` reads the codes, ``fp8_dequant`` widens them — the
fallback, and what a CPU gets), a call without scales never meets them, and bad arguments name themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import attntune
from attntune import fp8
from attntune.kernels import registry
from attntune.kernels.base import Variant
from attntune.kernels.reference import reference_attention
from attntune.key import TuneKey
from attntune.problem import AttentionProblem, dtype_name
from helpers import assert_close, rand_qkv

ROOT = Path(__file__).resolve().parents[1]
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.fixture(autouse=True)
def _fresh_runtime():
    attntune.reset()
    yield
    attntune.reset()


def _case(b, hq, hkv, sq, s, d, dtype=torch.bfloat16, per="head", fmt=E4M3, seed=0):
    q, k, v = rand_qkv(b, hq, hkv, sq, s, d, seed=seed)
    k8, v8, ks, vs = fp8.quantize_kv(k, v, per=per, dtype=fmt)
    return q.to(dtype), k8, v8, ks, vs


def _ref(q, k8, v8, ks, vs, lens=None, causal=False, window=None):
    p = AttentionProblem(batch=q.shape[0], heads_q=q.shape[1], heads_kv=k8.shape[1], seqlen_q=q.shape[2],
                         seqlen_kv=k8.shape[2], head_dim=q.shape[3], head_dim_v=v8.shape[3],
                         dtype=dtype_name(q.dtype), causal=causal, window=window, kv_lens=lens is not None)
    return reference_attention(q, fp8.dequantize(k8, ks), fp8.dequantize(v8, vs), p, lens)


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
@pytest.mark.parametrize("per", ["head", "tensor"])
@pytest.mark.parametrize("sq,causal,window,lens", [(1, False, None, False), (3, True, None, True),
                                                    (2, True, (9, 0), True), (1, False, (5, -1), False)])
def test_attention_with_fp8_kv_equals_the_reference_on_the_dequantised_cache(fmt, per, sq, causal, window, lens):
    q, k8, v8, ks, vs = _case(3, 6, 2, sq, 29, 24, per=per, fmt=fmt)
    kv_lens = torch.tensor([29, 1, 17], dtype=torch.int32) if lens else None
    out = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs, causal=causal, window=window, kv_lens=kv_lens)
    assert out.dtype == q.dtype and out.shape == (3, 6, sq, 24)
    assert_close(out, _ref(q, k8, v8, ks, vs, kv_lens, causal, window), "bfloat16")
    # a repeat call takes the stored slot and gives the same
    again = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs, causal=causal, window=window, kv_lens=kv_lens)
    assert torch.equal(out, again)
    [plan] = [p for p in attntune.stats()["plans"] if "kv:" in p["problem"]]
    assert plan["variant"] == "fp8_dequant" and f"kv:{str(fmt).split('float8_')[1]}" in plan["problem"]


def test_a_call_without_scales_never_gets_an_fp8_variant_and_fp8_codes_need_scales():
    q, k, v = rand_qkv(2, 4, 2, 1, 33, 16, dtype=torch.bfloat16)
    attntune.attention(q, k, v)
    assert all("kv:" not in p["problem"] and p["variant"] != "fp8_dequant" for p in attntune.stats()["plans"])
    p = AttentionProblem(batch=2, heads_q=4, heads_kv=2, seqlen_q=1, seqlen_kv=33, head_dim=16, head_dim_v=16,
                         dtype="bfloat16")
    assert "fp8_dequant" not in [v.name for v in registry.candidates(p)]
    _, k8, v8, ks, vs = _case(2, 4, 2, 1, 33, 16)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        attntune.attention(q, k8, v8)


def test_only_variants_that_declare_the_format_serve_fp8_problems():
    p = AttentionProblem(batch=2, heads_q=4, heads_kv=2, seqlen_q=1, seqlen_kv=33, head_dim=16, head_dim_v=16,
                         dtype="bfloat16", kv_dtype="float8_e4m3fn")
    assert "float8_e4m3fn" in registry.get("triton_decode").kv_dtypes
    flash = registry.get("triton_flash")  # the FP8 forward (tests/test_fp8_prefill.py): FP8 dots
    assert "float8_e4m3fn" in flash.kv_dtypes and flash.fp8_dots
    assert not registry.get("triton_decode").fp8_dots
    for name in ("eager", "sdpa_default", "sdpa_math", "flex"):
        if registry.exists(name):
            assert any("K/V in float8_e4m3fn" in r for r in registry.reasons(registry.get(name), p)), name
    assert not registry.reasons(registry.get("fp8_dequant"), p)
    plan = attntune.plan(p)
    assert plan.variant in ("fp8_dequant", "triton_decode")


@pytest.mark.parametrize("bad,match", [
    (dict(k_scale=torch.ones(2, dtype=torch.float64)), "k_scale: expected float32"),
    (dict(v_scale=torch.ones(3)), r"v_scale: expected one scale or a contiguous \[Hkv=2\]"),
    (dict(k_scale=[1.0, 2.0]), "k_scale: expected a float32 tensor"),
    (dict(q_dtype=torch.float32), "q: an FP8 K/V cache needs q in"),
    (dict(v_fmt=E5M2), "k/v: with k_scale/v_scale, k and v must be one FP8 format"),
    (dict(plain_kv=True), "k/v: with k_scale/v_scale, k and v must be one FP8 format"),
    (dict(grad=True), "k_scale/v_scale: an FP8 K/V cache is for inference"),
])
def test_bad_fp8_arguments_name_the_argument(bad, match):
    q, k8, v8, ks, vs = _case(2, 4, 2, 1, 19, 16)
    if "q_dtype" in bad:
        q = q.to(bad["q_dtype"])
    if "v_fmt" in bad:
        v8 = v8.float().to(bad["v_fmt"])
    if "plain_kv" in bad:
        k8, v8 = k8.to(q.dtype), v8.to(q.dtype)
    if bad.get("grad"):
        q = q.detach().requires_grad_(True)
    kw = {"k_scale": bad.get("k_scale", ks), "v_scale": bad.get("v_scale", vs)}
    with pytest.raises(ValueError, match=match):
        attntune.attention(q, k8, v8, **kw)


def test_kv_dtype_keys_are_new_and_every_existing_key_keeps_its_id():
    rows = 0
    from attntune.cache.store import CacheStore

    store = CacheStore(ROOT / "cache.db", readonly=True) if (ROOT / "cache.db").exists() else None
    if store is not None:
        for raw in store.raw_winners():
            assert TuneKey.model_validate_json(raw["key_json"]).key_id == raw["key_id"]
            rows += 1
    p = AttentionProblem(batch=2, heads_q=4, heads_kv=2, seqlen_q=1, seqlen_kv=33, head_dim=16, head_dim_v=16,
                         dtype="bfloat16")
    from attntune.device import device_fingerprint

    fp = device_fingerprint("cpu")
    plain = TuneKey.from_problem(p, fp)
    f8 = TuneKey.from_problem(p.model_copy(update={"kv_dtype": "float8_e4m3fn"}), fp)
    assert "kv_dtype" not in json.loads(plain.model_dump_json(exclude={"kv_dtype"}))
    assert f8.key_id != plain.key_id and f8.family() != plain.family() and "kv:e4m3fn" in f8.short()
    assert f8.representative().kv_dtype == "float8_e4m3fn"
    with pytest.raises(ValueError, match="kv_dtype"):
        p.model_copy(update={"dtype": "float32"}).model_validate(
            {**p.model_dump(), "dtype": "float32", "kv_dtype": "float8_e4m3fn"})
    with pytest.raises(ValueError, match="kv_dtype: an FP8 K/V cache is for inference"):
        AttentionProblem.model_validate({**p.model_dump(), "kv_dtype": "float8_e5m2", "mode": "fwd_bwd"})


class _Broken(Variant):
    name = "t_fp8_broken"
    family = "test"
    kv_dtypes = ("float8_e4m3fn",)

    def supports(self, problem):
        return []

    def run(self, q, k, v, problem, config, kv_lens=None, k_scale=None, v_scale=None):
        raise RuntimeError("kernel exploded")


def test_a_failing_fp8_variant_is_quarantined_and_the_call_widens_instead(monkeypatch):
    registry.register(_Broken())
    try:
        monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:t_fp8_broken")
        attntune.reset()
        q, k8, v8, ks, vs = _case(2, 4, 2, 1, 21, 16)
        with pytest.warns(RuntimeWarning, match="quarantined"):
            out = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs)
        assert_close(out, _ref(q, k8, v8, ks, vs), "bfloat16")
        out2 = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs)  # the slot now holds the fallback
        assert torch.equal(out, out2)
    finally:
        registry.unregister("t_fp8_broken")


def test_triton_decode_serves_fp8_through_attention_under_the_interpreter(monkeypatch):
    """The runtime's FP8 path down to the kernel (fp16 q: the interpreter's bf16 dot is unreliable)."""
    if torch.cuda.is_available():
        pytest.skip("the GPU suite covers triton_decode with FP8 at serving shapes")
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:triton_decode")
    attntune.reset()
    q, k8, v8, ks, vs = _case(2, 4, 2, 2, 45, 16, dtype=torch.float16)
    lens = torch.tensor([45, 20], dtype=torch.int32)
    out = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs, causal=True, kv_lens=lens)
    [plan] = [p for p in attntune.stats()["plans"] if "kv:" in p["problem"]]
    assert plan["variant"] == "triton_decode"
    assert_close(out, _ref(q, k8, v8, ks, vs, lens, causal=True), "float16")


def _fp8_problem(**kw):
    f = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=1, seqlen_kv=48, head_dim=16, head_dim_v=16,
             dtype="float16", kv_lens=True, kv_dtype="float8_e4m3fn")
    f.update(kw)
    return AttentionProblem(**f)


class _NoVScale(Variant):
    """Reads the codes right but forgets V's scale: the gate must catch it."""

    name = "t_fp8_no_vscale"
    family = "test"
    kv_dtypes = ("float8_e4m3fn",)

    def supports(self, problem):
        return []

    def run(self, q, k, v, problem, config, kv_lens=None, k_scale=None, v_scale=None):
        kd = fp8.dequantize(k, k_scale).to(q.dtype)
        vd = v.float().to(q.dtype)
        return reference_attention(q, kd, vd, problem.model_copy(update={"kv_dtype": None}), kv_lens).to(q.dtype)


def test_the_gate_quantises_fp8_keys_and_stores_the_error_against_the_float_cache():
    from attntune.autotune import gate

    p = _fp8_problem()
    inp = gate.prepare(p, torch.device("cpu"), seed=3)
    assert inp.k.dtype == torch.float8_e4m3fn and inp.v.dtype == torch.float8_e4m3fn
    assert [s.shape for s in inp.scales] == [(2,), (2,)] and inp.float_ref_out is not None
    assert not torch.equal(inp.float_ref_out, inp.ref_out)  # quantisation moved the reference
    res = gate.check(registry.get("fp8_dequant"), {}, inp)
    assert res.ok and "against the float32 cache" in res.reason
    assert 1e-3 < res.rel_error < 0.2  # e4m3 keeps ~3 bits of mantissa: about 1e-2 on random data
    registry.register(_NoVScale())
    try:
        bad = gate.check(registry.get("t_fp8_no_vscale"), {}, inp)
        assert bad.status == "wrong"
    finally:
        registry.unregister("t_fp8_no_vscale")


def test_the_tuner_tunes_an_fp8_key_and_the_winner_keeps_its_error(tmp_path, monkeypatch):
    from attntune.autotune.runner import tune
    from attntune.autotune.timing import TimingOptions

    monkeypatch.setenv("ATTNTUNE_VARIANTS", "fp8_dequant,triton_decode,sdpa_default,eager")
    p = _fp8_problem()
    [rec] = tune([p], cache=str(tmp_path / "c.db"), trials=2, timing=TimingOptions.quick())
    assert rec.key.kv_dtype == "float8_e4m3fn" and rec.variant in ("fp8_dequant", "triton_decode")
    assert rec.rel_error is not None and 1e-3 < rec.rel_error < 0.2
    assert rec.sdpa_default_ms is None  # SDPA cannot read FP8 K/V: there is no baseline to beat
    monkeypatch.setenv("ATTNTUNE_CACHE", str(tmp_path / "c.db"))
    attntune.reset()
    plan = attntune.plan(p)
    assert plan.source == "tuned" and any("relative error" in r for r in plan.reasons)


def test_the_fp8_suite_materialises_with_a_16_bit_q():
    from attntune.autotune.suites import SUITES, materialize

    probs = materialize(SUITES["fp8"].templates(), "cuda")
    assert probs and all(x.kv_dtype == "float8_e4m3fn" and x.dtype == "bfloat16" for x in probs)
    assert all(x.kv_dtype == "float8_e4m3fn" and x.dtype == "bfloat16"
               for x in materialize(SUITES["fp8"].templates(), "cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("per", ["head", "tensor"])
def test_gpu_fp8_kv_through_attention_picks_triton_decode_and_captures_in_a_cuda_graph(per):
    torch.manual_seed(0)
    b, hq, hkv, s, d = 4, 32, 8, 3001, 128
    k = torch.randn(b, hkv, s, d, device="cuda")
    v = torch.randn(b, hkv, s, d, device="cuda")
    k8, v8, ks, vs = fp8.quantize_kv(k, v, per=per)
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([s, 1, 1700, 2999], device="cuda", dtype=torch.int32)
    out = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs, kv_lens=lens, causal=True)
    [plan] = [p for p in attntune.stats()["plans"] if "kv:" in p["problem"]]
    assert plan["variant"] == "triton_decode", plan
    ref = _ref(q.cpu(), k8.cpu(), v8.cpu(), ks.cpu(), vs.cpu(), lens.cpu(), causal=True)
    assert_close(out.cpu(), ref, "bfloat16")
    # the FP8 path is CUDA-graph safe after a warm-up call of the same signature
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cap = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs, kv_lens=lens, causal=True)
    q.copy_(torch.randn_like(q))
    g.replay()
    torch.cuda.synchronize()
    ref2 = _ref(q.cpu(), k8.cpu(), v8.cpu(), ks.cpu(), vs.cpu(), lens.cpu(), causal=True)
    assert_close(cap.cpu(), ref2, "bfloat16")


def test_doctor_reports_which_variants_read_fp8_here():
    from typer.testing import CliRunner

    from attntune.cli import app

    res = CliRunner().invoke(app, ["doctor", "--json"])
    rep = json.loads(res.output)
    by = {v["variant"]: v["fp8 decode"] for v in rep["variants"]}
    assert by["fp8_dequant"] == [] and any("K/V in float8" in r for r in by["eager"])


@pytest.mark.parametrize("cap,hip,fmt,ok", [((9, 0), None, "float8_e4m3fn", True), ((8, 9), None, "float8_e5m2", True),
                                            ((8, 0), None, "float8_e4m3fn", False),
                                            ((9, 0), None, "float8_e4m3fnuz", False),
                                            (None, "gfx942:sramecc+:xnack-", "float8_e4m3fnuz", True),
                                            (None, "gfx90a", "float8_e4m3fnuz", False),
                                            (None, "gfx942", "float8_e4m3fn", False)])
def test_device_kv_reasons_by_architecture(monkeypatch, cap, hip, fmt, ok):
    import types

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.2" if hip else None)
    if hip:
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(gcnArchName=hip))
    else:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cap)
    assert (fp8.device_kv_reasons(fmt, "cuda") == []) is ok
    assert fp8.device_kv_reasons(fmt, "cpu") == []  # the interpreter reads every format



def test_under_torch_compile_the_codes_reach_the_fp8_runtime_through_one_op():
    """torch.compile (HF compiles a static cache's decode step by itself on a GPU): the call becomes the
    opaque op attntune::attention_fp8, the codes and scales enter it unwidened and the FP8 runtime serves it
    at run time — the same plan and output as the eager call, with no widening in the graph."""
    q, k8, v8, ks, vs = _case(2, 4, 2, 1, 29, 16)
    lens = torch.tensor([29, 11], dtype=torch.int32)
    want = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs, causal=True, window=(7, 0), kv_lens=lens)
    attntune.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(q, k8, v8, ks, vs, lens):
        return attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs, causal=True, window=(7, 0), kv_lens=lens) * 2

    got = torch.compile(step, backend=backend, fullgraph=True)(q, k8, v8, ks, vs, lens)
    assert torch.equal(got, want * 2)
    [gm] = graphs
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "attntune.attention_fp8" in targets, targets
    assert "attntune.attention" not in targets and len(targets) == 2  # not widened for the regular op
    [plan] = [p for p in attntune.stats()["plans"] if "kv:" in p["problem"]]
    assert plan["calls"] == 1 and "kv_lens" in plan["problem"]


def test_the_fp8_op_refuses_bad_inputs_when_traced():
    q, k8, v8, ks, vs = _case(1, 4, 2, 1, 9, 16)
    f = torch.compile(lambda q, k, v: attntune.attention(q, k, v, k_scale=ks, v_scale=vs), backend="eager",
                      fullgraph=True)
    with pytest.raises(Exception, match="k_scale|k/v|heads|share one format|k_cache"):
        f(q, k8, v8.to(torch.float8_e5m2))


def test_explain_takes_the_scales_and_shows_the_plan_attention_uses():
    q, k8, v8, ks, vs = _case(2, 4, 2, 1, 30, 16)
    lens = torch.tensor([30, 12], dtype=torch.int32)
    plan = attntune.explain(q, k8, v8, k_scale=ks, v_scale=vs, causal=True, kv_lens=lens)
    assert plan.problem.kv_dtype == "float8_e4m3fn" and "kv:e4m3fn" in str(plan)
    assert not attntune.stats()["plans"]  # nothing recorded, nothing run
    attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs, causal=True, kv_lens=lens)
    [used] = attntune.stats()["plans"]
    assert used["variant"] == plan.variant
    with pytest.raises(ValueError, match="k_scale"):
        attntune.explain(q, k8, v8)
    with pytest.raises(ValueError, match="v_scale"):
        attntune.explain(q, k8, v8, k_scale=ks, v_scale=ks.double())


def test_untuned_fp8_prefill_on_a_gpu_goes_to_the_fp8_forward_for_its_own_reason(monkeypatch):
    """The heuristic's FP8 prefill rule (a GPU whose variants can read the codes, faked here: on this
    machine supports() says no CUDA): the FP8 forward first, widening the codes second — and explain()
    says why in FP8's terms, not the 'SDPA would need a mask' of bf16 prefill."""
    from attntune.policies import policy

    monkeypatch.setattr(policy, "usable", lambda name, config, problem, quarantine:
                        [] if name in ("triton_decode", "triton_flash", "fp8_dequant")
                        else ["(test) cannot read FP8 codes"])
    problem = AttentionProblem(batch=1, heads_q=8, heads_kv=2, seqlen_q=300, seqlen_kv=300, head_dim=64,
                               head_dim_v=64, dtype="bfloat16", causal=True, device_type="cuda",
                               kv_dtype="float8_e4m3fn")
    plan = policy.heuristic_plan(problem, None, set())
    assert (plan.impl.name, plan.runner_up) == ("triton_flash", "fp8_dequant")
    assert any("rule fp8-prefill" in r for r in plan.reasons), plan.reasons
    decode = problem.model_copy(update={"seqlen_q": 1})
    assert policy.heuristic_plan(decode, None, set()).impl.name == "triton_decode"  # the decode rule comes first
