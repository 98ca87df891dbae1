"""The FP8 cache append kernel (kernels/fp8_cache): one launch writes ``fp8.quantize``'s codes, bit for bit, into
the next slots of a K and a V cache — every rounding case of both formats (each code, each tie between two codes
and the floats beside it, subnormals, saturation, infinities, NaN, signed zero), odd shapes and strides, both V
layouts, per-head and per-tensor scales; slots past the cache's end are dropped, not written out of bounds; the
FP8StaticLayer takes it on a GPU. CPU: the Triton interpreter (conftest)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from attntune import fp8  # noqa: E402
from attntune.kernels.fp8_cache.launch import KVAppender, append_kv_  # noqa: E402

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


def _rounding_cases(fdt: torch.dtype) -> torch.Tensor:
    """float32 values covering every rounding decision of ``fdt``: each finite code's value, the midpoint of each
    pair of neighbouring codes (a tie) and the float32 neighbours of code values and midpoints, both signs, zero,
    ±inf, NaN and values past the largest finite code."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fdt).float()
    pos = torch.unique(codes[torch.isfinite(codes) & (codes >= 0)])  # ascending, 0 first
    mids = (pos[1:] + pos[:-1]) / 2  # exact in float32 (two float8 values)
    base = torch.cat([pos, mids, torch.tensor([pos[-1] * 1.01, pos[-1] * 3, 1e30])])
    near = torch.cat([torch.nextafter(base, torch.tensor(float("inf"))),
                      torch.nextafter(base, torch.tensor(0.0)), base])
    vals = torch.cat([near, -near, torch.tensor([float("inf"), -float("inf"), float("nan"), -float("nan"), -0.0])])
    return vals


def _append(k_cache, v_cache, k, v, ks, vs, pos):
    append_kv_(k_cache, v_cache, k, v, ks, vs, torch.tensor(pos))


@pytest.mark.parametrize("fdt", FORMATS)
def test_every_rounding_case_matches_quantize(fdt):
    vals = _rounding_cases(fdt)
    d = 64
    n = -(-vals.numel() // d)
    x = torch.cat([vals, torch.zeros(n * d - vals.numel())]).view(1, 1, n, d)
    one = torch.ones(1)
    kc, vc = torch.zeros(1, 1, n + 3, d, dtype=fdt), torch.zeros(1, 1, n + 3, d, dtype=fdt)
    _append(kc, vc, x, -x, one, one, 2)
    for cache, src in ((kc, x), (vc, -x)):
        want = fp8.quantize(src, one, fdt).view(torch.uint8)
        got = cache.view(torch.uint8)[:, :, 2:2 + n]
        bad = (got != want).nonzero()
        assert bad.numel() == 0, [(src[tuple(i)].item(), got[tuple(i)].item(), want[tuple(i)].item())
                                  for i in bad[:8]]


@pytest.mark.parametrize("fdt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("v_layout", ["d", "keys"])
@pytest.mark.parametrize("n,pos", [(1, 0), (1, 9), (5, 3), (19, 1)])
def test_odd_shapes_strides_and_scales_match_quantize(fdt, dtype, v_layout, n, pos):
    """B=2, H=3, DK=72, DV=40 (not powers of two), keys as a transposed [B, n, H, D] view, per-head K scales and
    one V scale; magnitudes from 1e-9 to 1e3 (subnormal codes to saturation). Slots before ``pos`` and after
    ``pos + n`` stay as they were."""
    g = torch.Generator().manual_seed(n * 31 + pos)
    B, H, L, DK, DV = 2, 3, 24, 72, 40
    k = (torch.randn(B, n, H, DK, generator=g) * torch.logspace(-9, 3, DK)).to(dtype).transpose(1, 2)
    v = (torch.randn(B, H, n, DV, generator=g) * 30).to(dtype)
    ks, vs = torch.rand(H, generator=g) + 0.25, torch.tensor([0.6])
    fill = torch.randint(0, 256, (B, H, L, max(DK, DV)), generator=g, dtype=torch.uint8)
    kc = fill[..., :DK].clone().view(fdt)
    if v_layout == "keys":
        vc = fill[..., :DV].transpose(-1, -2).contiguous().view(fdt).transpose(-1, -2)
    else:
        vc = fill[..., :DV].clone().view(fdt)
    k_before, v_before = kc.view(torch.uint8).clone(), vc.view(torch.uint8).clone()
    _append(kc, vc, k, v, ks, vs, pos)
    for cache, before, src, s in ((kc, k_before, k, ks), (vc, v_before, v, vs)):
        got = cache.view(torch.uint8)
        assert torch.equal(got[:, :, pos:pos + n], fp8.quantize(src, s, fdt).view(torch.uint8))
        assert torch.equal(got[:, :, :pos], before[:, :, :pos])
        assert torch.equal(got[:, :, pos + n:], before[:, :, pos + n:])


def test_tokens_past_the_cache_end_are_dropped_not_written_out_of_bounds():
    """Caches of L=6 slots cut from a larger buffer: appending 5 tokens at slot 4 writes slots 4 and 5 and
    leaves the rest of the buffer (slots 6.. of the same rows) untouched."""
    buf = torch.full((1, 2, 9, 16), 7, dtype=torch.uint8)
    kc = buf[:, :, :6].view(torch.float8_e4m3fn)
    vbuf = torch.full((1, 2, 9, 16), 9, dtype=torch.uint8)
    vc = vbuf[:, :, :6].view(torch.float8_e4m3fn)
    k = torch.randn(1, 2, 5, 16)
    one = torch.ones(1)
    _append(kc, vc, k, k, one, one, 4)
    want = fp8.quantize(k, one).view(torch.uint8)
    assert torch.equal(buf[:, :, 4:6], want[:, :, :2]) and torch.equal(vbuf[:, :, 4:6], want[:, :, :2])
    assert buf[:, :, 6:].eq(7).all() and vbuf[:, :, 6:].eq(9).all() and buf[:, :, :4].eq(7).all()


def test_bad_arguments_are_refused_naming_them():
    kc = torch.zeros(1, 2, 8, 16, dtype=torch.float8_e4m3fn)
    k, one = torch.randn(1, 2, 1, 16), torch.ones(1)
    pos = torch.tensor(0)
    with pytest.raises(ValueError, match="k_cache/v_cache: expected one float8 format"):
        append_kv_(kc.float(), kc, k, k, one, one, pos)
    with pytest.raises(ValueError, match="k/v: expected float16/bfloat16/float32"):
        append_kv_(kc, kc, k.double(), k, one, one, pos)
    with pytest.raises(ValueError, match=r"k/v: expected \[B=1, H=2, n, D\]"):
        append_kv_(kc, kc, torch.randn(1, 3, 1, 16), k, one, one, pos)
    with pytest.raises(ValueError, match="v_scale: expected float32"):
        append_kv_(kc, kc, k, k, one, torch.ones(3), pos)
    with pytest.raises(ValueError, match="k_scale: expected float32"):
        append_kv_(kc, kc, k, k, one.double(), one, pos)
    with pytest.raises(ValueError, match="pos: expected one int32/int64 element"):
        append_kv_(kc, kc, k, k, one, one, torch.tensor([0.0]))
    with pytest.raises(ValueError, match=r"k_cache/v_cache: expected \[B, H, L, DK\] and \[B, H, L, DV\]"):
        append_kv_(kc, kc[:, :1], k, k, one, one, pos)


def test_an_appender_plans_once_per_shape_and_sees_its_caches_refilled():
    """A layer keeps one :class:`KVAppender` for its buffers: repeated steps of one shape reuse one plan, a new
    shape gets its own, and each call reads the current ``pos`` and inputs (nothing but the plan is cached)."""
    kc = torch.zeros(1, 2, 8, 16, dtype=torch.float8_e4m3fn)
    vc = torch.zeros(1, 2, 8, 16, dtype=torch.float8_e4m3fn)
    one = torch.ones(1)
    app = KVAppender(kc, vc, one, one)
    pos = torch.tensor(0)
    for step in range(3):
        x = torch.full((1, 2, 1, 16), float(step + 1))
        app(x, -x, pos)
        pos += 1
    assert len(app._plans) == 1
    app(torch.ones(1, 2, 3, 16), torch.ones(1, 2, 3, 16), pos)
    assert len(app._plans) == 2
    assert kc[0, 0, :6, 0].float().tolist() == [1.0, 2.0, 3.0, 1.0, 1.0, 1.0]
    assert vc[0, 1, :3, 5].float().tolist() == [-1.0, -2.0, -3.0]


@pytest.mark.gpu
@pytest.mark.parametrize("fdt", FORMATS)
def test_gpu_append_matches_quantize_bit_for_bit(fdt):
    """On the GPU (compiled integer encoding, ``div_rn``): every rounding case and a random odd-shaped append
    into a keys-contiguous V cache equal ``fp8.quantize``'s codes."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    vals = _rounding_cases(fdt).cuda()
    d = 128
    n = -(-vals.numel() // d)
    x = torch.cat([vals, torch.zeros(n * d - vals.numel(), device="cuda")]).view(1, 1, n, d)
    one = torch.ones(1, device="cuda")
    kc = torch.zeros(1, 1, n, d, dtype=fdt, device="cuda")
    vc = torch.zeros(1, 1, d, n, dtype=fdt, device="cuda").transpose(-1, -2)
    append_kv_(kc, vc, x, x * 0.37, one, one, torch.tensor(0, device="cuda"))
    assert torch.equal(kc.view(torch.uint8), fp8.quantize(x, one, fdt).view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), fp8.quantize(x * 0.37, one, fdt).view(torch.uint8))
    g = torch.Generator(device="cuda").manual_seed(5)
    B, H, L, D = 3, 5, 4099, 96
    kc = torch.zeros(B, H, L, D, dtype=fdt, device="cuda")
    vc = torch.zeros(B, H, D, L, dtype=fdt, device="cuda").transpose(-1, -2)
    for n, pos in ((4000, 0), (1, 4000), (1, 4001), (97, 4002)):
        k = torch.randn(B, H, n, D, generator=g, device="cuda", dtype=torch.bfloat16) * 40
        v = torch.randn(B, H, n, D, generator=g, device="cuda", dtype=torch.bfloat16)
        ks = torch.rand(H, generator=g, device="cuda") + 0.1
        append_kv_(kc, vc, k, v, ks, ks[:1].clone(), torch.tensor(pos, device="cuda"))
        assert torch.equal(kc[:, :, pos:pos + n].view(torch.uint8), fp8.quantize(k, ks, fdt).view(torch.uint8))
        assert torch.equal(vc[:, :, pos:pos + n].view(torch.uint8),
                           fp8.quantize(v, ks[:1], fdt).view(torch.uint8))
