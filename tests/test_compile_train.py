"""A training call under torch.compile: ``attntune::attention_train`` keeps the forward's residuals of a
variant that splits forward and backward (the flash kernels' output and row LSE), and its backward runs
that variant's backward from them instead of recomputing the forward. CPU: triton_flash interpreted, fp32.
"""

from __future__ import annotations

import pytest
import torch

import attntune
from attntune.kernels import registry
from attntune.kernels.base import Variant
from attntune.kernels.triton_flash import launch
from attntune.policies.dispatch import original_sdpa
from helpers import assert_close, bottom_right_mask as _mask, rand_qkv

TORCH_SDPA = original_sdpa()


@pytest.fixture
def flash_policy(monkeypatch):
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:triton_flash")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the flash kernels run on the CPU only interpreted
    torch._dynamo.reset()
    attntune.reset()
    yield
    attntune.reset()
    torch._dynamo.reset()


def _count(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counted(*a, **kw):
        calls.append(name)
        return real(*a, **kw)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("scale,window", [(None, None), (0.3, (4, 0))])
def test_compiled_training_call_runs_the_forward_once(flash_policy, monkeypatch, scale, window):
    """Gradients equal to SDPA's, and one forward launch per step: the backward reads the kept LSE."""
    fwd = _count(monkeypatch, launch, "forward")
    bwd = _count(monkeypatch, launch, "backward")
    q, k, v = rand_qkv(1, 4, 2, 7, 11, 16, requires_grad=True, seed=3)

    def f(q, k, v):
        return attntune.attention(q * 1.5, k, v, causal=True, window=window, scale=scale).sin()

    out = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    left = None if window is None else window[0]
    ref = torch.sin(TORCH_SDPA(q * 1.5, k, v, attn_mask=_mask(7, 11, left), enable_gqa=True, scale=scale))
    torch.testing.assert_close(out, ref, atol=3e-5, rtol=1e-5)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    for a, b in zip(grads, torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert fwd == ["forward"] and bwd == ["backward"]  # recomputing would launch the forward twice
    assert {p["variant"] for p in attntune.stats()["plans"]} == {"triton_flash"}


def test_a_call_whose_variant_keeps_no_residuals_recomputes(flash_policy, monkeypatch):
    """A negative scale: the flash forward rewrites q, keeps nothing, and the backward recomputes the
    forward — gradients still right."""
    fwd = _count(monkeypatch, launch, "forward")
    q, k, v = rand_qkv(1, 2, 2, 5, 9, 16, requires_grad=True, seed=4)
    out = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True, scale=-0.4), fullgraph=True,
                        backend="aot_eager")(q, k, v)
    ref = TORCH_SDPA(q, k, v, attn_mask=_mask(5, 9), scale=-0.4)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert len(fwd) == 2


def test_compiled_training_with_a_variant_that_does_not_split(monkeypatch):
    """SDPA (the CPU default) keeps no residuals: the train op returns NaN residuals, which its backward
    never reads (it recomputes); gradients equal SDPA's."""
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:sdpa_math")
    torch._dynamo.reset()
    attntune.reset()
    q, k, v = rand_qkv(2, 4, 4, 6, 6, 8, requires_grad=True, seed=5)
    out, lse = torch.ops.attntune.attention_train(q, k, v, None, True, True, -2, -2, None, -1)
    assert out.shape == (2, 4, 6, 8) and lse.shape == (2, 4, 6) and torch.isnan(lse).all()
    cf = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True), fullgraph=True, backend="aot_eager")
    out = cf(q, k, v)
    ref = TORCH_SDPA(q, k, v, attn_mask=_mask(6, 6))
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    attntune.reset()
    torch._dynamo.reset()


def test_inference_under_compile_keeps_the_one_output_op(flash_policy):
    """Without gradients the call stays ``attntune::attention`` (no residuals allocated)."""
    q, k, v = rand_qkv(1, 2, 2, 4, 4, 16)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    with torch.no_grad():
        torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True), fullgraph=True,
                      backend=backend)(q, k, v)
    assert any("attntune.attention." in t or t.endswith("attntune.attention") for t in seen), seen
    assert not any("attention_train" in t for t in seen), seen


@pytest.mark.gpu
@pytest.mark.parametrize("window,dtype", [(None, torch.bfloat16), ((64, 0), torch.float16), (None, torch.float32)])
def test_gpu_compiled_training_call_runs_the_forward_once(monkeypatch, window, dtype):
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:triton_flash")
    torch._dynamo.reset()
    attntune.reset()
    fwd = _count(monkeypatch, launch, "forward")
    dev = torch.device("cuda")
    q, k, v = rand_qkv(2, 8, 2, 200, 333, 64, dtype=dtype, device=dev, requires_grad=True, seed=6)
    cf = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True, window=window), fullgraph=True)
    out = cf(q, k, v)
    left = None if window is None else window[0]
    ref = TORCH_SDPA(q.float(), k.float(), v.float(), attn_mask=_mask(200, 333, left).to(dev), enable_gqa=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    rgrads = torch.autograd.grad(ref, (q, k, v), g.float())
    name = str(dtype).split(".")[-1]
    tf32 = torch.get_float32_matmul_precision() != "highest"
    assert_close(out, ref, name, tf32=tf32)
    for a, b, what in zip(grads, rgrads, ("dq", "dk", "dv")):
        assert_close(a, b, name, backward=True, tf32=tf32, what=what)
    assert len(fwd) == 1
    attntune.reset()
    torch._dynamo.reset()


class _NotInOp(Variant):
    """Exact attention (torch SDPA math) that, like Flex, cannot run inside the compiled op."""

    name = "test_not_in_op"
    runs_in_compiled_op = False
    runs = 0

    def supports(self, problem):
        return [] if problem.device_type == "cpu" and not problem.kv_lens else ["test variant: CPU only"]

    def run(self, q, k, v, problem, config, kv_lens=None):
        type(self).runs += 1
        from attntune.kernels.registry import get

        return get("sdpa_math").run(q, k, v, problem, {}, kv_lens)


@pytest.fixture
def not_in_op(monkeypatch):
    _NotInOp.runs = 0
    registry.register(_NotInOp())
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:" + _NotInOp.name)
    torch._dynamo.reset()
    attntune.reset()
    yield _NotInOp
    attntune.reset()
    registry.unregister(_NotInOp.name)
    torch._dynamo.reset()


@pytest.mark.parametrize("grad", [False, True])
def test_a_variant_that_cannot_run_in_the_op_is_routed_around_under_compile(not_in_op, grad):
    """Flex's compiled flex_attention fails inside the op (H100: a compiled window training step quarantined
    it for the process). Under compile such a variant's problems take the plan decided without it — no
    failure, no warning, no quarantine — and eager calls of the same problem keep it."""
    import warnings

    q, k, v = rand_qkv(1, 4, 2, 6, 10, 16, requires_grad=grad, seed=7)
    ref = TORCH_SDPA(q, k, v, attn_mask=_mask(6, 10), enable_gqa=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a quarantine would warn
        with torch.set_grad_enabled(grad):
            out = torch.compile(lambda q, k, v: attntune.attention(q, k, v, causal=True), fullgraph=True,
                                backend="aot_eager")(q, k, v)
            torch.testing.assert_close(out, ref, atol=3e-5, rtol=1e-5)
            if grad:
                g = torch.randn_like(out)
                for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
                    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
            assert not_in_op.runs == 0
            assert not attntune.stats()["quarantined"]
            eager = attntune.attention(q, k, v, causal=True)
    torch.testing.assert_close(eager, ref, atol=3e-5, rtol=1e-5)
    assert not_in_op.runs == 1  # the eager call kept its plan
