"""Triton device code of split-K flash-decoding (the ``@triton.jit`` layer; no host logic here).

Two kernels:

* :func:`decode_split_kernel` — one program per (batch ``b``, kv head ``hkv``, split ``s``, row block
  ``mb``). It walks its slice of the key axis of sequence ``b`` tile by tile (``BLOCK_N`` keys), loading
  each K/V tile once, and scores it against *every* query row that reads kv head ``hkv``: the
  ``GROUP`` query heads of the GQA group times the ``SQ`` query positions. Those ``GROUP*SQ`` rows form
  the M side of a small ``tl.dot`` (padded to ``BLOCK_M >= 16``, the smallest tensor-core tile), so a
  decode step of a GQA model reads the KV cache once instead of ``GROUP`` times. It keeps an online
  softmax and writes, per row and split, the normalised partial output and its log-sum-exp. With
  ``SPLIT=False`` (one split) it writes the final output directly and no second kernel runs.
* :func:`decode_reduce_kernel` — one program per output row ``(b, h, i)``; combines the splits'
  partial outputs weighted by ``exp(lse_s - max_s lse_s)``.

With ``FUSED`` (and ``SPLIT``) no second kernel runs: each split program, after writing its partials,
counts its arrival on a per-(b, hkv, row block) counter in ``SEM``; the last split to arrive combines all
splits' partials for its rows (the same weights; row by row, the splits in chunks of ``RBLOCK_S``) and
resets the counter to 0 for the next launch. An eager decode call is host-bound, and the reduction's
launch is a third of its host time; under a CUDA graph launches cost nothing and the two-kernel path's
reduction, one program per row, finishes sooner than the last split's serial combine.

FP8 K/V (``HAS_SCALE``): the caches hold float8 codes and float32 scales per kv head (or one per tensor,
stride 0); the real keys and values are ``K * k_scale[hkv]`` and ``V * v_scale[hkv]``. Tiles are loaded
as codes (half the bytes of bf16: decode reads its cache once, so half the time at the bandwidth
limit), widened exactly to **float16** for the dots whatever q's dtype, K's scale folded into the softmax
scale and V's applied to the normalised output. Why fp16 and not q's dtype: sm_89+ converts two e4m3/e5m2
codes to fp16 in one instruction, while bf16 has no such conversion and goes through wider types — on the
H200 that made a bf16-query FP8 decode no faster than reading bf16 (B32 KV8192: 235 µs against 158 µs with
fp16 queries, ``benchmarks/results/fp8_h200_2026-12-04_wide.json``). Every e4m3/e5m2 code is exact in
fp16; a bf16 q is rounded to fp16 once per program (exact for normal magnitudes in [6.1e-5, 65504], which
has more mantissa than bf16; larger magnitudes saturate at ±65504 instead of overflowing, smaller ones keep
fp16's subnormal precision, 6e-8 absolute), and the probabilities P in [0, 1] go to the PV dot in fp16
(finer than bf16's). The accumulators stay float32; the output is written in q's dtype.

Log-sum-exps are kept in base 2 (scores are multiplied by ``scale * log2(e)`` and exponentiated with
``exp2``, which is one MUFU instruction); they never leave the op.

Row ``r`` of a (b, hkv) block is query head ``hkv*GROUP + r // SQ`` at query position ``i = r % SQ``.
With ``L_b = clamp(kv_lens[b], 0, S_MAX)`` (``S_MAX`` without ``kv_lens``) the queries are the last ``SQ``
positions of sequence ``b`` (bottom-right alignment per sequence), so row ``r`` sits on the diagonal key
``diag = L_b - SQ + i``, and key ``j`` is admissible for it iff

* ``j < L_b``,
* ``j >= diag - WIN_LEFT`` when ``HAS_LEFT``, and
* ``j <= diag + WIN_RIGHT`` when ``HAS_RIGHT``.

The host folds causal into the right bound (causal is ``WIN_RIGHT = 0``; causal ∩ window ``(l, r)`` is
``(l, min(r, 0))``) and drops a side that admits every key, so the kernel only knows left/right bounds,
and without them it compiles to the plain ``j < L_b`` kernel. ``WIN_RIGHT >= 0`` (no bound the public op
can express trims the key range on the right). A row without admissible keys yields zeros.

Every key a program may need lies in ``[lo, hi)`` with ``lo = max(0, L_b - SQ - WIN_LEFT)`` (row 0's first
key; 0 without a left bound) and ``hi = L_b`` (row ``SQ-1``'s last key ``L_b - 1 + WIN_RIGHT`` is never
before ``L_b - 1``). The splits divide ``[lo, hi)``, not ``[0, L_b)``: a 1024-key window over a 32k cache
reads about 1024 keys, in balanced splits. Keys outside ``[lo, hi)`` are never read.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _decode_tile(q, k_base, v_base, start, hi, m_i, l_i, acc, offs_d, offs_dv, d_ok, dv_ok, first_key, last_key,
                 qk_scale, stride_ks, stride_kd, stride_vs, stride_vd,
                 FULL: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                 BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One ``BLOCK_N``-key tile ``[start, start + BLOCK_N)`` of :func:`decode_split_kernel`'s loop: scores,
    online-softmax update, PV. ``FULL``: the whole tile lies below ``hi`` (no key mask on the loads or the
    scores); otherwise keys ``>= hi`` are neither read nor admitted. Returns the updated ``(m_i, l_i, acc)``."""
    offs_n = start + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hi
    # K tile loaded transposed, [BLOCK_D, BLOCK_N]: keys outside [lo, hi) are never read (padding of
    # the cache, and keys before the window, may hold anything, NaN included).
    k_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_ks + offs_d[:, None] * stride_kd
    if FULL:
        if EVEN_D:
            k = tl.load(k_ptrs)
        else:
            k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
    else:
        if EVEN_D:
            k = tl.load(k_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
    if HAS_SCALE:
        k = k.to(tl.float16)  # FP8 codes widen exactly to fp16 (one paired conversion on sm_89+)
    # V is issued before the softmax math so its latency hides behind it.
    v_ptrs = v_base + offs_n[:, None].to(tl.int64) * stride_vs + offs_dv[None, :] * stride_vd
    if FULL:
        if EVEN_D:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=dv_ok[None, :], other=0.0)
    else:
        if EVEN_D:
            v = tl.load(v_ptrs, mask=n_ok[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
    if HAS_SCALE:
        v = v.to(tl.float16)
    s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
    if not FULL or HAS_LEFT or HAS_RIGHT:
        ok = n_ok[None, :]
        if HAS_LEFT:
            ok = ok & (offs_n[None, :] >= first_key[:, None])
        if HAS_RIGHT:
            ok = ok & (offs_n[None, :] <= last_key[:, None])
        s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row that has seen no admissible key yet (its window may lie in another split, or be empty)
    # keeps m = -inf; subtract 0 instead so that exp2(-inf - -inf) never makes a NaN (its p and alpha
    # are then exactly 0).
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


# Shape integers that vary per call are not specialised (Triton would otherwise compile one variant per
# "== 1" / "% 16 == 0" class of each); strides and head dims stay specialised: unit and 16-aligned strides
# are what lets the loads vectorise. The window reach is such an integer too: one compiled kernel serves
# every window width.
@triton.jit(do_not_specialize=["HKV", "GROUP", "SQ", "S_MAX", "NUM_SPLITS", "LSE_OFF", "WIN_LEFT",
                               "WIN_RIGHT"])
def decode_split_kernel(
    Q, K, V, KV_LENS, WS, OUT,
    SEM,  # int32 arrival counters [B*HKV*row blocks], all 0 between launches (read only when FUSED)
    K_SCALE, V_SCALE,  # float32 dequantisation scales of FP8 K/V, per kv head (read only when HAS_SCALE)
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_ob, stride_oh, stride_os, stride_od,
    HKV, GROUP, SQ, S_MAX, D, DV, NUM_SPLITS,
    LSE_OFF,  # LSE partials start this many floats into WS (after the O partials)
    WIN_LEFT, WIN_RIGHT,  # window reach in keys left/right of each row's diagonal key (read when bounded)
    qk_scale,  # softmax scale * log2(e)
    stride_ksc, stride_vsc,  # 1: a scale per kv head; 0: one scale for the tensor
    HAS_LENS: tl.constexpr, SPLIT: tl.constexpr, FUSED: tl.constexpr,
    HAS_SCALE: tl.constexpr,  # K/V are FP8 codes: real K = K * K_SCALE[hkv], real V = V * V_SCALE[hkv]
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,  # window side bounded (causal is HAS_RIGHT, WIN_RIGHT 0)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_D: tl.constexpr,  # D == BLOCK_D and DV == BLOCK_DV: no head-dim masks (unmasked vector loads)
    DOT_PRECISION: tl.constexpr,
    RBLOCK_S: tl.constexpr,  # FUSED: splits combined a chunk (a power of two)
):
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    b = pid_bh // HKV
    hkv = pid_bh % HKV
    # 64-bit base offsets: a KV cache of several GiB overflows int32 element offsets.
    b64 = b.to(tl.int64)
    hkv64 = hkv.to(tl.int64)

    # L_b, clamped once: the same value bounds the keys read and places the diagonal, so a length past the
    # cache means "the cache is full", never a diagonal beyond the last key.
    if HAS_LENS:
        n_keys = tl.minimum(tl.maximum(tl.load(KV_LENS + b).to(tl.int32), 0), S_MAX)
    else:
        n_keys = S_MAX

    # Keys any row of this sequence may attend: [key_lo, n_keys). Row 0's window starts first; the right
    # side never trims the range (WIN_RIGHT >= 0, see the module docstring).
    if HAS_LEFT:
        key_lo = tl.maximum(n_keys - SQ - WIN_LEFT, 0)
    else:
        key_lo = 0
    # This split's key range [lo, hi): equal chunks of the *sequence's own* range, rounded up to whole
    # tiles, so the splits of a short sequence (or a narrow window) stay balanced.
    per_split = tl.cdiv(n_keys - key_lo, NUM_SPLITS)
    chunk = tl.cdiv(per_split, BLOCK_N) * BLOCK_N
    lo = key_lo + pid_s * chunk
    hi = tl.minimum(lo + chunk, n_keys)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_rows = GROUP * SQ
    row_ok = rows < n_rows
    g = rows // SQ
    qpos = rows % SQ
    head64 = (hkv * GROUP + g).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    # With EVEN_D the loads take no head-dim mask: a mask that merely evaluates to true can still cost
    # them their vector width.
    d_ok = offs_d < D
    dv_ok = offs_dv < DV

    q_ptrs = (Q + b64 * stride_qb + head64[:, None] * stride_qh + qpos[:, None] * stride_qs
              + offs_d[None, :] * stride_qd)
    if EVEN_D:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    if HAS_SCALE:
        # K's scale multiplies every score of this kv head: folded into the softmax scale once
        qk_scale = qk_scale * tl.load(K_SCALE + hkv * stride_ksc)
        # the dots run in fp16 (module docstring): a bf16 q is rounded once, saturating instead of inf
        q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
    k_base = K + b64 * stride_kb + hkv64 * stride_kh
    v_base = V + b64 * stride_vb + hkv64 * stride_vh
    # Each row's diagonal key (bottom-right, per sequence) and its window's first/last admissible key.
    diag = n_keys - SQ + qpos
    first_key = diag - WIN_LEFT  # read only with HAS_LEFT
    last_key = diag + WIN_RIGHT  # read only with HAS_RIGHT

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # Whole tiles first, their loads unmasked (every key lies in [lo, hi)); then the tail tile, if any, with
    # masked loads. A masked load along a tensor's contiguous axis is read element by element: with V stored
    # keys-contiguous (``stride_vs == 1``, a cache kept as ``[B, Hkv, D, S]``) the keys are that axis.
    full_end = lo + (tl.maximum(hi - lo, 0) // BLOCK_N) * BLOCK_N
    for start in range(lo, full_end, BLOCK_N):
        m_i, l_i, acc = _decode_tile(
            q, k_base, v_base, start, hi, m_i, l_i, acc, offs_d, offs_dv, d_ok, dv_ok, first_key, last_key,
            qk_scale, stride_ks, stride_kd, stride_vs, stride_vd,
            True, HAS_SCALE, HAS_LEFT, HAS_RIGHT, BLOCK_N, EVEN_D, DOT_PRECISION)
    if full_end < hi:
        m_i, l_i, acc = _decode_tile(
            q, k_base, v_base, full_end, hi, m_i, l_i, acc, offs_d, offs_dv, d_ok, dv_ok, first_key, last_key,
            qk_scale, stride_ks, stride_kd, stride_vs, stride_vd,
            False, HAS_SCALE, HAS_LEFT, HAS_RIGHT, BLOCK_N, EVEN_D, DOT_PRECISION)

    has_keys = l_i > 0.0
    o = acc / tl.where(has_keys, l_i, 1.0)[:, None]  # rows without keys: acc == 0 -> zeros
    if HAS_SCALE:
        # V's scale multiplies the output linearly (partials included: the combine is a weighted mean)
        o = o * tl.load(V_SCALE + hkv * stride_vsc)

    if SPLIT:
        # Workspace: O partials [B*Hq*SQ, NUM_SPLITS, DV] then LSE partials [B*Hq*SQ, NUM_SPLITS], fp32.
        # Row index (b*Hq + h)*SQ + i equals pid_bh*GROUP*SQ + r because h = hkv*GROUP + r // SQ.
        prow = (pid_bh.to(tl.int64) * n_rows + rows) * NUM_SPLITS + pid_s
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(WS + LSE_OFF + prow, lse, mask=row_ok)
        tl.store(WS + prow[:, None] * DV + offs_dv[None, :], o, mask=row_ok[:, None] & dv_ok[None, :])
        if FUSED:
            # Every thread's partial stores are issued before the arrival counts (barrier); the arrival
            # releases them and the last one acquires everybody's (acq_rel, GPU scope). The last program
            # reads them from L2 (.cg: this SM's L1 may still hold the same workspace lines from an
            # earlier call) and resets the counter (a CUDA graph replays the launch with it).
            tl.debug_barrier()
            sem_ptr = SEM + pid_bh * tl.num_programs(2) + pid_m
            arrived = tl.atomic_add(sem_ptr, 1, sem="acq_rel", scope="gpu")
            if arrived == NUM_SPLITS - 1:
                tl.atomic_xchg(sem_ptr, 0, sem="relaxed", scope="gpu")
                # One row at a time, all its splits' partials loaded at once (RBLOCK_S splits a chunk: a
                # [RBLOCK_S, BLOCK_DV] tile of about 32 floats a thread): a loop over the splits would
                # wait out one L2 round trip per split (measured: twice the two-kernel path's device
                # time at 32-64 splits). Rows past the group's (padding of the row block) are skipped.
                offs_c = tl.arange(0, RBLOCK_S)
                row0 = pid_m * BLOCK_M
                for r in range(row0, tl.minimum(row0 + BLOCK_M, n_rows)):
                    rbase = (pid_bh.to(tl.int64) * n_rows + r) * NUM_SPLITS
                    m_r = tl.max(tl.load(WS + LSE_OFF + rbase + offs_c, mask=offs_c < NUM_SPLITS,
                                         other=float("-inf"), cache_modifier=".cg"), 0)
                    for c in range(RBLOCK_S, NUM_SPLITS, RBLOCK_S):
                        lse_c = tl.load(WS + LSE_OFF + rbase + c + offs_c, mask=c + offs_c < NUM_SPLITS,
                                        other=float("-inf"), cache_modifier=".cg")
                        m_r = tl.maximum(m_r, tl.max(lse_c, 0))
                    m_ref = tl.where(m_r == float("-inf"), 0.0, m_r)  # no split with keys: no NaN
                    den = tl.zeros_like(m_ref)
                    acc_r = tl.zeros([BLOCK_DV], dtype=tl.float32)
                    for c in range(0, NUM_SPLITS, RBLOCK_S):
                        s_ok = c + offs_c < NUM_SPLITS
                        w = tl.exp2(tl.load(WS + LSE_OFF + rbase + c + offs_c, mask=s_ok, other=float("-inf"),
                                            cache_modifier=".cg") - m_ref)  # an empty split weighs 0
                        o_c = tl.load(WS + (rbase + c + offs_c)[:, None] * DV + offs_dv[None, :],
                                      mask=s_ok[:, None] & dv_ok[None, :], other=0.0, cache_modifier=".cg")
                        den += tl.sum(w, 0)
                        acc_r += tl.sum(o_c * w[:, None], 0)
                    o_r = acc_r / tl.where(den > 0.0, den, 1.0)
                    head_r = (hkv * GROUP + r // SQ).to(tl.int64)
                    tl.store(OUT + b64 * stride_ob + head_r * stride_oh + (r % SQ) * stride_os
                             + offs_dv * stride_od, o_r.to(OUT.dtype.element_ty), mask=dv_ok)
    else:
        o_ptrs = (OUT + b64 * stride_ob + head64[:, None] * stride_oh + qpos[:, None] * stride_os
                  + offs_dv[None, :] * stride_od)
        tl.store(o_ptrs, o.to(OUT.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])


@triton.jit(do_not_specialize=["HQ", "SQ", "NUM_SPLITS", "LSE_OFF"])
def decode_reduce_kernel(
    WS, OUT,
    stride_ob, stride_oh, stride_os, stride_od,
    HQ, SQ, DV, NUM_SPLITS, LSE_OFF,
    BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # (b*HQ + h)*SQ + i
    b = row // (HQ * SQ)
    h = (row // SQ) % HQ
    i = row % SQ
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    s_ok = offs_s < NUM_SPLITS
    dv_ok = offs_dv < DV

    lse = tl.load(WS + LSE_OFF + row * NUM_SPLITS + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_ref)  # empty splits (lse -inf) weigh exactly 0
    denom = tl.sum(w, 0)
    o = tl.load(WS + (row * NUM_SPLITS + offs_s)[:, None] * DV + offs_dv[None, :],
                mask=s_ok[:, None] & dv_ok[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
    tl.store(OUT + b * stride_ob + h * stride_oh + i * stride_os + offs_dv * stride_od,
             out.to(OUT.dtype.element_ty), mask=dv_ok)
