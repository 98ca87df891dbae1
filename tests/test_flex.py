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


def test_untuned_window_training_goes_to_ours_first_with_flex_behind(monkeypatch):
    """The heuristic's local-training rule (a GPU faked: every variant usable): window training, whatever its
    head dim or window, plans triton_local with triton_flash as runner-up and Flex after them; a
    forward-only D64 window takes the "local" rule."""
    from attntune.policies import policy
    from attntune.problem import AttentionProblem

    monkeypatch.setattr(policy, "usable", lambda name, config, problem, quarantine: [])

    def plan(d, left, mode="fwd_bwd"):
        p = AttentionProblem(batch=1, heads_q=8, heads_kv=2, seqlen_q=4099, seqlen_kv=4099, head_dim=d, head_dim_v=d,
                             dtype="bfloat16", device_type="cuda", causal=True, window=(left, 0), mode=mode)
        return policy.heuristic_plan(p, None, set())

    for d, left in ((128, 1023), (64, 1023), (64, 127), (80, 4095)):
        got = plan(d, left)
        assert (got.impl.name, got.runner_up) == ("triton_local", "triton_flash"), (d, left, got.reasons)
        assert any("rule local-training:" in r for r in got.reasons)
    fwd = plan(64, 1023, mode="fwd")
    assert fwd.impl.name == "triton_local" and not any("local-training" in r for r in fwd.reasons)
    (rule,) = [r for r in policy.HEURISTIC_RULES if r.name == "local-training"]
    assert rule.prefer.index("flex") > rule.prefer.index("triton_local")
