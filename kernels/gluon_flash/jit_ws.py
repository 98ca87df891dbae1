"""The Gluon forward, warp-specialized with ping-pong consumers: ``@gluon.jit`` code only (host side: :mod:`.launch`,
``GluonFwdConfig.WS = 1``).

Why: in the one-partition kernel (:mod:`.jit`) both warpgroups run the same schedule in lockstep — the compiler puts
a CTA barrier before every refill of the TMA ring, since both read every K/V tile — so their softmaxes coincide and
the tensor cores idle through the part of the softmax that PV does not cover. Here (FlashAttention-3's layout):

* a 1-warp **loader** partition issues every TMA load (Q, then the K/V ring), gated by an "empty" mbarrier per ring
  slot that both consumers release (count 2) — no CTA barrier in the loop;
* two 4-warp **consumer** partitions own 64 query rows each of the program's 128 and take turns on the tensor cores
  (a pair of mbarriers passed back and forth): consumer c waits for its turn, issues S_j = Q K_j^T and
  O += P_{j-1} V_{j-1}, hands the turn over, then runs softmax_j while the tensor cores do its PV and the other
  consumer's two GEMMs;
* registers move from the loader to the consumers (``setmaxnreg`` through ``warp_specialize``'s budgets).

Same contract, mask and results as :func:`.jit.fa_fwd` (its docstring); Q and O descriptors have 64-row blocks.
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

from attntune.kernels.gluon_flash.jit import _tma_load, _tma_store, LN2, key_range, load_kv, softmax_step

#: query rows per consumer partition (one warpgroup's wgmma M)
ROWS = gl.constexpr(64)
#: registers per thread of the second consumer and of the loader (the first consumer, the default partition, gets
#: what the launch's ``maxnreg`` leaves: :data:`attntune.kernels.gluon_flash.config.WS_MAXNREG`)
CONSUMER_REGS = gl.constexpr(240)
LOADER_REGS = gl.constexpr(24)


@gluon.jit
def _loader(args, BN: gl.constexpr, BD: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
            HAS_RIGHT: gl.constexpr):
    """Q's two 64-row tiles, then K/V blocks ``lo + i * BN`` into ring slot ``i % STAGES`` once both consumers have
    released the slot's previous block."""
    (desc_q, desc_k, desc_v, desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty, turn, off_b, off_h,
     off_hk, start_m, lo, n, full_lo, full_hi, seqlen_q, seqlen_kv, diag_off, win_left, win_right, qk_scale,
     bh) = args
    if n > 0:
        mbarrier.expect(q_bar, 2 * desc_q.block_type.nbytes)
        _tma_load(desc_q, [off_b, off_h, start_m, 0], q_bar, q_smem.index(0))
        _tma_load(desc_q, [off_b, off_h, start_m + ROWS, 0], q_bar, q_smem.index(1))
    for i in range(n):
        slot = i % STAGES
        # a fresh mbarrier counts as having completed the phase before phase 0: the first lap does not wait
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        load_kv(desc_k, off_b, off_hk, lo + i * BN, k_bars, k_smem, slot, True)
        load_kv(desc_v, off_b, off_hk, lo + i * BN, v_bars, v_smem, slot, True)


@gluon.jit
def _consume(args, C: gl.constexpr, BN: gl.constexpr, BD: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
             HAS_RIGHT: gl.constexpr):
    """Consumer ``C`` (0 or 1): rows ``start_m + C * 64`` onwards; the flash loop of :func:`.jit.fa_fwd` with the
    turn taken before its GEMMs are issued and handed over right after, then the epilogue (LSE, and O through the
    now free Q tile and a TMA store)."""
    (desc_q, desc_k, desc_v, desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty, turn, off_b, off_h,
     off_hk, start_m, lo, n, full_lo, full_hi, seqlen_q, seqlen_kv, diag_off, win_left, win_right, qk_scale,
     bh) = args
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BD, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    rows = start_m + C * ROWS + gl.arange(0, ROWS, layout=row_s)
    cols0 = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([ROWS], gl.float32, layout=row_s)
    o = gl.zeros([ROWS, BD], gl.float32, layout=o_layout)
    q_tile = q_smem.index(C)
    if n > 0:
        q2 = q_tile.reshape([ROWS, BD])
        s_zero = gl.zeros([ROWS, BN], gl.float32, layout=s_layout)
        mbarrier.wait(q_bar, 0)
        # turn parity: consumer 0's first wait passes at once (the phase before 0 counts as complete), consumer 1's
        # first waits for consumer 0's first hand-over; after that each waits for the other's previous hand-over
        mbarrier.wait(k_bars.index(0), 0)
        mbarrier.wait(turn.index(C), 1 - C)
        s_tok = warpgroup_mma(q2, k_smem.index(0).reshape([BN, BD]).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        mbarrier.arrive(turn.index(1 - C), count=1)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        p, alpha, l_i, m_i = softmax_step(s, m_i, l_i, lo, (lo < full_lo) | (lo + BN > full_hi), rows, cols0,
                                          seqlen_kv, diag_off, win_left, win_right, qk_scale, HAS_LEFT, HAS_RIGHT)
        for j in range(1, n):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            start = lo + j * BN
            mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
            mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
            p16 = gl.convert_layout(p.to(desc_v.dtype), p_layout)
            mbarrier.wait(turn.index(C), (j & 1) ^ (1 - C))
            s_tok = warpgroup_mma(q2, k_smem.index(slot).reshape([BN, BD]).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            o_tok = warpgroup_mma(p16, v_smem.index(prev).reshape([BN, BD]), o, is_async=True)
            mbarrier.arrive(turn.index(1 - C), count=1)
            # S_j is the older group: waiting for 1 outstanding leaves PV_{j-1} running during the softmax
            s = warpgroup_mma_wait(1, deps=[s_tok])
            p, alpha, l_i, m_i = softmax_step(s, m_i, l_i, start, (start < full_lo) | (start + BN > full_hi), rows,
                                              cols0, seqlen_kv, diag_off, win_left, win_right, qk_scale, HAS_LEFT,
                                              HAS_RIGHT)
            o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
            mbarrier.arrive(empty.index(prev), count=1)  # this consumer is done with block j-1's K and V
            o = o * gl.convert_layout(alpha, row_o)[:, None]
        last = (n - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((n - 1) // STAGES) & 1)
        p16 = gl.convert_layout(p.to(desc_v.dtype), p_layout)
        o_tok = warpgroup_mma(p16, v_smem.index(last).reshape([BN, BD]), o, is_async=True)
        o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
        mbarrier.arrive(empty.index(last), count=1)

    # rows that admitted no key: l = 0 -> output 0 and LSE -inf (FlashAttention's convention)
    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    lse = gl.where(empty_row, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    gl.store(LSE + bh.to(gl.int64) * seqlen_q + rows, lse, mask=rows < seqlen_q)
    out = o / gl.convert_layout(l_safe, row_o)[:, None]
    # Q's tile is free (every wgmma reading it has completed): it stages the output for the TMA store
    q_tile.reshape([ROWS, BD]).store(out.to(desc_o.dtype))
    fence_async_shared()
    _tma_store(desc_o, [off_b, off_h, start_m + C * ROWS, 0], q_tile)  # clips rows past Sq and columns past D
    tma.store_wait(0)


@gluon.jit
def _consumer0(args, BN: gl.constexpr, BD: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
               HAS_RIGHT: gl.constexpr):
    _consume(args, 0, BN, BD, STAGES, HAS_LEFT, HAS_RIGHT)


@gluon.jit
def _consumer1(args, BN: gl.constexpr, BD: gl.constexpr, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr,
               HAS_RIGHT: gl.constexpr):
    _consume(args, 1, BN, BD, STAGES, HAS_LEFT, HAS_RIGHT)


@gluon.jit
def fa_fwd_ws(desc_q, desc_k, desc_v, desc_o, LSE, seqlen_q, seqlen_kv, heads_q, group, diag_off, win_left,
              win_right, qk_scale, BM: gl.constexpr, BN: gl.constexpr, BD: gl.constexpr, STAGES: gl.constexpr,
              HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """Grid (cdiv(Sq, 128), B*Hq), ``num_warps`` 4 (the first consumer; the second and the loader add 4 + 1 warps).
    desc_q/desc_o: blocks ``[1, 1, 64, BD]``; desc_k/desc_v: ``[1, 1, BN, BD]``. Otherwise as :func:`.jit.fa_fwd`."""
    gl.static_assert(BM == 2 * ROWS, "two consumers of 64 rows")
    num_m = gl.cdiv(seqlen_q, BM)
    start_m = (num_m - 1 - gl.program_id(0)) * BM  # last blocks first: under a causal mask they are the longest
    bh = gl.program_id(1)
    off_b = bh // heads_q
    off_h = bh % heads_q
    off_hk = off_h // group
    lo, n, full_lo, full_hi = key_range(start_m, seqlen_kv, diag_off, win_left, win_right, BM, BN, HAS_LEFT,
                                        HAS_RIGHT)

    q_smem = gl.allocate_shared_memory(desc_q.dtype, [2, 1, 1, ROWS, BD], desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [STAGES, 1, 1, BN, BD], desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [STAGES, 1, 1, BN, BD], desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # released by both consumers
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    fence_async_shared()

    args = (desc_q, desc_k, desc_v, desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_bars, v_bars, empty, turn, off_b,
            off_h, off_hk, start_m, lo, n, full_lo, full_hi, seqlen_q, seqlen_kv, diag_off, win_left, win_right,
            qk_scale, bh)
    # constexprs travel as arguments of their own (inside a tuple they would arrive as runtime values)
    gl.warp_specialize([(_consumer0, (args, BN, BD, STAGES, HAS_LEFT, HAS_RIGHT)),
                        (_consumer1, (args, BN, BD, STAGES, HAS_LEFT, HAS_RIGHT)),
                        (_loader, (args, BN, BD, STAGES, HAS_LEFT, HAS_RIGHT))], [4, 1], [CONSUMER_REGS, LOADER_REGS])

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(turn.index(i))
