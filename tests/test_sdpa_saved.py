"""The SDPA variants split their forward from their backward for the compiled training op
(:mod:`attntune.kernels.sdpa_saved`): aten's fused forward keeps the row LSE, its backward op takes it back,
so a compiled training step whose plan is SDPA runs one attention forward, not two. CPU: torch's flash CPU
kernel; GPU: flash, memory-efficient and cuDNN."""

from __future__ import annotations

import pytest
import torch

import attntune
from attntune.kernels import registry, sdpa, sdpa_saved
from attntune.policies.dispatch import original_sdpa
from attntune.problem import problem_from_tensors
from helpers import assert_close, bottom_right_mask as _mask, rand_qkv

TORCH_SDPA = original_sdpa()


def _problem(q, k, v, causal, scale=None, align="bottom_right"):
    return problem_from_tensors(q, k, v, causal=causal, causal_align=align, scale=scale, mode="fwd_bwd")


def _lse_ref(q, k, problem):
    """Row log-sum-exp of the scaled scores in float64 over the admitted keys (top-left causal = the keys
    ``j <= i``; bottom-right with Sq == Skv is the same mask)."""
    kk = k.double().repeat_interleave(problem.group, 1)
    s = (q.double() @ kk.transpose(-1, -2)) * problem.softmax_scale
    if problem.causal:
        i = torch.arange(q.shape[2], device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    return torch.logsumexp(s, -1)


def _check_split(name, q, k, v, causal, scale, dtype_name, align="bottom_right"):
    """forward_saving's output equals run()'s, its LSE the reference's; backward_saved's gradients equal
    autograd's through run()."""
    variant = registry.get(name)
    problem = _problem(q, k, v, causal, scale, align)
    saved = variant.forward_saving(q.detach(), k.detach(), v.detach(), problem, {})
    assert saved is not None, f"{name} did not split {problem}"
    out, lse = saved
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32 and lse.is_contiguous()
    ref = variant.run(q, k, v, problem, {})
    torch.testing.assert_close(out, ref, atol=0, rtol=0)  # the same kernel
    torch.testing.assert_close(lse.double(), _lse_ref(q.detach(), k.detach(), problem), atol=2e-3, rtol=1e-4)
    g = torch.randn_like(ref)
    grads = variant.backward_saved(g, q.detach(), k.detach(), v.detach(), out.contiguous(), lse, problem, {})
    assert grads is not None
    for a, b, t, what in zip(grads, torch.autograd.grad(ref, (q, k, v), g), (q, k, v), ("dq", "dk", "dv")):
        assert a.shape == t.shape and a.dtype == t.dtype, what
        assert_close(a, b, dtype_name, backward=True, what=what)


@pytest.mark.parametrize("name", ["sdpa_default", "sdpa_flash"])
@pytest.mark.parametrize("hq,hkv,sq,skv,causal,scale", [
    (4, 2, 7, 7, True, None),      # GQA, causal (bottom-right == top-left when Sq == Skv)
    (3, 3, 5, 19, False, 0.37),    # no mask, Sq != Skv, a scale
    (6, 2, 13, 9, True, None),     # top-left causal with Sq > Skv: rows past Skv see every key
])
def test_cpu_split_matches_run_and_autograd(name, hq, hkv, sq, skv, causal, scale):
    q, k, v = rand_qkv(2, hq, hkv, sq, skv, 24, requires_grad=True, seed=hq * sq)
    _check_split(name, q, k, v, causal, scale, "float32", align="top_left")


def test_what_does_not_split_returns_none():
    """A materialised mask (bottom-right causal with Sq != Skv), kv_lens, unequal head dims and the math
    backend keep no residuals: the compiled op recomputes them as before."""
    q, k, v = rand_qkv(1, 2, 2, 5, 9, 16)
    flash = registry.get("sdpa_default")
    assert flash.forward_saving(q, k, v, _problem(q, k, v, True), {}) is None  # bottom-right, Sq != Skv
    lens = torch.tensor([7])
    p = problem_from_tensors(q, k, v, kv_lens=lens, mode="fwd_bwd")
    assert flash.forward_saving(q, k, v, p, {}, lens) is None
    q2, k2, v2 = rand_qkv(1, 2, 2, 5, 9, 16, dv=8)
    assert flash.forward_saving(q2, k2, v2, _problem(q2, k2, v2, False), {}) is None
    assert registry.get("sdpa_math").forward_saving(q, k, v, _problem(q, k, v, False), {}) is None
    assert registry.get("sdpa_math").backward_saved(q, q, k, v, q, q[..., 0], _problem(q, k, v, False), {}) is None


@pytest.fixture
def sdpa_policy(monkeypatch):
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:sdpa_default")
    torch._dynamo.reset()
    attntune.reset()
    yield
    attntune.reset()
    torch._dynamo.reset()


def _counting_run(monkeypatch):
    """Count SdpaVariant.run calls (the recompute path runs the forward through run() again)."""
    runs = []
    real = sdpa.SdpaVariant.run

    def run(self, *a, **kw):
        runs.append(self.name)
        return real(self, *a, **kw)

    monkeypatch.setattr(sdpa.SdpaVariant, "run", run)
    return runs


def _counting_pairs(monkeypatch):
    calls = []
    for key, pair in list(sdpa_saved._PAIRS.items()):
        def wrap(fn, tag):
            def counted(*a, **kw):
                calls.append(tag)
                return fn(*a, **kw)
            return counted
        monkeypatch.setitem(sdpa_saved._PAIRS, key, sdpa_saved._Pair(wrap(pair.forward, "fwd"),
                                                                      wrap(pair.backward, "bwd")))
    return calls


def test_compiled_training_on_sdpa_runs_the_forward_once(sdpa_policy, monkeypatch):
    """A compiled training step whose plan is sdpa_default: one aten forward, one aten backward, no
    run() (recompute) — gradients equal torch SDPA's."""
    runs = _counting_run(monkeypatch)
    calls = _counting_pairs(monkeypatch)
    q, k, v = rand_qkv(2, 4, 2, 9, 9, 16, requires_grad=True, seed=11)
    out = torch.compile(lambda q, k, v: attntune.attention(q * 0.5, k, v, causal=True).cos(), fullgraph=True,
                        backend="aot_eager")(q, k, v)
    ref = torch.cos(TORCH_SDPA(q * 0.5, k, v, is_causal=True, enable_gqa=True))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert calls == ["fwd", "bwd"] and runs == []  # recomputing would call run() in the backward
    assert {p["variant"] for p in attntune.stats()["plans"]} == {"sdpa_default"}


def test_compiled_training_on_sdpa_with_a_mask_recomputes(sdpa_policy, monkeypatch):
    """Bottom-right causal with Sq != Skv needs a materialised mask: not split, the backward recomputes
    through run() — gradients still right."""
    runs = _counting_run(monkeypatch)
    q, k, v = rand_qkv(1, 2, 2, 5, 11, 16, requires_grad=True, seed=12)
    out = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True), fullgraph=True,
                        backend="aot_eager")(q, k, v)
    ref = TORCH_SDPA(q, k, v, attn_mask=_mask(5, 11))
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert len(runs) == 2


def test_a_split_backward_that_fails_warns_once_and_recomputes(sdpa_policy, monkeypatch):
    """A backward op that raises (an API drift of aten's private ops, say): the step's gradients still come
    from the recompute, one warning names the variant, and later steps no longer split (no failing call and
    no kept residuals a step)."""
    import warnings

    key = ("cpu", sdpa.SDPBackend.FLASH_ATTENTION)
    pair = sdpa_saved._PAIRS[key]
    calls = []

    def fwd(*a, **kw):
        calls.append("fwd")
        return pair.forward(*a, **kw)

    def broken(*a, **kw):
        calls.append("bwd")
        raise RuntimeError("schema drift")

    monkeypatch.setitem(sdpa_saved._PAIRS, key, sdpa_saved._Pair(fwd, broken))
    q, k, v = rand_qkv(1, 2, 2, 6, 6, 16, requires_grad=True, seed=14)
    cf = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True), fullgraph=True, backend="aot_eager")
    ref = TORCH_SDPA(q, k, v, is_causal=True)
    g = torch.randn_like(ref)
    rgrads = torch.autograd.grad(ref, (q, k, v), g)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            for a, b in zip(torch.autograd.grad(cf(q, k, v), (q, k, v), g), rgrads):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    msgs = [str(x.message) for x in w if "kept residuals" in str(x.message)]
    assert len(msgs) == 1 and "sdpa_default" in msgs[0] and "schema drift" in msgs[0]
    assert calls == ["fwd", "bwd"]  # the second step neither kept residuals nor tried the broken backward


# ---- GPU: each fused backend ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sdpa_default", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hq,hkv,sq,skv,causal,d", [(8, 2, 333, 333, True, 64), (6, 6, 200, 517, False, 128),
                                                    (4, 4, 77, 77, True, 96)])
def test_gpu_split_matches_run_and_autograd(name, dtype, hq, hkv, sq, skv, causal, d):
    dev = torch.device("cuda")
    q, k, v = rand_qkv(2, hq, hkv, sq, skv, d, dtype=dtype, device=dev, requires_grad=True, seed=sq)
    variant = registry.get(name)
    problem = _problem(q, k, v, causal, None, "top_left")
    if variant.supports(problem):
        pytest.skip(f"{name} does not run this problem here: {variant.supports(problem)[0]}")
    if variant.forward_saving(q.detach(), k.detach(), v.detach(), problem, {}) is None:
        assert name == "sdpa_default" and dtype == torch.float32 and torch._fused_sdp_choice(
            q, k, v, None, 0.0, causal, enable_gqa=hkv != hq) == 0  # torch's choice is the math backend
        return
    _check_split(name, q, k, v, causal, None, str(dtype).split(".")[-1], align="top_left")


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 4)])
def test_gpu_compiled_training_on_sdpa_runs_the_forward_once(monkeypatch, hq, hkv):
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:sdpa_default")
    torch._dynamo.reset()
    attntune.reset()
    runs = _counting_run(monkeypatch)
    calls = _counting_pairs(monkeypatch)
    dev = torch.device("cuda")
    q, k, v = rand_qkv(2, hq, hkv, 300, 300, 64, dtype=torch.bfloat16, device=dev, requires_grad=True, seed=13)
    out = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True), fullgraph=True)(q, k, v)
    ref = TORCH_SDPA(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    g = torch.randn_like(out)
    assert_close(out, ref, "bfloat16")
    for a, b, what in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g.float()),
                          ("dq", "dk", "dv")):
        assert_close(a, b, "bfloat16", backward=True, what=what)
    assert calls == ["fwd", "bwd"] and runs == []
    attntune.reset()
    torch._dynamo.reset()


# ---- layouts: the compiled ops' outputs and gradients follow their inputs' -------------------------
def _bshd(b, h, s, d, seed, requires_grad=True):
    """[B, H, S, D] views of [B, S, H, D] tensors: how a model's attention inputs usually arrive."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(b, s, h, d, generator=g).transpose(1, 2)
    return t.detach().requires_grad_(requires_grad)


@pytest.mark.parametrize("grad", [True, False])
def test_compiled_outputs_and_grads_keep_a_models_layout(sdpa_policy, grad):
    """q/k/v in [B, S, H, D] memory: the op's output and the gradients come back in that layout (no copy to
    [B, H, S, D] and back around the op), under inductor, with values equal to torch SDPA's."""
    q, k, v = _bshd(2, 4, 9, 16, 1, grad), _bshd(2, 2, 9, 16, 2, grad), _bshd(2, 2, 9, 16, 3, grad)
    cf = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True), fullgraph=True)
    with torch.set_grad_enabled(grad):
        out = cf(q, k, v)
        ref = TORCH_SDPA(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert out.transpose(1, 2).is_contiguous(), out.stride()
    if grad:
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), g)
        for a, b, t in zip(grads, torch.autograd.grad(ref, (q, k, v), g), (q, k, v)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
            assert a.stride() == t.stride(), (a.stride(), t.stride())


def test_compiled_layouts_with_size_one_dims(sdpa_policy):
    """One query row and one head (size-1 dimensions, whose strides a kernel may set freely): the op's
    results still carry exactly the strides its fake registration promised (inductor checks them)."""
    q, k, v = _bshd(3, 1, 1, 8, 4, False), _bshd(3, 1, 5, 8, 5, False), _bshd(3, 1, 5, 8, 6, False)
    out = torch.compile(lambda q, k, v: attntune.attention(q, k, v) * 2.0, fullgraph=True)(q, k, v)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v) * 2.0, atol=1e-5, rtol=1e-5)
    q, k, v = (torch.randn(2, 3, 1, 8), torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8))
    out = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True) + 1.0, fullgraph=True)(q, k, v)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v) + 1.0, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["fixed:sdpa_default", "fixed:triton_flash"])
def test_gpu_compiled_outputs_and_grads_keep_a_models_layout(monkeypatch, policy):
    monkeypatch.setenv("ATTNTUNE_POLICY", policy)
    torch._dynamo.reset()
    attntune.reset()
    dev = torch.device("cuda")
    q, k, v = (_bshd(2, h, 130, 64, i, False).to(dev, torch.bfloat16).requires_grad_(True)
               for i, h in enumerate((8, 2, 2)))
    out = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True), fullgraph=True)(q, k, v)
    ref = TORCH_SDPA(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    assert_close(out, ref, "bfloat16")
    assert out.transpose(1, 2).is_contiguous(), out.stride()
    g = torch.randn_like(out)
    for a, b, t, what in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g.float()),
                             (q, k, v), ("dq", "dk", "dv")):
        assert_close(a, b, "bfloat16", backward=True, what=what)
        assert a.stride() == t.stride(), (what, a.stride(), t.stride())
    attntune.reset()
    torch._dynamo.reset()


def test_in_layout_copies_only_where_a_stride_is_used():
    """The layout rule: a tensor already in the reference's layout — size-1 dimensions' strides aside (one
    query row: a decode kernel's contiguous output is not copied) — is returned as is; otherwise it is copied
    into exactly the fake registration's strides."""
    from attntune.policies.dispatch import _empty_like_layout, _in_layout

    ref = torch.randn(2, 5, 3, 8).transpose(1, 2)  # [B, H=3, S=5, D] in [B, S, H, D] memory
    t = torch.randn(2, 3, 5, 8)  # contiguous [B, H, S, D]: must move
    moved = _in_layout(t, ref)
    assert moved is not t and moved.stride() == _empty_like_layout(ref, t.shape).stride()
    torch.testing.assert_close(moved, t, atol=0, rtol=0)
    assert _in_layout(moved, ref) is moved
    one_row = torch.randn(2, 3, 1, 8)  # contiguous, S = 1: same memory order as [B, S, H, D]
    assert _in_layout(one_row, torch.randn(2, 1, 3, 8).transpose(1, 2)) is one_row
    assert _in_layout(t, torch.randn(2, 3, 5, 8)) is t
