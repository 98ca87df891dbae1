"""Nyström approximate attention and the relative-error measure stored with approximate winners."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from attntune.kernels import error, registry
from attntune.kernels.error import relative_error
from attntune.kernels.nystrom import iterative_pinv, nystrom_attention, segment_means
from attntune.kernels.reference import reference_attention
from attntune.problem import AttentionProblem

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def smooth_qkv(b=1, h=2, s=512, d=32, seed=0):
    """Q and K varying slowly along the sequence (a few low frequencies): the regime where segment-mean
    landmarks summarise neighbouring positions well. V is plain noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, s)
    basis = torch.stack([torch.sin(2 * math.pi * (i + 1) * t + i) for i in range(4)], -1)  # [S, 4]

    def feat():
        return (basis @ torch.randn(d, 4, generator=g).T).expand(b, h, s, d).contiguous()

    return feat().to(DEV), feat().to(DEV), torch.randn(b, h, s, d, generator=g).to(DEV)


def exact(q, k, v):
    p = AttentionProblem(batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2],
                         seqlen_kv=k.shape[2], head_dim=q.shape[3], head_dim_v=v.shape[3], dtype="float32")
    return reference_attention(q, k, v, p)


def test_error_shrinks_as_landmarks_grow():
    q, k, v = smooth_qkv()
    ref = exact(q, k, v)
    errs = [relative_error(nystrom_attention(q, k, v, landmarks=m), ref) for m in (4, 8, 16, 32)]
    assert all(a > b for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.05, errs


@pytest.mark.parametrize("s, landmarks", [(64, 64), (37, 37), (37, 64)])
def test_landmarks_at_least_seqlen_is_exact(s, landmarks):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, s, 16, generator=g).to(DEV) for _ in range(3))
    out = nystrom_attention(q, k, v, landmarks=landmarks)
    torch.testing.assert_close(out.double(), exact(q, k, v), atol=1e-5, rtol=1e-5)


def test_gqa_and_uneven_segments_and_dtypes():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 8, 97, 32, generator=g).to(DEV)
    k = torch.randn(2, 2, 131, 32, generator=g).to(DEV)
    v = torch.randn(2, 2, 131, 48, generator=g).to(DEV)
    ref = exact(q, k, v)
    out = nystrom_attention(q, k, v, landmarks=16)
    assert out.shape == (2, 8, 97, 48) and torch.isfinite(out).all()
    # GQA must equal running on explicitly expanded K/V.
    out_exp = nystrom_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), landmarks=16)
    torch.testing.assert_close(out, out_exp, atol=1e-5, rtol=1e-5)
    # Random (unsmooth) data is Nyström's hard case: the error is large but bounded and finite.
    assert relative_error(out, ref) < 1.5
    out16 = nystrom_attention(q.half(), k.half(), v.half(), landmarks=16)
    assert out16.dtype == torch.float16 and torch.isfinite(out16).all()
    assert relative_error(out16, out) < 1e-2  # fp32 inside: only input/output rounding differs


def test_segment_means_handles_uneven_lengths():
    x = torch.arange(10, dtype=torch.float32).view(1, 10, 1)
    m = segment_means(x, 4)  # segments floor(p*4/10): [0,1,2] [3,4] [5,6,7] [8,9]
    assert m.flatten().tolist() == [1.0, 3.5, 6.0, 8.5]
    assert segment_means(x, 5).flatten().tolist() == [0.5, 2.5, 4.5, 6.5, 8.5]
    assert segment_means(x, 10).flatten().tolist() == list(map(float, range(10)))
    with pytest.raises(ValueError):
        segment_means(x, 11)


def test_iterative_pinv_converges_to_pinv():
    g = torch.Generator().manual_seed(3)
    a = torch.softmax(torch.randn(4, 16, 16, generator=g) * 2, -1).double()
    z = iterative_pinv(a, 30)
    torch.testing.assert_close(z, torch.linalg.pinv(a), atol=1e-6, rtol=1e-6)
    # rectangular (fewer query than key landmarks): still a pseudo-inverse, A Z A = A
    r = torch.softmax(torch.randn(3, 8, 16, generator=g), -1).double()
    zr = iterative_pinv(r, 40)
    torch.testing.assert_close(r @ zr @ r, r, atol=1e-6, rtol=1e-6)


def test_unsupported_masks_raise_and_are_reported():
    q = k = v = torch.randn(1, 1, 8, 8)
    with pytest.raises(ValueError, match="causal"):
        nystrom_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="kv_lens"):
        nystrom_attention(q, k, v, kv_lens=torch.tensor([8]))
    with pytest.raises(ValueError, match="landmarks"):
        nystrom_attention(q, k, v, landmarks=0)
    var = registry.get("nystrom")
    base = dict(batch=1, heads_q=2, heads_kv=2, seqlen_q=4096, seqlen_kv=4096, head_dim=64, head_dim_v=64,
                dtype="bfloat16", approx=True)
    assert var.supports(AttentionProblem(**base)) == []
    for needle, kw in {"causal": dict(causal=True), "window": dict(window=(64, 64)),
                       "kv_lens": dict(kv_lens=True)}.items():
        assert any(needle in r for r in var.supports(AttentionProblem(**{**base, **kw}))), needle
    # Approximate: never a candidate unless the call allows approximation.
    p_exact = AttentionProblem(**{**base, "approx": False})
    assert any("approximate" in r for r in registry.reasons(var, p_exact))
    assert var not in registry.candidates(p_exact)
    assert var in registry.candidates(AttentionProblem(**base))


def test_variant_space_and_run():
    var = registry.get("nystrom")
    assert var.exact is False and var.family == "torch"
    p = AttentionProblem(batch=1, heads_q=2, heads_kv=2, seqlen_q=512, seqlen_kv=512, head_dim=32,
                         head_dim_v=32, dtype="float32", approx=True, device_type=DEV)
    sp = var.space(p)
    assert sp.names == ("landmarks", "pinv_iters") and sp.validate(sp.default) == []
    assert sp.validate({"landmarks": 48, "pinv_iters": 6})  # outside the domain
    q, k, v = smooth_qkv()
    out = var.run(q, k, v, p, {"landmarks": 32, "pinv_iters": 6})
    assert relative_error(out, exact(q, k, v)) < 0.05
    p_scaled = p.model_copy(update={"scale": 0.05})
    out_scaled = var.run(q, k, v, p_scaled, {"landmarks": 512, "pinv_iters": 6})
    torch.testing.assert_close(out_scaled.double(), reference_attention(q, k, v, p_scaled), atol=1e-5, rtol=1e-5)


def test_relative_error():
    assert doctest.testmod(error, raise_on_error=False).failed == 0
    ref = torch.randn(4, 5, dtype=torch.float64)
    assert relative_error(ref.float(), ref) < 1e-7
    assert relative_error(2 * ref, ref) == pytest.approx(1.0)
    assert relative_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert relative_error(torch.ones(3), torch.zeros(3)) == math.inf
    assert math.isnan(relative_error(torch.tensor([float("nan"), 1.0]), torch.ones(2)))
    with pytest.raises(ValueError, match="shapes"):
        relative_error(torch.ones(3), torch.ones(4))
