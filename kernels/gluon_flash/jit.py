"""Hopper flash-attention forward in Gluon: ``@gluon.jit`` code only (host side: :mod:`.launch`).

Why Gluon and not ``triton.language``: Triton (3.6 and 3.9) waits for every ``tl.dot``'s wgmma to finish right
after issuing it, so no source order lets the softmax run while the tensor cores work
(``benchmarks/probe_gluon_fwd.py --ptx-order``). Gluon leaves the waits to the kernel: FlashAttention-3's
intra-warpgroup overlap.

One program computes ``BM`` query rows of one (batch, query head):

    O[b, h, m0:m0+BM, :] = softmax(Q K^T * scale + mask) V        [BM, D]
    LSE[b, h, m0:m0+BM]  = logsumexp(Q K^T * scale + mask)        (natural log, fp32; -inf for empty rows)

Mask (:mod:`attntune.problem`, as ``kernels/triton_flash``): row ``i`` admits key ``j`` iff ``j < Skv`` and, per
bounded side, ``i + diag_off - win_left <= j <= i + diag_off + win_right`` (causal folded into ``win_right <= 0``).
Only the key blocks of ``[lo, hi)`` are visited; a block every row admits whole skips the mask arithmetic.

Schedule (K/V blocks of ``BN`` keys through a ``STAGES``-deep ring of TMA loads, an mbarrier per slot for K and
one for V; ``num_warps`` = 8: two warpgroups of 64 rows):

    S_0 = Q K_0^T; softmax_0
    for j in 1..n-1:  issue S_j = Q K_j^T;  issue O += P_{j-1} V_{j-1};  wait for S_j alone (1 outstanding);
                      softmax_j (while PV_{j-1} runs);  wait for PV_{j-1};  O *= alpha_j;
                      refill the freed slot with block j-1+STAGES
    O += P_{n-1} V_{n-1};  O /= l

Triton's shared-memory barrier pass puts a CTA barrier before each refill and before the output's TMA store
(both warpgroups read every K/V tile); checked in the sm_90 PTX.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LN2 = gl.constexpr(0.6931471805599453)
# Triton 3.6 names the TMA copies async_copy_global_to_shared / async_copy_shared_to_global; later versions
# async_load / async_store (the old names raise there)
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global


@gluon.jit
def load_kv(desc, b, h, start, bars, smem, slot, pred):
    """One K or V block (keys ``start`` onwards of kv head ``h`` of batch ``b``) into ring slot ``slot`` (TMA:
    zero fill past the sequence and past D), its arrival counted on ``bars[slot]``."""
    mbarrier.expect(bars.index(slot), desc.block_type.nbytes, pred=pred)
    _tma_load(desc, [b, h, start, 0], bars.index(slot), smem.index(slot), pred=pred)


@gluon.jit
def softmax_step(s, m_i, l_i, start, masked, rows, cols0, seqlen_kv, diag_off, win_left, win_right, qk_scale,
             HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """One key block's online-softmax step on the scores ``s`` [BM, BN] (fp32, unscaled): the mask when
    ``masked`` (a runtime flag: blocks inside the window and the sequence skip it), then P, alpha, l and m (base 2,
    m already scaled). A row with nothing admitted yet keeps m = -inf and gets P = alpha = 0, never NaN."""
    if masked:
        cols = start + cols0
        ok = (cols < seqlen_kv)[None, :]
        diag = rows + diag_off
        if HAS_RIGHT:
            ok = ok & (cols[None, :] <= (diag + win_right)[:, None])
        if HAS_LEFT:
            ok = ok & (cols[None, :] >= (diag - win_left)[:, None])
        s = gl.where(ok, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_sub[:, None])
    alpha = gl.exp2(m_i - m_sub)
    return p, alpha, l_i * alpha + gl.sum(p, 1), m_new


@gluon.jit
def key_range(start_m, seqlen_kv, diag_off, win_left, win_right, BM: gl.constexpr, BN: gl.constexpr,
              HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """The key blocks rows ``[start_m, start_m + BM)`` visit: ``(lo, n, full_lo, full_hi)`` — ``n`` blocks of ``BN``
    keys from ``lo`` (a multiple of BN), and ``[full_lo, full_hi)`` the keys every one of those rows admits (a block
    inside it skips the mask arithmetic)."""
    if HAS_LEFT:
        lo = gl.maximum(start_m + diag_off - win_left, 0) // BN * BN
        full_lo = gl.cdiv(gl.maximum(start_m + BM - 1 + diag_off - win_left, 0), BN) * BN
    else:
        lo = 0
        full_lo = 0
    if HAS_RIGHT:
        hi = gl.maximum(gl.minimum(start_m + BM + diag_off + win_right, seqlen_kv), 0)
        full_hi = gl.maximum(gl.minimum(start_m + diag_off + win_right + 1, seqlen_kv), 0) // BN * BN
    else:
        hi = seqlen_kv
        full_hi = seqlen_kv // BN * BN
    return lo, gl.maximum(gl.cdiv(hi - lo, BN), 0), full_lo, full_hi


@gluon.jit
def fa_fwd(desc_q, desc_k, desc_v, desc_o, LSE, seqlen_q, seqlen_kv, heads_q, group, diag_off, win_left, win_right,
           qk_scale, BM: gl.constexpr, BN: gl.constexpr, BD: gl.constexpr, STAGES: gl.constexpr,
           HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """Grid (cdiv(Sq, BM), B*Hq). desc_q/desc_o: 4-D TMA descriptors over Q/O ``[B, Hq, Sq, D]`` (block
    ``[1, 1, BM, BD]``), desc_k/desc_v over K/V ``[B, Hkv, Skv, D]`` (block ``[1, 1, BN, BD]``), any strides TMA takes
    (last 1, others 16-byte multiples); BD >= D (zero filled past D, the store clips there and past Sq).
    LSE [B, Hq, Sq] fp32 contiguous, natural log, -inf for a row with no key. qk_scale = scale * log2(e).
    Mask as ``kernels/triton_flash`` (``attntune.problem``): row i admits key j iff j < Skv and, per bounded side,
    i + diag_off - win_left <= j <= i + diag_off + win_right (causal folded into win_right <= 0).
    GQA: query head h reads kv head h // group."""
    num_warps: gl.constexpr = gl.num_warps()  # 8: two warpgroups of 64 rows each
    num_m = gl.cdiv(seqlen_q, BM)
    start_m = (num_m - 1 - gl.program_id(0)) * BM  # last blocks first: under a causal mask they are the longest
    bh = gl.program_id(1)
    off_b = bh // heads_q
    off_h = bh % heads_q
    off_hk = off_h // group

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BD, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    rows = start_m + gl.arange(0, BM, layout=row_s)
    cols0 = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))

    lo, n, full_lo, full_hi = key_range(start_m, seqlen_kv, diag_off, win_left, win_right, BM, BN, HAS_LEFT,
                                        HAS_RIGHT)

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [1, 1, BM, BD], desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [STAGES, 1, 1, BN, BD], desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [STAGES, 1, 1, BN, BD], desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    m_i = gl.full([BM], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BM], gl.float32, layout=row_s)
    o = gl.zeros([BM, BD], gl.float32, layout=o_layout)
    if n > 0:  # a block of rows admitting no key (causal bottom-right with Sq > Skv) loads nothing
        mbarrier.expect(q_bar, desc_q.block_type.nbytes)
        _tma_load(desc_q, [off_b, off_h, start_m, 0], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            load_kv(desc_k, off_b, off_hk, lo + i * BN, k_bars, k_smem, i, i < n)
            load_kv(desc_v, off_b, off_hk, lo + i * BN, v_bars, v_smem, i, i < n)
        q2 = q_smem.reshape([BM, BD])
        s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)

        # block 0: S_0 and its softmax (nothing to overlap with yet)
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_bars.index(0), 0)
        s_tok = warpgroup_mma(q2, k_smem.index(0).reshape([BN, BD]).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        p, alpha, l_i, m_i = softmax_step(s, m_i, l_i, lo, (lo < full_lo) | (lo + BN > full_hi), rows, cols0,
                                      seqlen_kv, diag_off, win_left, win_right, qk_scale, HAS_LEFT, HAS_RIGHT)
        for j in range(1, n):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            start = lo + j * BN
            mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q2, k_smem.index(slot).reshape([BN, BD]).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
            p16 = gl.convert_layout(p.to(desc_v.dtype), p_layout)
            o_tok = warpgroup_mma(p16, v_smem.index(prev).reshape([BN, BD]), o, is_async=True)
            # S_j is the older group: waiting for 1 outstanding leaves PV_{j-1} running during the softmax
            s = warpgroup_mma_wait(1, deps=[s_tok])
            p, alpha, l_i, m_i = softmax_step(s, m_i, l_i, start, (start < full_lo) | (start + BN > full_hi), rows,
                                          cols0, seqlen_kv, diag_off, win_left, win_right, qk_scale, HAS_LEFT,
                                          HAS_RIGHT)
            o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])  # p16 (registers) stays live until PV_{j-1} is done
            o = o * gl.convert_layout(alpha, row_o)[:, None]
            # slot `prev` is free (QK_{j-1} and PV_{j-1} done): refill it with block j-1+STAGES
            nxt = j - 1 + STAGES
            load_kv(desc_k, off_b, off_hk, lo + nxt * BN, k_bars, k_smem, prev, nxt < n)
            load_kv(desc_v, off_b, off_hk, lo + nxt * BN, v_bars, v_smem, prev, nxt < n)
        last = (n - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((n - 1) // STAGES) & 1)
        p16 = gl.convert_layout(p.to(desc_v.dtype), p_layout)
        o_tok = warpgroup_mma(p16, v_smem.index(last).reshape([BN, BD]), o, is_async=True)
        o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    # rows that admitted no key: l = 0 -> output 0 and LSE -inf (FlashAttention's convention)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    gl.store(LSE + bh.to(gl.int64) * seqlen_q + rows, lse, mask=rows < seqlen_q)
    out = o / gl.convert_layout(l_safe, row_o)[:, None]
    o_smem = gl.allocate_shared_memory(desc_o.dtype, [1, 1, BM, BD], desc_o.layout)
    o_smem.reshape([BM, BD]).store(out.to(desc_o.dtype))
    fence_async_shared()
    _tma_store(desc_o, [off_b, off_h, start_m, 0], o_smem)  # clips rows past Sq and columns past D
    tma.store_wait(0)
