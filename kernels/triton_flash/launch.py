"""Host launchers of the flash-attention kernels: input checks, allocation, grid, launch.

Every tensor goes in with its own four strides, so transposed / sliced / expanded (stride-0) inputs
work without copies. Shapes (``Hq % Hkv == 0``):

    q [B, Hq, Sq, D]   k [B, Hkv, Skv, D]   v [B, Hkv, Skv, D]   ->   o [B, Hq, Sq, D], lse [B, Hq, Sq] fp32

Launch configs are typed (:mod:`attntune.kernels.triton_flash.config`): :func:`forward` takes a
:class:`FlashFwdConfig`, :func:`backward` a :class:`FlashBwdConfig`.

The kernels launch through :class:`attntune.kernels.triton_launch.FastKernel`: every argument positional,
in the kernel's parameter order (constexprs included), with a key of everything Triton specializes on
(launch options and constexprs, dtypes, pointer alignment, the classes of the integer arguments). A
repeated specialization then costs a call of the compiled kernel's launcher, not Triton's binder (33.5 µs
of host time a launch on the H200 host against 8.7: ``probe_host_h200.json``) — four launches for a
forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from attntune.fp8 import FORMATS as FP8_FORMATS
from attntune.fp8 import check_scales
from attntune.kernels.triton_common import LOG2E, block_d, dot_precision
from attntune.kernels.triton_flash import jit_bwd, jit_fwd
from attntune.kernels.triton_flash.config import FlashBwdConfig, FlashFwdConfig
from attntune.kernels.triton_launch import FastKernel, aligned, int_classes

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256

_FWD = FastKernel(jit_fwd.flash_fwd_kernel)
_PRE = FastKernel(jit_bwd.bwd_preprocess_kernel)
_DKDV = FastKernel(jit_bwd.bwd_dkdv_kernel)
_DQ = FastKernel(jit_bwd.bwd_dq_kernel)


def _cdiv(a: int, b: int) -> int:
    """Ceil division. ``triton.cdiv`` is a ``ConstexprFunction`` in Triton 3.9: 2.7 µs a host call on the
    2-core CPU box, four calls a forward and backward."""
    return -(-a // b)


_PRE_BM = 64  # rows per program of the backward's preprocess kernel (o . dO row sums)

# Output allocation goes through these two names so that tests can poison every buffer the kernels
# must fully overwrite (an element left unwritten then shows up as NaN).
_empty_like = torch.empty_like
_empty = torch.empty


@dataclass(frozen=True)
class MaskArgs:
    """The mask as the kernels take it: ``diag_off`` = off; ``win_left``/``win_right`` only read when
    ``has_left``/``has_right`` (causal folded into ``win_right <= 0``)."""

    diag_off: int
    win_left: int
    win_right: int
    has_left: bool
    has_right: bool


def mask_args(
    seqlen_q: int, seqlen_kv: int, causal: bool, causal_align: str, window: tuple[int, int] | None
) -> MaskArgs:
    if causal_align not in ("bottom_right", "top_left"):
        raise ValueError(f"causal_align: expected 'bottom_right' or 'top_left', got {causal_align!r}")
    off = seqlen_kv - seqlen_q if causal_align == "bottom_right" else 0
    left, right = -1, -1
    if window is not None:
        left, right = int(window[0]), int(window[1])
        if left < -1 or right < -1:
            raise ValueError(f"window: sides must be >= 0 or -1 (unbounded), got {window}")
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return MaskArgs(off, max(left, 0), max(right, 0), left >= 0, right >= 0)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale=None, v_scale=None) -> None:
    """``ValueError`` naming the argument. FP8 K/V (codes of one format, both scales given: see
    :func:`attntune.fp8.check_scales`) take a float16/bfloat16 q; otherwise q, k, v share one dtype."""
    fp8 = k.dtype in FP8_FORMATS or v.dtype in FP8_FORMATS
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name}: expected [B, H, S, D], got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES and not (fp8 and name != "q" and t.dtype in FP8_FORMATS):
            raise ValueError(f"{name}: dtype {t.dtype} not supported (float16, bfloat16, float32"
                             + (", or FP8 codes with k_scale/v_scale)" if name != "q" else ")"))
    if fp8:
        if k.dtype != v.dtype:
            raise ValueError(f"k/v: FP8 codes must share one format, got {k.dtype} and {v.dtype}")
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"q: with FP8 k/v q must be float16 or bfloat16, got {q.dtype}")
        if k_scale is None or v_scale is None:
            raise ValueError(f"{'k_scale' if k_scale is None else 'v_scale'}: required with FP8 k/v ({k.dtype})")
        check_scales(k, k_scale, v_scale)
    elif k_scale is not None or v_scale is not None:
        raise ValueError(f"{'k_scale' if k_scale is not None else 'v_scale'}: only FP8 k/v take scales "
                         f"(k is {k.dtype})")
    elif not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"k/v: dtype must match q ({q.dtype}), got {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"k/v: device must match q ({q.device})")
    B, Hq, _, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError("k/v: batch must match q")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(f"k/v: head_dim must equal q's ({D}); head_dim_v != head_dim is not supported")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"q: head_dim {D} > {MAX_HEAD_DIM}")
    if v.shape[1] != k.shape[1] or v.shape[2] != k.shape[2]:
        raise ValueError("v: heads and seqlen must match k")
    if k.shape[1] == 0 or Hq % k.shape[1]:
        raise ValueError(f"k: heads_q ({Hq}) must be a multiple of heads_kv ({k.shape[1]})")


def descriptor_ok(t: torch.Tensor) -> bool:
    """Whether a 4-D tensor can be read through a tensor descriptor (TMA's rules): unit stride on the last
    axis, every other stride a non-zero multiple of 16 bytes, a 16-byte aligned base. Expanded (stride-0)
    K/V and odd head dims (e.g. D=20 in 16-bit: 40-byte rows) do not qualify."""
    es = t.element_size()
    return (t.stride(3) == 1 and t.data_ptr() % 16 == 0
            and all(s > 0 and (s * es) % 16 == 0 for s in t.stride()[:3]))


def v_transposed(v: torch.Tensor) -> bool:
    """V stored keys-contiguous (``[B, Hkv, D, Skv]`` memory seen as ``[B, Hkv, Skv, D]``: the FP8/TF32
    copy, or a cache kept that way): its descriptor then describes that memory (jit_fwd's ``V_T``)."""
    return v.stride(2) == 1 and v.stride(3) != 1


def _descriptors(q, k, v, o, bm: int, bn: int, bd: int):
    """4-D descriptors of q/k/v/o with the kernel's blocks, or None when one tensor does not qualify
    (the launch then takes pointer loads: same results, the config's LOADS is a preference). A V stored
    keys-contiguous (:func:`v_transposed`) is described as the ``[B, Hkv, D, Skv]`` tensor it is in memory,
    with ``[BD, BN]`` blocks that the kernel transposes in shared memory (K-major, as FP8 and TF32 dots
    want their B operand)."""
    vd = v.transpose(2, 3) if v_transposed(v) else v
    if not all(descriptor_ok(t) for t in (q, k, vd, o)):
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(t, block):
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, *block])

    return desc(q, (bm, bd)), desc(k, (bn, bd)), desc(vd, (bd, bn) if vd is not v else (bn, bd)), desc(o, (bm, bd))


def _keys_contiguous_copy(v: torch.Tensor) -> torch.Tensor:
    """V's values stored keys-contiguous: a ``[B, Hkv, D, Skv]`` buffer (each row padded to 16 bytes, so
    that a descriptor can describe it at any length) seen as ``[B, Hkv, Skv, D]``."""
    B, H, S, D = v.shape
    pad = max(1, 16 // v.element_size())
    buf = torch.empty((B, H, D, -(-S // pad) * pad), device=v.device, dtype=v.dtype)
    view = buf[..., :S]
    view.copy_(v.transpose(2, 3))
    return view.transpose(2, 3)


# Copy V keys-contiguous for TF32 dots (module switch: benchmarks/probe_tf32.py times both layouts).
TF32_V_KEYS = True


def v_keys_contiguous(q_dtype: torch.dtype, fp8: bool) -> bool:
    """Whether the forward stores V keys-contiguous (the same logical V as [B, Hkv, D, Skv]) before its
    launch: the PV dot's B operand is V's [BN, D] tile, and only 16-bit wgmma reads a B operand that is
    not K-major (keys-contiguous); FP8 and TF32 wgmma need it K-major (FA3 and Triton's tutorial transpose
    V for FP8 too). Measured on the H200: FP8, B2 S4096 D128 e4m3 (benchmarks/results/fp8_h200.json):
    2.19 -> 0.92 ms dense, 1.22 -> 0.53 ms causal, for a 0.057 ms copy. Descriptors describe the copy
    as the [B, Hkv, D, Skv] tensor it is (:func:`_descriptors`, jit_fwd's ``V_T``)."""
    if fp8:
        return True
    return TF32_V_KEYS and q_dtype == torch.float32 and dot_precision(q_dtype) == "tf32"


# Copy q, dO and k for the TF32 backward's B operands (module switch: benchmarks/probe_tf32.py times both).
TF32_B_COPIES = True


def tf32_b_copies(q_dtype: torch.dtype) -> bool:
    """Whether the backward gives its kernels row-contiguous copies of q and dO and a keys-contiguous copy
    of k (``jit_bwd``'s ``ALT_B``): TF32 dots, whose wgmma B operand must be K-major, as for V in the
    forward (:func:`v_keys_contiguous`). Three extra copies of inputs the backward reads anyway."""
    return TF32_B_COPIES and q_dtype == torch.float32 and dot_precision(q_dtype) == "tf32"


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskArgs, sm_scale: float, config: FlashFwdConfig,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B, Hq, Sq, D] (q's dtype, q's layout when dense), lse [B, Hq, Sq] fp32 (natural log).
    ``k_scale``/``v_scale`` (checked by :func:`check_inputs`): k/v are FP8 codes and both dots run in
    their format (:mod:`.jit_fwd`)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    o = _empty_like(q)  # keeps q's memory layout (e.g. [B, S, H, D] transposed views)
    lse = _empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    if Sq == 0 or B * Hq == 0:
        return o, lse
    BM, BN, BD = config.BLOCK_M, config.BLOCK_N, block_d(D)
    grid = _cdiv(Sq, BM) * B * Hq
    if Skv > 1 and v.stride(2) != 1 and v_keys_contiguous(q.dtype, k_scale is not None):
        v = _keys_contiguous_copy(v)
    descs = _descriptors(q, k, v, o, BM, BN, BD) if config.LOADS and Skv > 0 else None
    fp8 = k_scale is not None
    dot_prec = dot_precision(q.dtype)
    # 4 warps do not compile with Triton 3.6's warp specialization (see space.constraint_reasons): a
    # config given by hand that asks for it takes the plain descriptor loop (LOADS is a preference)
    ws = descs is not None and config.LOADS == 2 and config.num_warps >= 8
    ints = (*q.stride(), *k.stride(), *v.stride(), *o.stride(), Sq, Skv, D, Hq, Hq // Hkv,
            mask.diag_off, mask.win_left, mask.win_right)
    ksc = 0 if k_scale is None or k_scale.numel() == 1 else 1
    vsc = 0 if v_scale is None or v_scale.numel() == 1 else 1
    # the constexprs: BLOCK_M, BLOCK_N, BLOCK_D, HAS_LEFT, HAS_RIGHT, EVEN_D, DOT_PREC, DESC, V_T, WS, FP8,
    # FP8_MAX
    const = (BM, BN, BD, mask.has_left, mask.has_right, BD == D, dot_prec, descs is not None,
             descs is not None and v_transposed(v), ws, fp8,
             float(torch.finfo(k.dtype).max) if fp8 else 0.0)
    key = (config, q.dtype, k.dtype, const, aligned(q, k, v, o, lse, k_scale, v_scale),
           int_classes(*ints, ksc, vsc))
    _FWD(key, (grid, 1, 1), (q, k, v, o, lse, *ints, sm_scale * LOG2E, *(descs or (None,) * 4),
                             k_scale, v_scale, ksc, vsc, *const),
         config.num_warps, config.num_stages, q.get_device(), config.launch_opts())
    return o, lse


def backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    mask: MaskArgs,
    sm_scale: float,
    config: FlashBwdConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq [B, Hq, Sq, D], dk/dv [B, Hkv, Skv, D] in the inputs' dtype (fp32 accumulation)."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    dq, dk, dv = _empty_like(q), _empty_like(k), _empty_like(v)
    if Sq == 0 or Skv == 0 or B * Hq == 0:  # nothing attended: every gradient is zero
        return dq.zero_(), dk.zero_(), dv.zero_()
    BD = block_d(D)
    BM, BN = config.BWD_BLOCK_M, config.BWD_BLOCK_N
    dot_prec = dot_precision(q.dtype)
    opts = config.launch_opts()
    dev = q.get_device()
    # TF32: three backward dots read row/key-contiguous copies of q, dO and k (jit_bwd's ALT_B)
    alt = tf32_b_copies(q.dtype)
    qb, dob, kb = (t.transpose(2, 3).contiguous() for t in (q, do, k)) if alt else (None, None, None)

    delta = _empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    pre = (*o.stride(), *do.stride(), Sq, D, Hq)
    _PRE((o.dtype, do.dtype, BD, aligned(o, do, delta), int_classes(*pre)), (_cdiv(Sq, _PRE_BM) * B * Hq, 1, 1),
         (o, do, delta, *pre, _PRE_BM, BD), 4, None, dev)

    # shared by both kernels: q, k, v, dO strides, then lengths, head dim, heads, group, mask, scales
    qkv = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    tail = (Sq, Skv, D)
    mask_ints = (Hq // Hkv, mask.diag_off, mask.win_left, mask.win_right)
    scales = (sm_scale * LOG2E, sm_scale)
    # the constexprs after BLOCK_M/BLOCK_N: BLOCK_D, HAS_LEFT, HAS_RIGHT, EVEN_D, DOT_PREC, ALT_B
    const = (BD, mask.has_left, mask.has_right, BD == D, dot_prec, alt)
    key = (config, q.dtype, do.dtype, const)
    inputs_aligned = aligned(q, k, v, do, lse, delta)  # the six pointers both kernels read
    ints = (*qkv, *dk.stride(), *dv.stride(), *tail, Hkv, *mask_ints)
    _DKDV(key + (inputs_aligned + aligned(dk, dv, qb, dob), int_classes(*ints)),
          (_cdiv(Skv, BN) * B * Hkv, 1, 1),
          (q, k, v, do, lse, delta, dk, dv, qb, dob, *ints, *scales, BM, BN, *const),
          config.BWD_WARPS, config.BWD_STAGES, dev, opts)
    # the dQ kernel mirrors the roles: BWD_BLOCK_N rows resident, BWD_BLOCK_M keys streamed
    ints = (*qkv, *dq.stride(), *tail, Hq, *mask_ints)
    _DQ(key + (inputs_aligned + aligned(dq, kb), int_classes(*ints)),
        (_cdiv(Sq, BN) * B * Hq, 1, 1),
        (q, k, v, do, lse, delta, dq, kb, *ints, *scales, BN, BM, *const),
        config.BWD_WARPS, config.BWD_STAGES, dev, opts)
    return dq, dk, dv
