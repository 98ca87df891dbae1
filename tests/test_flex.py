"""The FlexAttention variant against the float64 reference (run directly on the CPU: supports() keeps it
to GPUs because every new shape costs an inductor compile)."""

import pytest
import torch

from attntune.kernels import registry
from attntune.kernels.reference import reference_attention
from attntune.problem import problem_from_tensors

from helpers import assert_close, rand_qkv

flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="this torch has no FlexAttention")


def test_flex_matches_reference_causal_window_gqa_and_empty_rows():
    var = registry.get("flex")
    # one shape (one compile): bottom-right causal with more queries than keys -> empty leading rows,
    # a left window, GQA 2:1, odd lengths, a custom scale
    q, k, v = rand_qkv(2, 4, 2, 37, 29, 64, seed=11)
    p = problem_from_tensors(q, k, v, causal=True, window=(5, 0), scale=0.3)
    out = var.run(q, k, v, p, {})
    ref = reference_attention(q, k, v, p)
    assert_close(out, ref, "float32", what="flex causal+window")
    assert out[:, :, :8].abs().max() == 0  # rows 0..7 see no key (off = -8)


@pytest.mark.gpu  # FlexAttention has no CPU backward
def test_flex_gradients():
    var = registry.get("flex")
    q, k, v = rand_qkv(1, 2, 2, 33, 33, 64, device="cuda", requires_grad=True, seed=5)
    p = problem_from_tensors(q, k, v, causal=True)
    out = var.run(q, k, v, p, {})
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = torch.autograd.grad(reference_attention(q64, k64, v64, p), (q64, k64, v64), g.double())
    for a, b, name in zip(got, want, ("dq", "dk", "dv")):
        assert_close(a, b, "float32", backward=True, what=name)


def test_flex_supports_reasons():
    var = registry.get("flex")
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    p = problem_from_tensors(q, k, v, kv_lens=torch.tensor([8], dtype=torch.int32))
    reasons = var.supports(p)
    assert any("CUDA" in r for r in reasons) and any("kv_lens" in r for r in reasons)
