"""Calls at the edges of the API, each found by an adversarial audit (2026-12-04) to give a wrong result,
an internal error or unbounded growth: every test here failed before its fix.

Edges: causal attention with a scale <= 0 on the CPU (torch's flash kernel returned NaN), the eager
fallback's 16-bit score rounding, empty calls that require grad, the FP8 path's inference-only rule on a
repeated signature, scalar checks under torch.compile, explain()/plan() arguments, switches that were
accepted but did nothing useful (``inf`` timeout, ``" 0"``), unordered windows, and drop-in scales that
made a slot per call.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import attntune
from attntune import fp8, tolerances
from attntune.kernels import registry
from attntune.kernels.reference import reference_attention
from attntune.policies import dispatch, runtime
from attntune.problem import problem_from_tensors
from helpers import rand_qkv


@pytest.fixture(autouse=True)
def _fresh_runtime():
    attntune.reset()
    yield
    attntune.reset()


def _ref(q, k, v, **kw):
    p = problem_from_tensors(q, k, v, **kw)
    return reference_attention(q, k, v, p).to(q.dtype)


@pytest.mark.parametrize("scale", [0.0, -0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_with_a_nonpositive_scale_is_right_on_the_cpu(scale, dtype):
    q, k, v = (t.to(dtype) for t in rand_qkv(2, 4, 2, 7, 7, 16, seed=3))
    out = attntune.attention(q, k, v, causal=True, scale=scale)
    assert not out.isnan().any()
    atol, rtol = tolerances.fwd_tol(str(dtype).split(".")[1])
    torch.testing.assert_close(out.float(), _ref(q, k, v, causal=True, scale=scale).float(), atol=atol, rtol=rtol)
    plan = attntune.explain(q, k, v, causal=True, scale=scale)
    assert plan.variant not in ("sdpa_default", "sdpa_flash")
    why = dict(registry.explain_candidates(problem_from_tensors(q, k, v, causal=True, scale=scale)))
    assert any("scale <= 0" in r for r in why[registry.get("sdpa_default")])
    # a positive scale keeps SDPA
    assert not registry.quirk_reasons(registry.get("sdpa_default"), problem_from_tensors(q, k, v, causal=True))


def test_the_eager_fallback_keeps_its_scores_in_float32():
    """bf16 scores rounded before the softmax: 0.34 off at scale 0.5 on std-2 inputs (SDPA: ~1e-2)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 128, 128, generator=g) * s for s in (2, 2, 1))
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    p = problem_from_tensors(qb, kb, vb, causal=True, scale=0.5)
    out = registry.get("eager").run(qb, kb, vb, p, {}, None)
    ref = reference_attention(qb, kb, vb, p)
    sdpa = registry.get("sdpa_math").run(qb, kb, vb, p, {}, None)
    err, err_sdpa = ((o.double() - ref).abs().max().item() for o in (out, sdpa))
    assert out.dtype == torch.bfloat16
    assert err <= max(2e-2, 1.5 * err_sdpa), (err, err_sdpa)


@pytest.mark.parametrize("shape_q,shape_kv", [((2, 4, 5, 8), (2, 2, 0, 8)),   # no keys (GQA)
                                              ((2, 4, 0, 8), (2, 2, 6, 8)),   # no queries
                                              ((0, 4, 5, 8), (0, 2, 6, 8)),   # no batch
                                              ((2, 0, 5, 8), (2, 0, 6, 8))])  # no heads
def test_empty_calls_that_require_grad_backpropagate_zeros(shape_q, shape_kv):
    q = torch.randn(shape_q)
    if q.numel():
        q[0, 0, 0, 0] = float("nan")  # the empty contraction must still give exact zeros
    q.requires_grad_(True)
    k, v = torch.randn(shape_kv, requires_grad=True), torch.randn(shape_kv, requires_grad=True)
    out = attntune.attention(q, k, v, causal=True)
    assert out.shape == (shape_q[0], shape_q[1], shape_q[2], shape_kv[3])
    assert out.requires_grad and torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()
    with torch.no_grad():  # and without grad: plain zeros, no graph
        assert not attntune.attention(q, k, v).requires_grad


def test_zero_heads_give_an_empty_result_as_torch():
    q, k, v = torch.randn(2, 0, 6, 8), torch.randn(2, 0, 9, 8), torch.randn(2, 0, 9, 8)
    assert attntune.attention(q, k, v).shape == F.scaled_dot_product_attention(q, k, v).shape == (2, 0, 6, 8)
    with pytest.raises(ValueError, match="heads_q"):
        attntune.attention(torch.randn(2, 4, 6, 8), k, v)


def test_fp8_refuses_grad_on_a_signature_first_seen_without_grad():
    q, k, v = rand_qkv(2, 4, 2, 1, 17, 16, seed=1)
    k8, v8, ks, vs = fp8.quantize_kv(k, v, per="head", dtype=torch.float8_e4m3fn)
    q = q.bfloat16()
    with torch.no_grad():
        attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs)
    attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs)  # no input requires grad: fine
    with pytest.raises(ValueError, match="k_scale/v_scale: an FP8 K/V cache is for inference"):
        attntune.attention(q.detach().requires_grad_(True), k8, v8, k_scale=ks, v_scale=vs)


@pytest.mark.parametrize("bad,match", [({"causal": "yes"}, "causal"), ({"causal": None}, "causal"),
                                       ({"approx": "no"}, "approx"), ({"scale": float("nan")}, "scale")])
def test_scalars_are_checked_while_compiling_too(monkeypatch, bad, match):
    """Under torch.compile the call becomes a custom op whose arguments are coerced (bool("no") is True):
    the Python values are checked at trace time as in eager mode."""
    q, k, v = rand_qkv(1, 2, 2, 3, 5, 8)
    monkeypatch.setattr(dispatch, "_is_compiling", lambda: True)
    with pytest.raises(ValueError, match=match):
        attntune.attention(q, k, v, **bad)
    k8, v8, ks, vs = fp8.quantize_kv(k, v, per="tensor", dtype=torch.float8_e4m3fn)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(ValueError, match=match):
        attntune.attention(q.bfloat16(), k8, v8, k_scale=ks, v_scale=vs, **bad)


def test_explain_names_bad_arguments_and_says_why_empty_calls_have_no_plan():
    q, k, v = rand_qkv(1, 2, 2, 3, 5, 8)
    for bad in (None, q.numpy()):
        with pytest.raises(ValueError, match="q: expected a torch.Tensor"):
            attntune.explain(bad, k, v)
    with pytest.raises(ValueError, match="empty dimension"):
        attntune.explain(q[:0], k[:0], v[:0])
    with pytest.raises(ValueError, match="q: head_dim must be >= 1"):
        attntune.explain(q[..., :0], k[..., :0], v)


def test_plan_names_bad_arguments():
    q, k, v = rand_qkv(1, 2, 2, 3, 5, 8)
    p = problem_from_tensors(q, k, v)
    with pytest.raises(ValueError, match="problem: expected an attntune.AttentionProblem"):
        attntune.plan(None)
    with pytest.raises(ValueError, match="device"):
        attntune.plan(p, "nonsense")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device: a CUDA/ROCm plan needs a GPU"):
            attntune.plan(p, "cuda")
        with pytest.raises(ValueError, match="problem: a CUDA/ROCm plan needs a GPU"):
            attntune.plan(p.model_copy(update={"device_type": "cuda"}))
    assert attntune.plan(p).variant


@pytest.mark.parametrize("raw, words", [("inf", "must be a finite number"), ("1e308", "must be at most 3600")])
def test_an_infinite_cache_timeout_is_refused_with_a_warning_naming_it(monkeypatch, raw, words):
    """(1e308 is finite, and overflowed as SQLite's busy timeout in ms: both caches dropped — audit)"""
    monkeypatch.setenv("ATTNTUNE_CACHE_TIMEOUT", raw)
    attntune.reset()
    q, k, v = rand_qkv(1, 2, 2, 3, 5, 8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        attntune.attention(q, k, v)
    msgs = [str(x.message) for x in w]
    assert any(f"ATTNTUNE_CACHE_TIMEOUT={raw!r} {words}" in m for m in msgs), msgs
    assert not any("unusable" in m or "Overflow" in m for m in msgs), msgs
    assert runtime.get().config.cache_timeout == 0.2


def test_triton_switch_with_spaces_turns_triton_off(monkeypatch):
    tri = [v for v in registry.all_variants() if v.family == "triton"]
    assert tri
    monkeypatch.setenv("ATTNTUNE_TRITON", " 0 ")
    assert all("ATTNTUNE_TRITON=0" in registry.env_reasons(v) for v in tri)


@pytest.mark.parametrize("window", [{2, 0}, frozenset({3, 1}), {0: 1, 2: 3}])
def test_an_unordered_window_is_refused(window):
    q, k, v = rand_qkv(1, 2, 2, 3, 5, 8)
    with pytest.raises(ValueError, match="window"):
        attntune.attention(q, k, v, window=window)


@pytest.mark.parametrize("scale", [float("nan"), torch.tensor(0.5)])
def test_dropin_scales_that_cannot_key_a_slot_go_to_torch(scale):
    q, k, v = rand_qkv(1, 2, 2, 3, 5, 8)
    before = len(runtime.SLOTS)
    for _ in range(20):
        out = attntune.scaled_dot_product_attention(q, k, v, scale=scale)
    assert len(runtime.SLOTS) == before  # NaN never equals itself, a tensor hashes by identity
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=scale), equal_nan=True)


@pytest.mark.parametrize("window", [None, (5, 3)])
def test_our_flash_kernels_are_right_at_a_zero_scale(monkeypatch, window):
    """At scale 0 a masked score was -inf * 0 = NaN in the flash kernels' running max (the partial last tile
    of 37 keys is masked even without causal): they now run q * 0 at scale 1, the same scores, finite."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = rand_qkv(1, 2, 2, 37, 37, 16, seed=4)
    p = problem_from_tensors(q, k, v, window=window, scale=0.0)
    for name in ("triton_flash", "triton_local") if window else ("triton_flash",):
        var = registry.get(name)
        assert not registry.reasons(var, p)
        out = var.run(q, k, v, p, var.space(p).first(), None)
        torch.testing.assert_close(out, _ref(q, k, v, window=window, scale=0.0), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_gpu_causal_with_a_nonpositive_scale_on_every_sdpa_backend(scale):
    """torch's GPU flash and cuDNN kernels share the CPU flash kernel's NaN (seen with torch 2.11 on the
    H200: registry.QUIRKS keeps them from such calls): every variant that still takes the problem — the
    other SDPA backends and our Triton kernels — and attntune.attention, against the float64 reference."""
    q, k, v = (t.to("cuda", torch.bfloat16) for t in rand_qkv(2, 4, 2, 64, 64, 64, seed=3))
    p = problem_from_tensors(q, k, v, causal=True, scale=scale)
    ref = reference_attention(q, k, v, p).float()
    atol, rtol = tolerances.fwd_tol("bfloat16")
    names = [v_.name for v_ in registry.all_variants() if not registry.reasons(v_, p)]
    assert {"sdpa_efficient", "triton_flash"} <= set(names), names
    assert not {"sdpa_default", "sdpa_flash", "sdpa_cudnn"} & set(names)
    bad = {}
    for name in names:
        out = registry.get(name).run(q, k, v, p, registry.get(name).space(p).first(), None).float()
        if out.isnan().any() or not torch.allclose(out, ref, atol=atol, rtol=rtol):
            bad[name] = float((out - ref).abs().nan_to_num(float("inf")).max())
    assert not bad, bad
    torch.testing.assert_close(attntune.attention(q, k, v, causal=True, scale=scale).float(), ref, atol=atol,
                               rtol=rtol)


def test_fp8_empty_calls_and_caches_give_empty_results():
    """quantize_kv of an empty cache and FP8 calls with an empty dimension raised internal errors (an
    amax over nothing; the problem model's "batch >= 1"); 16-bit calls return zeros."""
    for shape in ((0, 2, 5, 8), (1, 2, 0, 8)):
        k = torch.randn(shape)
        for per in ("head", "tensor"):
            k8, v8, ks, vs = fp8.quantize_kv(k, k, per=per)
            assert k8.shape == shape and torch.equal(ks, torch.ones(2 if per == "head" else 1))
        q = torch.randn(shape[0], 4, 1, 8, dtype=torch.bfloat16)
        out = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs)
        assert out.shape == (shape[0], 4, 1, 8) and not out.any()
        with pytest.raises(ValueError, match="empty dimension"):
            attntune.explain(q, k8, v8, k_scale=ks, v_scale=vs)


def test_the_compiled_op_serves_empty_calls_as_eager_mode():
    q, k, v = torch.randn(0, 4, 3, 8), torch.randn(0, 2, 5, 8), torch.randn(0, 2, 5, 8)
    out = torch.ops.attntune.attention(q, k, v, None, True, False, dispatch.NO_WINDOW, dispatch.NO_WINDOW, None,
                                       -1, False)
    assert out.shape == (0, 4, 3, 8)


def test_fp8_refuses_grad_while_compiling_too(monkeypatch):
    """Compiled, the forward was accepted and .backward() failed inside autograd (the op has no formula)."""
    q, k, v = rand_qkv(1, 4, 2, 1, 9, 16)
    k8, v8, ks, vs = fp8.quantize_kv(k, v)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(ValueError, match="an FP8 K/V cache is for inference"):
        attntune.attention(q.bfloat16().requires_grad_(True), k8, v8, k_scale=ks, v_scale=vs)


def test_an_fp8_decode_loop_resolves_one_plan_per_family(monkeypatch):
    """Each new KV length of an FP8 decode loop resolved a plan of its own (200 plans in 200 steps); like
    16-bit calls, a family's plan now serves its other lengths."""
    resolves = []
    real = runtime.Runtime.resolve
    monkeypatch.setattr(runtime.Runtime, "resolve", lambda self, *a, **kw: resolves.append(a) or real(self, *a, **kw))
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 2, 300, 16, generator=g), torch.randn(2, 2, 300, 16, generator=g)
    k8, v8, ks, vs = fp8.quantize_kv(k, v)
    q = torch.randn(2, 4, 1, 16, generator=g).bfloat16()
    for n in range(100, 300):
        out = attntune.attention(q, k8[:, :, :n], v8[:, :, :n], k_scale=ks, v_scale=vs)
    p = problem_from_tensors(q.float(), k[:, :, :299], v[:, :, :299])
    ref = reference_attention(q.double(), fp8.dequantize(k8[:, :, :299], ks).double(),
                              fp8.dequantize(v8[:, :, :299], vs).double(), p)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    assert len(resolves) <= 5, len(resolves)  # one per length bucket the loop crosses (was one per length)


def test_fp8_scale_values_are_checked_under_attntune_check(monkeypatch):
    q, k, v = rand_qkv(1, 4, 2, 1, 9, 16)
    k8, v8, ks, vs = fp8.quantize_kv(k, v)
    q = q.bfloat16()
    bad = ks.clone()
    bad[1] = float("nan")
    attntune.attention(q, k8, v8, k_scale=bad, v_scale=vs)  # unchecked by default (no host sync)
    monkeypatch.setenv("ATTNTUNE_CHECK", "1")
    attntune.reset()
    for kw, name in (({"k_scale": bad, "v_scale": vs}, "k_scale"), ({"k_scale": ks, "v_scale": -vs}, "v_scale")):
        with pytest.raises(ValueError, match=f"{name}: every scale must be finite and > 0"):
            attntune.attention(q, k8, v8, **kw)
    with pytest.raises(ValueError, match="margin"):
        fp8.quantize_kv(k, v, margin=float("inf"))


def test_explain_does_not_claim_fp8_widening_for_a_float_call():
    q, k, v = rand_qkv(1, 4, 2, 5, 5, 16)
    assert "FP8 K/V widened first" not in str(attntune.explain(q, k, v, causal=True))


@pytest.mark.gpu
def test_gpu_an_fp8_decode_loop_reuses_the_family_plan_and_stays_exact(monkeypatch):
    """The FP8 family reuse on the GPU (triton_decode's family-generic slot serving new lengths with the
    scales appended): every step against the float64 reference on the dequantised cache."""
    from attntune.fp8 import device_kv_reasons

    if device_kv_reasons("float8_e4m3fn", "cuda"):
        pytest.skip("needs an sm_89+ GPU (FP8 codes)")
    resolves = []
    real = runtime.Runtime.resolve
    monkeypatch.setattr(runtime.Runtime, "resolve", lambda self, *a, **kw: resolves.append(a) or real(self, *a, **kw))
    g = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(3, 2, 700, 64, device="cuda", generator=g)
    v = torch.randn(3, 2, 700, 64, device="cuda", generator=g)
    k8, v8, ks, vs = fp8.quantize_kv(k, v)
    q = torch.randn(3, 8, 1, 64, device="cuda", generator=g).bfloat16()
    for n in (513, 514, 530, 600, 640, 641, 699):
        out = attntune.attention(q, k8[:, :, :n], v8[:, :, :n], k_scale=ks, v_scale=vs)
        p = problem_from_tensors(q.float(), k[:, :, :n], v[:, :, :n])
        ref = reference_attention(q.double(), fp8.dequantize(k8[:, :, :n], ks).double(),
                                  fp8.dequantize(v8[:, :, :n], vs).double(), p)
        torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    assert len(resolves) <= 2, len(resolves)


def test_dequantize_names_a_scale_of_the_wrong_shape():
    k8 = torch.zeros(1, 3, 4, 8, dtype=torch.float8_e4m3fn)
    for bad in (torch.ones(2), torch.ones(3, 1), 1.0):
        with pytest.raises(ValueError, match="scale: expected"):
            fp8.dequantize(k8, bad)
    assert fp8.dequantize(k8, torch.ones(3)).shape == (1, 3, 4, 8)


def test_scalar_arguments_and_the_dropin_signature_as_torchs():
    """attention(): a bool scale is refused naming it (True was taken as 1.0, while bool window sides were
    refused); a numpy float32 is a number like a float64 (it was refused). The drop-in has torch's
    signature: ``scale``/``enable_gqa`` keyword-only and ``is_causal`` a bool — what torch refuses, it
    refuses with torch's error (audit: both were accepted)."""
    import numpy as np

    q, k, v = rand_qkv(1, 2, 2, 5, 5, 8)
    with pytest.raises(ValueError, match="scale: expected a float or None, got bool"):
        attntune.attention(q, k, v, scale=True)
    torch.testing.assert_close(attntune.attention(q, k, v, scale=np.float32(0.5)),
                               attntune.attention(q, k, v, scale=0.5))
    for call in (lambda f: f(q, k, v, None, 0.0, False, 0.5), lambda f: f(q, k, v, is_causal=1)):
        with pytest.raises(TypeError) as want:
            call(F.scaled_dot_product_attention)
        with pytest.raises(TypeError) as got:
            call(attntune.scaled_dot_product_attention)
        assert type(got.value) is type(want.value)
        with attntune.dispatch(), pytest.raises(TypeError):
            call(F.scaled_dot_product_attention)


def test_triton_variants_are_kept_from_bf16_under_the_interpreter(monkeypatch):
    """Triton's interpreter computes bf16 dots wrong (errors of 1e8): a fixed Triton policy under it falls
    back for bf16 calls, with the reason, instead of returning garbage; fp16 keeps the Triton variant."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = rand_qkv(1, 2, 2, 33, 33, 16)
    p16 = problem_from_tensors(q.half(), k.half(), v.half(), causal=True)
    pbf = problem_from_tensors(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True)
    for name in ("triton_flash", "triton_local", "triton_decode"):
        assert any("interpreter computes bfloat16 dots wrong" in r for r in registry.reasons(registry.get(name), pbf))
    assert not registry.reasons(registry.get("triton_flash"), p16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not any("interpreter" in r for r in registry.reasons(registry.get("triton_flash"), pbf))
