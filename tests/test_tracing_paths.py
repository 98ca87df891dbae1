"""attntune inside PyTorch's machinery beyond plain eager calls: torch.func transforms and forward-mode AD,
autocast (eager and compiled), nested tensors. Each test failed before its fix (audit of 2026-12-05).

* A variant that fails under a torch.func transform (torch's CPU flash kernel has no forward-AD formula;
  the mask builder cannot take a vmapped ``kv_lens`` with a causal mask) was quarantined for the whole
  process: one ``jvp`` sent every later call of every shape to the eager fallback.
* Under ``torch.autocast`` torch's SDPA runs in the autocast dtype; compiled attntune calls returned
  float32 where torch (and eager attntune) return bfloat16, and eager calls were planned as float32.
* Nested tensors reached ``attention()``'s shape arithmetic and failed with internal errors.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import jvp, vmap

import attntune
from attntune import tolerances
from attntune.kernels.reference import reference_attention
from attntune.problem import problem_from_tensors
from helpers import rand_qkv


@pytest.fixture(autouse=True)
def _fresh_runtime():
    attntune.reset()
    torch._dynamo.reset()
    yield
    attntune.reset()
    torch._dynamo.reset()


def _tol(dtype: torch.dtype):
    return tolerances.fwd_tol(str(dtype).split(".")[1])


def _ref(q, k, v, **kw):
    """attntune's semantics (bottom-right causal) in float64, differentiable (forward mode too)."""
    return reference_attention(q, k, v, problem_from_tensors(q, k, v, **kw), kw.get("kv_lens")).to(q.dtype)


# ---- torch.func / forward-mode AD ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_mode_ad_is_right_and_quarantines_nothing(dtype):
    q, k, v = (t.to(dtype) for t in rand_qkv(2, 4, 2, 5, 7, 16, seed=1))
    tq = torch.randn_like(q)
    out, tangent = jvp(lambda a: attntune.attention(a, k, v, causal=True), (q,), (tq,))
    ref_out, ref_tangent = jvp(lambda a: _ref(a, k, v, causal=True), (q,), (tq,))
    atol, rtol = _tol(dtype)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(tangent.float(), ref_tangent.float(), atol=4 * atol, rtol=4 * rtol)
    # torch's kernel lacking a forward-AD formula is no fault of the variant for ordinary calls
    assert attntune.stats()["quarantined"] == []
    q2, k2, v2 = (t.to(dtype) for t in rand_qkv(1, 2, 2, 9, 9, 16, seed=2))
    attntune.attention(q2, k2, v2)
    assert {p["variant"] for p in attntune.stats()["plans"]} == {"sdpa_default"}


def test_vmap_over_kv_lens_with_a_causal_mask_is_refused_clearly_and_quarantines_nothing():
    q, k, v = rand_qkv(3, 4, 2, 2, 9, 16, seed=3)
    q, k, v = q.view(3, 1, 4, 2, 16), k.view(3, 1, 2, 9, 16), v.view(3, 1, 2, 9, 16)
    lens = torch.tensor([[3], [9], [0]])
    with pytest.raises(NotImplementedError, match="kv_lens.*vmap"):
        vmap(lambda a, b, c, n: attntune.attention(a, b, c, kv_lens=n, causal=True))(q, k, v, lens)
    assert attntune.stats()["quarantined"] == []
    # what does work under vmap keeps working: kv_lens without a mask, and kv_lens shared (in_dims None)
    out = vmap(lambda a, b, c, n: attntune.attention(a, b, c, kv_lens=n))(q, k, v, lens)
    ref = torch.stack([_ref(q[i], k[i], v[i], kv_lens=lens[i]) for i in range(3)])
    torch.testing.assert_close(out, ref, atol=3e-4, rtol=2e-5)
    out = vmap(lambda a, b, c: attntune.attention(a, b, c, kv_lens=lens[1], causal=True))(q, k, v)
    ref = torch.stack([_ref(q[i], k[i], v[i], kv_lens=lens[1], causal=True) for i in range(3)])
    torch.testing.assert_close(out, ref, atol=3e-4, rtol=2e-5)
    assert {p["variant"] for p in attntune.stats()["plans"]} == {"sdpa_default"}


# ---- autocast ---------------------------------------------------------------------------------------
def test_autocast_runs_in_the_autocast_dtype_as_torch_eager_and_compiled():
    q, k, v = rand_qkv(2, 4, 4, 5, 5, 16, seed=4)  # float32 inputs
    atol, rtol = _tol(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert want.dtype == torch.bfloat16
        eager = attntune.attention(q, k, v, causal=True)  # Sq == Skv: both alignments agree
        compiled = torch.compile(lambda a, b, c: attntune.attention(a, b, c, causal=True), fullgraph=True)(q, k, v)
        with attntune.dispatch():
            routed = torch.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
                                   fullgraph=True)(q, k, v)
    for out in (eager, compiled, routed):
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), want.float(), atol=atol, rtol=rtol)
    # the plans are those of what runs: bfloat16 problems, never the float32 ones
    assert all("bfloat16" in p["problem"] for p in attntune.stats()["plans"])
    # gradients reach the float32 leaves, as through torch's autocast
    qg = q.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attntune.attention(qg, k, v, causal=True).float().sum().backward()
    assert qg.grad is not None and qg.grad.dtype == torch.float32
    # float64 is not autocast (as torch): it stays float64
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attntune.attention(q.double(), k.double(), v.double()).dtype == torch.float64


# ---- nested tensors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_nested_tensors_are_refused_naming_the_argument(layout):
    nt = torch.nested.nested_tensor([torch.randn(5, 2, 16), torch.randn(7, 2, 16)], layout=layout).transpose(1, 2)
    with pytest.raises(ValueError, match="q: nested tensors are not supported"):
        attntune.attention(nt, nt, nt)

