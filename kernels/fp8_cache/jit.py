"""Triton device code of the FP8 cache append (the ``@triton.jit`` layer; no host logic here).

:func:`append_kv_kernel` quantises new keys and values ``[B, Hkv, n, D]`` under per-kv-head (or per-tensor)
float32 scales and writes the codes into the cache slots ``pos .. pos + n - 1``, where ``pos`` is read from a
device tensor (the cache's current length, so the launch is the same every decode step and a CUDA graph can
replay it). One program per (batch ``b`` and kv head ``h``, block of ``BLOCK_T`` new tokens) does K and V.

Semantics, bit for bit those of :func:`attntune.fp8.quantize` followed by a store of the codes:
``code = round_to_nearest_even(clamp(float32(x) / scale[h], -FMAX, FMAX))`` in the float8 format, with
``/`` the IEEE (correctly rounded) float32 division (``div_rn``; Triton's plain ``/`` on CUDA is approximate),
NaN to the format's NaN (``0x7F``, the sign kept), -0.0 to ``0x80``. Slots at or past ``L`` (the cache's
length) are not written: the caller keeps ``pos + n <= L`` (``generate`` refuses a longer run before it starts),
and the mask keeps a violation inside the buffers.

The float8 encoding is integer arithmetic on the float32 bits, not Triton's float8 cast: it is the same on
every backend, the interpreter included (whose own cast loses a round-up's carry: 124.8 -> 64 instead of 128
in e4m3fn, ``tests/interp_fp8.py``), needs no float8 hardware (sm_80; ROCm — untested) and is a handful of
integer instructions on a tile of a few thousand elements. A format is ``MBITS`` mantissa bits and exponent bias
``BIAS`` (e4m3fn 3/7, e5m2 2/15); values below the smallest normal ``2**(1 - BIAS)`` become subnormal codes
``rne(|q| * 2**(BIAS - 1 + MBITS))``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _encode(q, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """float32 ``q`` (already clamped to the format's range, or NaN) -> its float8 code as uint8 (module
    docstring: round to nearest even, integer arithmetic)."""
    bits = q.to(tl.uint32, bitcast=True)
    sign = (bits >> 31) << 7
    a = bits & 0x7FFFFFFF
    DROP: tl.constexpr = 23 - MBITS
    # normal: add half an ulp (minus one, plus the kept lsb: ties to even), drop the low bits, rebias the
    # exponent; a mantissa that rounds up carries into the exponent by itself
    rounded = a + ((1 << (DROP - 1)) - 1) + ((a >> DROP) & 1)
    normal = (rounded >> DROP) - ((127 - BIAS) << MBITS)
    # subnormal: the 24-bit significand shifted right by 23 - (BIAS - 1 + MBITS) - e, rounded to nearest even
    # (a shift of 25 or more leaves 0: the significand is below 2**24, under half of 2**25)
    e = (a >> 23).to(tl.int32) - 127
    m = (a & 0x7FFFFF) | 0x800000
    # clamped to [1, 25] for every lane: normal lanes compute it too (their result is discarded)
    shift = tl.minimum(tl.maximum(23 - (BIAS - 1 + MBITS) - e, 1), 25).to(tl.uint32)
    r = m >> shift
    rem = m & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    sub = r + ((rem > half) | ((rem == half) & ((r & 1) == 1))).to(tl.uint32)
    code = tl.where(e >= 1 - BIAS, normal, sub)
    code = tl.where(a > 0x7F800000, 0x7F, code)  # NaN (the clamp let it through)
    return (code | sign).to(tl.uint8)


@triton.jit
def _quantise_store(x_ptr, c_ptr, s_ptr, b, h, pos, t, n, L,
                    sx_b, sx_h, sx_t, sx_d, sc_b, sc_h, sc_l, sc_d, s_h,
                    D: tl.constexpr, BLOCK_D: tl.constexpr, FMAX: tl.constexpr,
                    MBITS: tl.constexpr, BIAS: tl.constexpr):
    """Tokens ``t`` ``[BLOCK_T]`` of ``x[b, h]`` quantised under ``scale[h * s_h]`` into ``c[b, h, pos + t]``."""
    d = tl.arange(0, BLOCK_D)
    ok = (t[:, None] < n) & (d[None, :] < D)
    x = tl.load(x_ptr + b * sx_b + h * sx_h + t[:, None] * sx_t + d[None, :] * sx_d, mask=ok, other=0.0)
    q = tl.math.div_rn(x.to(tl.float32), tl.load(s_ptr + h * s_h))
    q = tl.where(q != q, q, tl.minimum(tl.maximum(q, -FMAX), FMAX))  # keep NaN: max/min would drop it
    slot = pos + t
    tl.store(c_ptr + b * sc_b + h * sc_h + slot[:, None] * sc_l + d[None, :] * sc_d, _encode(q, MBITS, BIAS),
             mask=ok & (slot[:, None] < L))


@triton.jit
def append_kv_kernel(k_ptr, v_ptr, ck_ptr, cv_ptr, ks_ptr, vs_ptr, pos_ptr, n, H, L,
                     sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
                     sck_b, sck_h, sck_l, sck_d, scv_b, scv_h, scv_l, scv_d, ks_h, vs_h,
                     DK: tl.constexpr, DV: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                     BLOCK_T: tl.constexpr, FMAX: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """Grid ``(B * H, cdiv(n, BLOCK_T))`` (B * H on the axis without the 65535 limit): new keys ``k``
    ``[B, H, n, DK]`` and values ``v`` ``[B, H, n, DV]`` (any strides) into the uint8 views of the caches ``ck``
    ``[B, H, L, DK]``, ``cv`` ``[B, H, L, DV]`` (any strides: a keys-contiguous V is ``scv_l == 1``) at slots
    ``pos .. pos + n - 1``, ``pos = *pos_ptr``.
    ``ks_h``/``vs_h``: 1 for per-head scales ``[H]``, 0 for one scale ``[1]``."""
    bh = tl.program_id(0)
    # 64-bit row offsets: b * stride passes 2**31 in a cache of more than 2 GiB (e.g. B 64, H 8, L 32k, D 128)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    pos = tl.load(pos_ptr)
    _quantise_store(k_ptr, ck_ptr, ks_ptr, b, h, pos, t, n, L, sk_b, sk_h, sk_t, sk_d,
                    sck_b, sck_h, sck_l, sck_d, ks_h, DK, BLOCK_DK, FMAX, MBITS, BIAS)
    _quantise_store(v_ptr, cv_ptr, vs_ptr, b, h, pos, t, n, L, sv_b, sv_h, sv_t, sv_d,
                    scv_b, scv_h, scv_l, scv_d, vs_h, DV, BLOCK_DV, FMAX, MBITS, BIAS)
