"""Flash-attention forward: ``@triton.jit`` code only (host side: :mod:`.launch`).

One program computes one block of ``BLOCK_M`` query rows of one (batch, query head):

    O[b, h, m0:m0+BM, :]  = softmax(Q K^T * scale + mask) V          [BM, D]
    LSE[b, h, m0:m0+BM]   = logsumexp(Q K^T * scale + mask)  (natural log, fp32; -inf for empty rows)

Mask (see :mod:`attntune.problem`): row ``i`` admits column ``j`` iff ``j < Skv`` and, when the side
is bounded, ``i + off - left <= j <= i + off + right`` (causal is folded into ``right <= 0`` by the
launcher). The key axis of a query block is split into at most three ranges of whole key blocks:

    [lo, b)  masked   (blocks cut by the left edge of the window)
    [b, c)   unmasked (every row admits every column: no mask arithmetic, no bounds checks)
    [c, hi)  masked   (blocks cut by the right edge / the diagonal / the end of the sequence)

and only blocks inside [lo, hi) are visited at all, so a window of width W costs O(S*W) (block
skipping). Softmax runs in base 2 with ``qk_scale = scale * log2(e)`` folded into one FMA.

V stored keys-contiguous (``V_T``, with descriptors): FP8 and TF32 dots take their B operand K-major, so
the launcher copies V keys-contiguous for them; its descriptor then describes that memory as the
``[B, Hkv, D, Skv]`` tensor V^T, and each ``[BD, BN]`` block is transposed in shared memory into the
``[BN, BD]`` tile the PV dot reads (TMA loads for FP8/TF32 too, instead of pointer loads).

FP8 K/V (``FP8``, inference only): K and V hold float8 codes with float32 scales per kv head (``[Hkv]``,
or one for the tensor: stride 0), the real keys being ``K * k_scale[hkv]`` and values ``V * v_scale[hkv]``.
Both dots run on FP8 tensor cores, FlashAttention-3's way:

* Q (16-bit) is quantised to K's format once per program, **per row**: ``q8[i] = q[i] / s_i`` with
  ``s_i = amax(|q[i]|) / FP8_MAX``; since row ``i`` of ``Q K^T`` is ``s_i * (q8[i] . k8[j]) * k_scale``,
  ``s_i`` multiplies the scores row-wise and ``k_scale`` folds into ``qk_scale``;
* P (in [0, 1] after the running max) is quantised with the fixed scale ``FP8_MAX`` (``P * FP8_MAX`` spans
  the format's range; e4m3 then keeps P down to about 4e-6 relative to the row's largest weight); the
  accumulator is divided by ``FP8_MAX`` and multiplied by ``v_scale`` once at the end. The row sums ``l``
  are of the unquantised P, as FA3 does.

The error against attention over the dequantised K/V is the quantisation of q and P (about 2^-4
relative per element for e4m3): :data:`attntune.tolerances.FP8_FWD`.
"""

import triton
import triton.language as tl

# globals read inside @triton.jit code must be constexpr
LOG2E = tl.constexpr(1.4426950408889634)  # log2(e)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2)


@triton.jit
def kv_block_range(
    m0,
    seqlen_kv,
    diag_off,
    win_left,
    win_right,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
):
    """Key ranges for query rows [m0, m0+BLOCK_M): returns (lo, b, c, hi) with lo <= b <= c, all but hi
    multiples of BLOCK_N; [lo, b) and [c, hi) need masking, [b, c) is fully admitted and in bounds.
    Every operand of ``//`` is clamped to >= 0 first: compiled Triton truncates, the interpreter floors."""
    if HAS_LEFT:
        lo = tl.maximum(m0 + diag_off - win_left, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        # first column that the *last* row of the block admits on the left -> all rows admit it
        full_lo = tl.maximum(m0 + BLOCK_M - 1 + diag_off - win_left, 0)
        full_lo = tl.cdiv(full_lo, BLOCK_N) * BLOCK_N
    else:
        lo = 0
        full_lo = 0
    if HAS_RIGHT:
        hi = tl.minimum(m0 + BLOCK_M + diag_off + win_right, seqlen_kv)
        hi = tl.maximum(hi, 0)
        # columns < full_hi are admitted on the right by the *first* row of the block -> by all rows
        full_hi = tl.minimum(m0 + diag_off + win_right + 1, seqlen_kv)
        full_hi = (tl.maximum(full_hi, 0) // BLOCK_N) * BLOCK_N
    else:
        hi = seqlen_kv
        full_hi = (seqlen_kv // BLOCK_N) * BLOCK_N
    hi_up = tl.cdiv(hi, BLOCK_N) * BLOCK_N
    b = tl.minimum(tl.maximum(full_lo, lo), hi_up)
    c = tl.maximum(b, full_hi)
    return lo, b, c, hi


@triton.jit
def load_tile(ptrs, row_ok, d_ok, ROW_MASK: tl.constexpr, EVEN_D: tl.constexpr):
    """Load a tile, masking the sequence axis only when ROW_MASK and the head axis only when D is padded."""
    if ROW_MASK:
        if EVEN_D:
            t = tl.load(ptrs, mask=row_ok, other=0.0)
        else:
            t = tl.load(ptrs, mask=row_ok & d_ok, other=0.0)
    else:
        if EVEN_D:
            t = tl.load(ptrs)
        else:
            t = tl.load(ptrs, mask=d_ok, other=0.0)
    return t


@triton.jit
def _fwd_kv_loop(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    offs_m,
    offs_d,
    d_ok,
    start,
    end,
    seqlen_kv,
    diag_off,
    win_left,
    win_right,
    qk_scale,
    desc_k,
    desc_v,
    off_b,
    off_hk,
    q_rs,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    EVEN_D: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DESC: tl.constexpr,
    V_T: tl.constexpr,
    WS: tl.constexpr,
    FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """Online softmax over key blocks [start, end) (step BLOCK_N). acc [BM, BD] fp32, l_i/m_i [BM] fp32
    (m_i in log2 units, already scaled). With ``DESC`` K/V tiles come through the 4-D tensor descriptors
    ``desc_k``/``desc_v`` ([B, Hkv, Skv, D], block [1, 1, BN, BD]: TMA on sm_90, zero fill past Skv and D);
    ``WS`` warp-specializes the loop (producer warps issue the loads). With ``FP8`` q and the K/V tiles are
    codes, ``q_rs`` [BM] the rows' q scales, and P goes to the PV dot as codes of ``P * FP8_MAX``."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(start, end, BLOCK_N, warp_specialize=WS):
        cols = start_n + offs_n
        col_ok = cols < seqlen_kv
        # K^T tile [BD, BN] and V tile [BN, BD]
        if DESC:
            kt = tl.trans(desc_k.load([off_b, off_hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D))
        else:
            kt = load_tile(
                k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                col_ok[None, :],
                d_ok[:, None],
                MASKED,
                EVEN_D,
            )
        qk = tl.dot(q, kt, input_precision=DOT_PREC)  # [BM, BN] fp32
        if FP8:
            qk = qk * q_rs[:, None]  # each row's q scale (k's is in qk_scale)
        if MASKED:
            ok = col_ok[None, :]
            diag = offs_m + diag_off
            if HAS_RIGHT:
                ok = ok & (cols[None, :] <= (diag + win_right)[:, None])
            if HAS_LEFT:
                ok = ok & (cols[None, :] >= (diag - win_left)[:, None])
            qk = tl.where(ok, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            # a row with nothing admitted so far keeps m = -inf; subtract 0 instead so that
            # exp2(-inf - (-inf)) = NaN never happens (p and alpha then come out as exact zeros)
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_new
        p = tl.math.exp2(qk * qk_scale - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if DESC:
            if V_T:  # V stored keys-contiguous: a [BD, BN] block of V^T, transposed in shared memory
                v = tl.trans(desc_v.load([off_b, off_hk, 0, start_n]).reshape(BLOCK_D, BLOCK_N))
            else:
                v = desc_v.load([off_b, off_hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            v = load_tile(
                v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                col_ok[:, None],
                d_ok[None, :],
                MASKED,
                EVEN_D,
            )
        if FP8:
            acc = tl.dot((p * FP8_MAX).to(v.dtype), v, acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def flash_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    seqlen_q,
    seqlen_kv,
    head_dim,
    heads_q,
    group,
    diag_off,
    win_left,
    win_right,
    qk_scale,
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    K_SCALE,  # FP8: float32 dequantisation scales of K/V per kv head (read only when FP8)
    V_SCALE,
    stride_ksc,  # 1: a scale per kv head; 0: one for the tensor
    stride_vsc,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    EVEN_D: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DESC: tl.constexpr,
    V_T: tl.constexpr,  # desc_v describes V^T ([B, Hkv, D, Skv]: V stored keys-contiguous), blocks [BD, BN]
    WS: tl.constexpr,
    FP8: tl.constexpr,  # K/V are float8 codes (module docstring); q is 16-bit, quantised here
    FP8_MAX: tl.constexpr,  # the largest finite value of K/V's format (448.0 for e4m3fn)
):
    """Grid: 1-D, cdiv(Sq, BLOCK_M) * B * Hq programs (1-D so that B*Hq may exceed 65535).
    Q [B,Hq,Sq,D], K/V [B,Hkv,Skv,D], O [B,Hq,Sq,D] with any strides; LSE [B,Hq,Sq] contiguous fp32.
    With ``DESC`` (the launcher's ``LOADS >= 1``) Q, K, V and O move through the 4-D tensor descriptors
    ``desc_*`` (None otherwise) — TMA on sm_90: loads zero-fill past the sequence and D, stores clip
    there, so no masks are needed on those axes; ``WS`` (``LOADS == 2``) warp-specializes the unmasked
    key loop."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(seqlen_q, BLOCK_M)
    bh = pid // num_m
    # last query blocks first: under a causal mask they are the longest, so the tail of the grid is short
    start_m = (num_m - 1 - pid % num_m) * BLOCK_M
    off_b = bh // heads_q
    off_h = bh % heads_q
    off_hk = off_h // group  # GQA: query head h reads kv head h // group; K/V are never repeated

    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hk.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hk.to(tl.int64) * stride_vh
    o_base = O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    row_ok = offs_m < seqlen_q

    if DESC:
        q = desc_q.load([off_b, off_h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
    else:
        q = load_tile(
            q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
            row_ok[:, None],
            d_ok[None, :],
            True,
            EVEN_D,
        )

    if FP8:
        # q to K's format, one scale per row (module docstring); an all-zero row keeps scale 1
        qf = q.to(tl.float32)
        q_amax = tl.max(tl.abs(qf), 1)
        q_rs = tl.where(q_amax > 0.0, q_amax / FP8_MAX, 1.0)
        q = (qf / q_rs[:, None]).to(K.dtype.element_ty)
        qk_scale = qk_scale * tl.load(K_SCALE + off_hk * stride_ksc)
    else:
        q_rs = 1.0

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, b, c, hi = kv_block_range(
        start_m, seqlen_kv, diag_off, win_left, win_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    if HAS_LEFT:
        acc, l_i, m_i = _fwd_kv_loop(
            acc,
            l_i,
            m_i,
            q,
            k_base,
            v_base,
            stride_kn,
            stride_kd,
            stride_vn,
            stride_vd,
            offs_m,
            offs_d,
            d_ok,
            lo,
            b,
            seqlen_kv,
            diag_off,
            win_left,
            win_right,
            qk_scale,
            desc_k,
            desc_v,
            off_b,
            off_hk,
            q_rs,
            BLOCK_N,
            BLOCK_D,
            True,
            HAS_LEFT,
            HAS_RIGHT,
            EVEN_D,
            DOT_PREC,
            DESC,
            V_T,
            False,
            FP8,
            FP8_MAX,
        )
    acc, l_i, m_i = _fwd_kv_loop(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_m,
        offs_d,
        d_ok,
        b,
        c,
        seqlen_kv,
        diag_off,
        win_left,
        win_right,
        qk_scale,
        desc_k,
        desc_v,
        off_b,
        off_hk,
        q_rs,
        BLOCK_N,
        BLOCK_D,
        False,
        HAS_LEFT,
        HAS_RIGHT,
        EVEN_D,
        DOT_PREC,
        DESC,
        V_T,
        WS,
        FP8,
        FP8_MAX,
    )
    acc, l_i, m_i = _fwd_kv_loop(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_m,
        offs_d,
        d_ok,
        c,
        hi,
        seqlen_kv,
        diag_off,
        win_left,
        win_right,
        qk_scale,
        desc_k,
        desc_v,
        off_b,
        off_hk,
        q_rs,
        BLOCK_N,
        BLOCK_D,
        True,
        HAS_LEFT,
        HAS_RIGHT,
        EVEN_D,
        DOT_PREC,
        DESC,
        V_T,
        False,
        FP8,
        FP8_MAX,
    )

    # rows that admitted no key: l = 0 -> output 0 and LSE -inf (FlashAttention's convention), no NaN
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    if FP8:
        # P went in as codes of P * FP8_MAX; V's scale multiplies the output linearly
        out = acc * (tl.load(V_SCALE + off_hk * stride_vsc) / FP8_MAX) / l_safe[:, None]
    else:
        out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    tl.store(LSE + bh.to(tl.int64) * seqlen_q + offs_m, lse, mask=row_ok)
    if DESC:
        desc_o.store([off_b, off_h, start_m, 0], out.to(O.dtype.element_ty).reshape(1, 1, BLOCK_M, BLOCK_D))
    else:
        o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
        if EVEN_D:
            tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])
        else:
            tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
