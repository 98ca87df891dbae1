"""Flash-attention backward: ``@triton.jit`` code only (host side: :mod:`.launch`).

FA2 scheme, without atomics (deterministic):

1. ``bwd_preprocess_kernel``: Delta[b, h, i] = sum_d dO[b,h,i,d] * O[b,h,i,d]              [B, Hq, Sq] fp32
2. ``bwd_dkdv_kernel``: one program owns a block of keys of one (batch, kv head); it streams the query
   blocks that can see those keys, for *every* query head of the GQA group in turn, and accumulates
   dV = sum P^T dO and dK = scale * sum dS^T Q in registers — the group sum happens in the kernel, so
   K/V are never repeated and no atomic adds are needed.
3. ``bwd_dq_kernel``: one program owns a block of query rows; it streams the key blocks of its window
   and accumulates dQ = scale * dS K.

with P = exp(S*scale - LSE) recomputed from the forward's LSE and dS = P * (dP - Delta), dP = dO V^T.

``ALT_B`` (TF32 dots): three dots take a B operand whose tile is D-contiguous in the inputs' layout — dV's
dO and dK's Q (``[BM, BD]``, K = rows) and dQ's K (``[BN, BD]``, K = keys) — and a TF32 wgmma on Hopper
reads only K-major B operands (16-bit ones may be either). With ``ALT_B`` the launcher passes row-contiguous
copies ``QB``/``DOB``/``KB`` (``x.transpose(2, 3).contiguous()``: ``[B, H, D, S]``, so element (s, d) of a
head sits at ``d * S + s``) and those three dots read their B tiles from the copies; the other dots keep the
D-contiguous tiles they need. Without it the kernels are the same code as before.
Rows that admitted no key have LSE = -inf; it is replaced by +inf here so that P = 0 and their
gradients are exactly zero. Rows past Sq and keys past Skv are loaded as zeros: a padded row gets
LSE = +inf (P = 0), a padded key has K = V = 0, so neither contributes to any stored gradient.
"""

import triton
import triton.language as tl
from attntune.kernels.triton_flash.jit_fwd import LOG2E, kv_block_range, load_tile


@triton.jit
def q_block_range(
    n0,
    seqlen_q,
    seqlen_kv,
    diag_off,
    win_left,
    win_right,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
):
    """Query ranges for keys [n0, n0+BLOCK_N): (lo, b, c, hi) as in ``kv_block_range`` with the axes
    swapped. Row i admits key j iff i >= j - off - right (right side) and i <= j - off + left."""
    if HAS_RIGHT:
        lo = tl.maximum(n0 - diag_off - win_right, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
        # first row that admits the *last* key of the block -> admits all of them (right side)
        full_lo = tl.maximum(n0 + BLOCK_N - 1 - diag_off - win_right, 0)
        full_lo = tl.cdiv(full_lo, BLOCK_M) * BLOCK_M
    else:
        lo = 0
        full_lo = 0
    if HAS_LEFT:
        n_last = tl.minimum(n0 + BLOCK_N, seqlen_kv) - 1
        hi = tl.minimum(n_last - diag_off + win_left + 1, seqlen_q)
        hi = tl.maximum(hi, 0)
        # rows < full_hi admit the *first* key of the block on the left -> all of them
        full_hi = tl.minimum(n0 - diag_off + win_left + 1, seqlen_q)
        full_hi = (tl.maximum(full_hi, 0) // BLOCK_M) * BLOCK_M
    else:
        hi = seqlen_q
        full_hi = (seqlen_q // BLOCK_M) * BLOCK_M
    hi_up = tl.cdiv(hi, BLOCK_M) * BLOCK_M
    b = tl.minimum(tl.maximum(full_lo, lo), hi_up)
    c = tl.maximum(b, full_hi)
    return lo, b, c, hi


@triton.jit
def bwd_preprocess_kernel(
    O,
    DO,
    DELTA,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    seqlen_q,
    head_dim,
    heads_q,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Grid: cdiv(Sq, BLOCK_M) * B * Hq. DELTA [B, Hq, Sq] contiguous fp32."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(seqlen_q, BLOCK_M)
    bh = pid // num_m
    off_b = bh // heads_q
    off_h = bh % heads_q
    offs_m = (pid % num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < head_dim)
    o = tl.load(
        O
        + off_b.to(tl.int64) * stride_ob
        + off_h.to(tl.int64) * stride_oh
        + offs_m[:, None] * stride_om
        + offs_d[None, :] * stride_od,
        mask=mask,
        other=0.0,
    )
    do = tl.load(
        DO
        + off_b.to(tl.int64) * stride_dob
        + off_h.to(tl.int64) * stride_doh
        + offs_m[:, None] * stride_dom
        + offs_d[None, :] * stride_dod,
        mask=mask,
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + bh.to(tl.int64) * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _load_row_stats(lse_ptr, delta_ptr, rows, row_ok, ROW_MASK: tl.constexpr):
    """LSE (in log2 units, empty/padded rows -> +inf so that P = 0) and Delta for rows [BM]."""
    if ROW_MASK:
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_ptr + rows, mask=row_ok, other=0.0)
    else:
        lse = tl.load(lse_ptr + rows)
        delta = tl.load(delta_ptr + rows)
    lse = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    return lse, delta


@triton.jit
def _dkdv_q_loop(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    qb_base,
    dob_base,
    lse_ptr,
    delta_ptr,
    stride_qm,
    stride_qd,
    stride_dom,
    stride_dod,
    offs_n,
    offs_d,
    d_ok,
    start,
    end,
    seqlen_q,
    diag_off,
    win_left,
    win_right,
    qk_scale,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    EVEN_D: tl.constexpr,
    DOT_PREC: tl.constexpr,
    ALT_B: tl.constexpr,
):
    """Accumulate dK, dV [BN, BD] (fp32) of a resident key block over query blocks [start, end). With
    ``ALT_B`` dV's dO and dK's Q tiles come from the row-contiguous copies at ``dob_base``/``qb_base``."""
    offs_m = tl.arange(0, BLOCK_M)
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + offs_m
        row_ok = rows < seqlen_q
        qt = load_tile(
            q_base + rows[None, :] * stride_qm + offs_d[:, None] * stride_qd,
            row_ok[None, :],
            d_ok[:, None],
            MASKED,
            EVEN_D,
        )  # [BD, BM]
        lse, delta = _load_row_stats(lse_ptr, delta_ptr, rows, row_ok, MASKED)
        qkt = tl.dot(k, qt, input_precision=DOT_PREC)  # [BN, BM]
        pt = tl.math.exp2(qkt * qk_scale - lse[None, :])
        if MASKED:
            diag = rows + diag_off
            ok = row_ok[None, :]
            if HAS_RIGHT:
                ok = ok & (offs_n[:, None] <= (diag + win_right)[None, :])
            if HAS_LEFT:
                ok = ok & (offs_n[:, None] >= (diag - win_left)[None, :])
            pt = tl.where(ok, pt, 0.0)
        do = load_tile(
            do_base + rows[:, None] * stride_dom + offs_d[None, :] * stride_dod,
            row_ok[:, None],
            d_ok[None, :],
            MASKED,
            EVEN_D,
        )  # [BM, BD]
        if ALT_B:
            do_b = load_tile(dob_base + rows[:, None] + offs_d[None, :] * seqlen_q, row_ok[:, None], d_ok[None, :],
                             MASKED, EVEN_D)  # [BM, BD], rows contiguous
            dv = tl.dot(pt.to(do.dtype), do_b, dv, input_precision=DOT_PREC)
        else:
            dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)  # [BN, BM]
        dst = pt * (dpt - delta[None, :])
        if ALT_B:
            q_b = load_tile(qb_base + rows[:, None] + offs_d[None, :] * seqlen_q, row_ok[:, None], d_ok[None, :],
                            MASKED, EVEN_D)  # [BM, BD], rows contiguous
            dk = tl.dot(dst.to(qt.dtype), q_b, dk, input_precision=DOT_PREC)
        else:
            dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    QB,  # ALT_B: q and dO copied row-contiguous ([B, Hq, D, Sq]); None otherwise
    DOB,
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
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    stride_dkd,
    stride_dvb,
    stride_dvh,
    stride_dvn,
    stride_dvd,
    seqlen_q,
    seqlen_kv,
    head_dim,
    heads_kv,
    group,
    diag_off,
    win_left,
    win_right,
    qk_scale,
    sm_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    EVEN_D: tl.constexpr,
    DOT_PREC: tl.constexpr,
    ALT_B: tl.constexpr,
):
    """Grid: cdiv(Skv, BLOCK_N) * B * Hkv. BLOCK_N keys stay resident; BLOCK_M query rows are streamed.
    DK/DV [B, Hkv, Skv, D] any strides; LSE/DELTA [B, Hq, Sq] contiguous fp32."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(seqlen_kv, BLOCK_N)
    bhk = pid // num_n
    start_n = (pid % num_n) * BLOCK_N
    off_b = bhk // heads_kv
    off_hk = bhk % heads_kv

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    col_ok = offs_n < seqlen_kv
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hk.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hk.to(tl.int64) * stride_vh
    k = load_tile(
        k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
        col_ok[:, None],
        d_ok[None, :],
        True,
        EVEN_D,
    )  # [BN, BD]
    v = load_tile(
        v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
        col_ok[:, None],
        d_ok[None, :],
        True,
        EVEN_D,
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    lo, b, c, hi = q_block_range(
        start_n, seqlen_q, seqlen_kv, diag_off, win_left, win_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    heads_q = heads_kv * group
    for g in range(group):
        off_h = off_hk * group + g  # the query heads that read this kv head
        q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        do_base = DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
        if ALT_B:
            head_copy = (off_b * heads_q + off_h).to(tl.int64) * seqlen_q * head_dim
            qb_base = QB + head_copy
            dob_base = DOB + head_copy
        else:
            qb_base = q_base
            dob_base = do_base
        row_stats = (off_b * heads_q + off_h).to(tl.int64) * seqlen_q
        lse_ptr = LSE + row_stats
        delta_ptr = DELTA + row_stats
        if HAS_RIGHT:
            dk, dv = _dkdv_q_loop(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                qb_base,
                dob_base,
                lse_ptr,
                delta_ptr,
                stride_qm,
                stride_qd,
                stride_dom,
                stride_dod,
                offs_n,
                offs_d,
                d_ok,
                lo,
                b,
                seqlen_q,
                diag_off,
                win_left,
                win_right,
                qk_scale,
                BLOCK_M,
                True,
                HAS_LEFT,
                HAS_RIGHT,
                EVEN_D,
                DOT_PREC,
                ALT_B,
            )
        dk, dv = _dkdv_q_loop(
            dk,
            dv,
            k,
            v,
            q_base,
            do_base,
            qb_base,
            dob_base,
            lse_ptr,
            delta_ptr,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            offs_n,
            offs_d,
            d_ok,
            b,
            c,
            seqlen_q,
            diag_off,
            win_left,
            win_right,
            qk_scale,
            BLOCK_M,
            False,
            HAS_LEFT,
            HAS_RIGHT,
            EVEN_D,
            DOT_PREC,
            ALT_B,
        )
        dk, dv = _dkdv_q_loop(
            dk,
            dv,
            k,
            v,
            q_base,
            do_base,
            qb_base,
            dob_base,
            lse_ptr,
            delta_ptr,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            offs_n,
            offs_d,
            d_ok,
            c,
            hi,
            seqlen_q,
            diag_off,
            win_left,
            win_right,
            qk_scale,
            BLOCK_M,
            True,
            HAS_LEFT,
            HAS_RIGHT,
            EVEN_D,
            DOT_PREC,
            ALT_B,
        )

    dk = dk * sm_scale
    dk_ptrs = (
        DK
        + off_b.to(tl.int64) * stride_dkb
        + off_hk.to(tl.int64) * stride_dkh
        + offs_n[:, None] * stride_dkn
        + offs_d[None, :] * stride_dkd
    )
    dv_ptrs = (
        DV
        + off_b.to(tl.int64) * stride_dvb
        + off_hk.to(tl.int64) * stride_dvh
        + offs_n[:, None] * stride_dvn
        + offs_d[None, :] * stride_dvd
    )
    if EVEN_D:
        mask = col_ok[:, None]
    else:
        mask = col_ok[:, None] & d_ok[None, :]
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=mask)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=mask)


@triton.jit
def _dq_kv_loop(
    dq,
    q,
    do,
    lse,
    delta,
    k_base,
    v_base,
    kb_base,
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
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    EVEN_D: tl.constexpr,
    DOT_PREC: tl.constexpr,
    ALT_B: tl.constexpr,
):
    """Accumulate dQ [BM, BD] (fp32, unscaled) of a resident query block over key blocks [start, end). With
    ``ALT_B`` the dQ dot's K tile comes from the keys-contiguous copy at ``kb_base``."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seqlen_kv
        kt = load_tile(
            k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd,
            col_ok[None, :],
            d_ok[:, None],
            MASKED,
            EVEN_D,
        )  # [BD, BN]
        qk = tl.dot(q, kt, input_precision=DOT_PREC)  # [BM, BN]
        p = tl.math.exp2(qk * qk_scale - lse[:, None])
        if MASKED:
            diag = offs_m + diag_off
            ok = col_ok[None, :]
            if HAS_RIGHT:
                ok = ok & (cols[None, :] <= (diag + win_right)[:, None])
            if HAS_LEFT:
                ok = ok & (cols[None, :] >= (diag - win_left)[:, None])
            p = tl.where(ok, p, 0.0)
        vt = load_tile(
            v_base + cols[None, :] * stride_vn + offs_d[:, None] * stride_vd,
            col_ok[None, :],
            d_ok[:, None],
            MASKED,
            EVEN_D,
        )  # [BD, BN]
        dp = tl.dot(do, vt, input_precision=DOT_PREC)  # [BM, BN]
        ds = p * (dp - delta[:, None])
        if ALT_B:
            k_b = load_tile(kb_base + cols[:, None] + offs_d[None, :] * seqlen_kv, col_ok[:, None], d_ok[None, :],
                            MASKED, EVEN_D)  # [BN, BD], keys contiguous
            dq = tl.dot(ds.to(kt.dtype), k_b, dq, input_precision=DOT_PREC)
        else:
            dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    KB,  # ALT_B: k copied keys-contiguous ([B, Hkv, D, Skv]); None otherwise
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
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_dqb,
    stride_dqh,
    stride_dqm,
    stride_dqd,
    seqlen_q,
    seqlen_kv,
    head_dim,
    heads_q,
    group,
    diag_off,
    win_left,
    win_right,
    qk_scale,
    sm_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    EVEN_D: tl.constexpr,
    DOT_PREC: tl.constexpr,
    ALT_B: tl.constexpr,
):
    """Grid: cdiv(Sq, BLOCK_M) * B * Hq. BLOCK_M query rows stay resident; BLOCK_N keys are streamed.
    DQ [B, Hq, Sq, D] any strides."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(seqlen_q, BLOCK_M)
    bh = pid // num_m
    start_m = (num_m - 1 - pid % num_m) * BLOCK_M  # longest (causal) blocks first
    off_b = bh // heads_q
    off_h = bh % heads_q
    off_hk = off_h // group

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    row_ok = offs_m < seqlen_q
    q = load_tile(
        Q
        + off_b.to(tl.int64) * stride_qb
        + off_h.to(tl.int64) * stride_qh
        + offs_m[:, None] * stride_qm
        + offs_d[None, :] * stride_qd,
        row_ok[:, None],
        d_ok[None, :],
        True,
        EVEN_D,
    )
    do = load_tile(
        DO
        + off_b.to(tl.int64) * stride_dob
        + off_h.to(tl.int64) * stride_doh
        + offs_m[:, None] * stride_dom
        + offs_d[None, :] * stride_dod,
        row_ok[:, None],
        d_ok[None, :],
        True,
        EVEN_D,
    )
    row_stats = bh.to(tl.int64) * seqlen_q
    lse, delta = _load_row_stats(LSE + row_stats, DELTA + row_stats, offs_m, row_ok, True)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hk.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hk.to(tl.int64) * stride_vh
    if ALT_B:
        kb_base = KB + (off_b * (heads_q // group) + off_hk).to(tl.int64) * seqlen_kv * head_dim
    else:
        kb_base = k_base
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, b, c, hi = kv_block_range(
        start_m, seqlen_kv, diag_off, win_left, win_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT
    )
    if HAS_LEFT:
        dq = _dq_kv_loop(
            dq,
            q,
            do,
            lse,
            delta,
            k_base,
            v_base,
            kb_base,
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
            BLOCK_N,
            True,
            HAS_LEFT,
            HAS_RIGHT,
            EVEN_D,
            DOT_PREC,
            ALT_B,
        )
    dq = _dq_kv_loop(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        kb_base,
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
        BLOCK_N,
        False,
        HAS_LEFT,
        HAS_RIGHT,
        EVEN_D,
        DOT_PREC,
        ALT_B,
    )
    dq = _dq_kv_loop(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        kb_base,
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
        BLOCK_N,
        True,
        HAS_LEFT,
        HAS_RIGHT,
        EVEN_D,
        DOT_PREC,
        ALT_B,
    )

    dq = dq * sm_scale
    dq_ptrs = (
        DQ
        + off_b.to(tl.int64) * stride_dqb
        + off_h.to(tl.int64) * stride_dqh
        + offs_m[:, None] * stride_dqm
        + offs_d[None, :] * stride_dqd
    )
    if EVEN_D:
        tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
