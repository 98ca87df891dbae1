"""FP8 KV caches: the quantiser (attntune.fp8) and the decode op reading float8 codes with scales.

The op is compared with the float64 reference on the *dequantised* cache (codes * scales): that is its
exact semantics, so the tolerance is q's dtype's, not FP8's. On the CPU the kernel runs under the Triton
interpreter; bf16 q works there too, because the kernel's dots over FP8 codes run in fp16 whatever q's
dtype (bf16 ``tl.dot`` is what is broken in the interpreter). The ``gpu`` tests add serving shapes.
The quantisation error itself (FP8 against the float cache) is measured, not asserted tightly: about
2^-4 relative per element for e4m3.
"""

from __future__ import annotations

import pytest
import torch

from attntune import fp8
from attntune.kernels.reference import reference_attention
from attntune.kernels.triton_decode.op import decode_attention
from attntune.problem import AttentionProblem, dtype_name
from helpers import assert_close, rand_qkv

HAS_GPU = torch.cuda.is_available()
DEV = "cuda" if HAS_GPU else "cpu"
E4M3 = torch.float8_e4m3fn


def _problem(q, k, causal, with_lens, window=None):
    return AttentionProblem(batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2],
                            seqlen_kv=k.shape[2], head_dim=q.shape[3], head_dim_v=k.shape[3],
                            dtype=dtype_name(q.dtype), device_type=q.device.type, causal=causal,
                            window=window, kv_lens=with_lens)


def _case(b, hq, hkv, sq, s, d, dtype=torch.float16, per="head", fmt=E4M3, seed=0, spread=True):
    q, k, v = rand_qkv(b, hq, hkv, sq, s, d, dtype=torch.float32, device=DEV, seed=seed)
    if spread:  # heads of very different magnitude: per-head scales matter
        mag = torch.logspace(-2, 2, hkv, device=DEV).view(1, hkv, 1, 1)
        k, v = k * mag, v * mag.flip(1)
    k8, v8, ks, vs = fp8.quantize_kv(k, v, per=per, dtype=fmt)
    return q.to(dtype), k8, v8, ks, vs


def _check(q, k8, v8, ks, vs, lens=None, causal=False, window=None, config=None):
    out = decode_attention(q, k8, v8, kv_lens=lens, causal=causal, window=window, config=config,
                           k_scale=ks, v_scale=vs)
    kd, vd = fp8.dequantize(k8, ks), fp8.dequantize(v8, vs)
    ref = reference_attention(q, kd, vd, _problem(q, k8, causal, lens is not None, window), lens)
    assert out.dtype == q.dtype and out.shape == q.shape[:3] + (v8.shape[3],)
    # heads of different magnitude: compare each query head in units of its values' scale (the dtype's
    # tolerances assume unit-sized values; an output of size 100 rounds at 100x their atol)
    per_kv = vs.view(-1).expand(k8.shape[1]) * torch.finfo(v8.dtype).max  # each kv head's largest value
    unit = per_kv.repeat_interleave(q.shape[1] // k8.shape[1]).view(1, -1, 1, 1)
    assert_close(out / unit.to(out.dtype), (ref / unit.double()), dtype_name(q.dtype))
    return out


# ---- the quantiser ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", fp8.FORMATS)
@pytest.mark.parametrize("per", ["head", "tensor"])
def test_quantise_round_trip_within_the_format_precision(fmt, per):
    _, k, v = rand_qkv(3, 4, 4, 1, 37, 24, seed=3)
    k = k * torch.logspace(-3, 3, 4).view(1, 4, 1, 1)
    k8, v8, ks, vs = fp8.quantize_kv(k, v, per=per, dtype=fmt)
    assert k8.dtype == fmt and ks.dtype == torch.float32 and ks.shape == ((4,) if per == "head" else (1,))
    mant = {torch.float8_e5m2: 2}.get(fmt, 3)  # mantissa bits
    for x, c, s in ((k, k8, ks), (v, v8, vs)):
        back = fp8.dequantize(c, s)
        # relative to each head's own scale: half a unit in the last place of the largest binade
        amax = x.abs().amax(dim=(0, 2, 3), keepdim=True) if per == "head" else x.abs().amax()
        assert ((back - x).abs() <= amax * 2.0 ** -(mant + 1) + 1e-30).all()
        # the largest value maps to the format's largest finite code, nothing saturates or overflows
        assert torch.isfinite(c.float()).all()


def test_zero_heads_get_scale_one_and_saturation_is_clamped():
    x = torch.zeros(1, 2, 3, 4)
    x[0, 1] = 5.0
    s = fp8.scales(x)
    assert s[0].item() == 1.0 and s[1].item() == pytest.approx(5.0 / 448.0, rel=1e-6)
    big = fp8.quantize(x * 10, s)  # 50 / (5/448) = 4480 > 448: saturates at 448
    assert big.float().max().item() == 448.0 and torch.isfinite(big.float()).all()
    assert torch.equal(fp8.quantize(x, s).float()[0, 0], torch.zeros(3, 4))


def test_quantiser_argument_errors():
    x = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="dtype"):
        fp8.scales(x, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="per"):
        fp8.scales(x, per="row")
    with pytest.raises(ValueError, match="margin"):
        fp8.scales(x, margin=0.5)
    with pytest.raises(ValueError, match="x:"):
        fp8.scales(x[0])
    with pytest.raises(ValueError, match="inf or NaN"):
        fp8.scales(x.index_fill(3, torch.tensor([0]), float("inf")))
    with pytest.raises(ValueError, match="scale"):
        fp8.quantize(x, torch.ones(3))


# ---- the decode op on FP8 caches -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("per", ["head", "tensor"])
@pytest.mark.parametrize("hq, hkv, sq, causal", [(4, 2, 1, False), (6, 3, 3, True), (4, 4, 2, False)])
def test_fp8_cache_matches_reference_on_dequantised_cache(dtype, per, hq, hkv, sq, causal):
    q, k8, v8, ks, vs = _case(3, hq, hkv, sq, 45, 24, dtype=dtype, per=per, seed=hq + sq)
    lens = torch.tensor([45, 1, 30], dtype=torch.int32, device=DEV)
    _check(q, k8, v8, ks, vs, lens=lens, causal=causal)


def test_fp8_cache_splits_window_and_e5m2():
    q, k8, v8, ks, vs = _case(2, 4, 2, 1, 70, 16, fmt=torch.float8_e5m2, seed=7)
    a = _check(q, k8, v8, ks, vs, window=(20, -1), config={"BLOCK_N": 16, "num_splits": 3})
    b = _check(q, k8, v8, ks, vs, window=(20, -1), config={"BLOCK_N": 16, "num_splits": 1})
    torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)  # split count changes rounding only


def test_bf16_queries_beyond_fp16_range_saturate_instead_of_overflowing():
    """The dots over FP8 codes run in fp16 (kernels/triton_decode/jit.py): a bf16 q element past fp16's
    largest finite value is rounded to ±65504, not inf — the output equals the reference with q clamped
    there, and is finite."""
    q, k8, v8, ks, vs = _case(2, 4, 2, 1, 33, 16, dtype=torch.bfloat16, seed=5, spread=False)
    q = q * 1e-4  # the scores stay moderate although one element is huge: its key column is zeroed below
    q[0, 1, 0, 3], q[1, 2, 0, 7] = 3e5, -1e6
    k8[:, :, :, 3] = 0
    k8[:, :, :, 7] = 0
    out = decode_attention(q, k8, v8, k_scale=ks, v_scale=vs)
    assert torch.isfinite(out.float()).all()
    kd, vd = fp8.dequantize(k8, ks), fp8.dequantize(v8, vs)
    ref = reference_attention(q.double().clamp(-65504, 65504), kd, vd, _problem(q, k8, False, False))
    assert_close(out, ref, "bfloat16")


def test_fp8_cache_error_against_the_float_cache_is_small():
    """What FP8 costs: the output on the FP8 cache against the output on the float cache it came from."""
    q, k, v = rand_qkv(2, 4, 2, 1, 64, 32, dtype=torch.float32, device=DEV, seed=11)
    k8, v8, ks, vs = fp8.quantize_kv(k, v)
    out = decode_attention(q.half(), k8, v8, k_scale=ks, v_scale=vs).float()
    exact = reference_attention(q.double(), k.double(), v.double(), _problem(q, k, False, False)).float()
    rel = ((out - exact).norm() / exact.norm()).item()
    assert rel < 0.08, rel  # e4m3 keeps 3 mantissa bits: ~2-4 % here on random data


def test_fp8_argument_errors():
    q, k8, v8, ks, vs = _case(1, 2, 2, 1, 8, 16)
    with pytest.raises(ValueError, match="k_scale: required"):
        decode_attention(q, k8, v8, v_scale=vs)
    with pytest.raises(ValueError, match="v_scale: required"):
        decode_attention(q, k8, v8, k_scale=ks)
    with pytest.raises(ValueError, match="k_scale: only FP8 caches"):
        decode_attention(q, q.new_zeros(1, 2, 8, 16), q.new_zeros(1, 2, 8, 16), k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="k_scale: expected a float32"):
        decode_attention(q, k8, v8, k_scale=ks.half(), v_scale=vs)
    with pytest.raises(ValueError, match=r"v_scale: expected one scale or a contiguous \[Hkv=2\]"):
        decode_attention(q, k8, v8, k_scale=ks, v_scale=torch.ones(3, device=DEV))
    with pytest.raises(ValueError, match="share one format"):
        decode_attention(q, k8, v8.to(torch.float8_e5m2), k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="q: with FP8"):
        decode_attention(q.float(), k8, v8, k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="q: dtype"):
        decode_attention(q.to(E4M3), k8, v8, k_scale=ks, v_scale=vs)


# ---- V stored keys-contiguous (fp8.V_LAYOUTS) ---------------------------------------------------------------
def test_keys_contiguous_v_is_the_same_cache_and_the_same_output():
    """``quantize_kv(v_layout="keys")`` holds the same codes in ``[B, Hkv, D, S]`` storage; the decode kernel
    reads it with the keys as the contiguous axis — whole tiles unmasked, the tail tile masked — and gives
    bitwise the output of the ``"d"`` layout (same tiles, same order) at odd lengths, splits and windows."""
    q, k, v = rand_qkv(3, 6, 3, 2, 77, 24, dtype=torch.float32, device=DEV, seed=11)
    k8, v8, ks, vs = fp8.quantize_kv(k, v)
    k8b, v8k, ksb, vsb = fp8.quantize_kv(k, v, v_layout="keys")
    assert v8k.shape == v8.shape and v8k.stride(2) == 1 and v8k.stride(3) == 77
    assert torch.equal(v8k.view(torch.uint8), v8.view(torch.uint8)) and torch.equal(k8b.view(torch.uint8),
                                                                                   k8.view(torch.uint8))
    q = q.half()
    lens = torch.tensor([77, 5, 40], dtype=torch.int32, device=DEV)
    for window, cfg in ((None, {"BLOCK_N": 16, "num_splits": 3}), (None, {"BLOCK_N": 32, "num_splits": 1}),
                        ((20, 0), {"BLOCK_N": 16, "num_splits": 2})):
        a = _check(q, k8, v8, ks, vs, lens=lens, causal=True, window=window, config=cfg)
        b = _check(q, k8, v8k, ks, vs, lens=lens, causal=True, window=window, config=cfg)
        assert torch.equal(a, b), (window, cfg)
    with pytest.raises(ValueError, match="v_layout"):
        fp8.quantize_kv(k, v, v_layout="s")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b, hq, hkv, sq, s, d", [(1, 32, 8, 1, 8192, 128), (17, 32, 8, 1, 1025, 64),
                                                  (4, 16, 16, 4, 3000, 80)])
@pytest.mark.parametrize("per", ["head", "tensor"])
def test_gpu_fp8_cache(dtype, b, hq, hkv, sq, s, d, per):
    q, k8, v8, ks, vs = _case(b, hq, hkv, sq, s, d, dtype=dtype, per=per, seed=b + d)
    lens = torch.randint(1, s + 1, (b,), device=DEV, dtype=torch.int32)
    lens[0] = s
    for causal, window in ((False, None), (True, None), (True, (1023, 0))):
        _check(q, k8, v8, ks, vs, lens=lens, causal=causal, window=window)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_quantize_equals_the_float32_quotient_rounded_and_saturated(dtype, fmt):
    """fp8.quantize divides 16-bit and float32 inputs without widening them first: the codes are bit for bit
    those of ``(x.float() / scale).clamp(-max, max).to(format)``, saturation included."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 3, 7, 5, generator=g) * 40).to(dtype)
    x[0, 1, 2, 3] = 6e4 if dtype == torch.float16 else 1e6  # far past scale * max: saturates
    scale = torch.tensor([0.5, 0.013, 3.0])
    fmax = torch.finfo(fmt).max
    want = (x.float() / scale.view(1, -1, 1, 1)).clamp(-fmax, fmax).to(fmt)
    got = fp8.quantize(x, scale, fmt)
    assert got.dtype == fmt and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert got[0, 1, 2, 3].float() == fmax
