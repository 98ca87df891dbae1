"""Host side of the Gluon forward: argument checks, TMA descriptors, the launch (kernel: :mod:`.jit`)."""

from __future__ import annotations

import functools
import math
from typing import Optional, Tuple

import torch

from attntune.kernels.gluon_flash.config import HEAD_DIM_MULTIPLE, MAX_HEAD_DIM, GluonFwdConfig
from attntune.kernels.triton_common import LOG2E, block_d
from attntune.kernels.triton_flash.launch import mask_args

_GL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
#: the CUDA grid's second axis holds batch * query heads
MAX_GRID_Y = 65535


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """``ValueError`` naming the argument for what the kernel cannot take: 4-D ``[B, H, S, D]`` tensors of one
    16-bit dtype on one CUDA device, ``Hq % Hkv == 0``, one head dim (a multiple of 8, at most 128), the last
    stride 1 and the others multiples of 16 bytes with 16-byte aligned data (what TMA descriptors need)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name}: expected [B, H, S, D], got shape {tuple(t.shape)}")
        if t.dtype not in _GL_DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} not supported (float16, bfloat16)")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, q on {q.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the head dim must be contiguous (stride 1), got strides {t.stride()}")
        if any(s * t.element_size() % 16 for s in t.stride()[:-1]) or t.data_ptr() % 16:
            raise ValueError(f"{name}: strides {t.stride()} and the data pointer must be 16-byte multiples (TMA)")
    d = q.shape[-1]
    if k.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(f"k/v: head dims {k.shape[-1]}/{v.shape[-1]} must equal q's {d}")
    if d % HEAD_DIM_MULTIPLE or d > MAX_HEAD_DIM:
        raise ValueError(f"q: head dim {d} must be a multiple of {HEAD_DIM_MULTIPLE} and at most {MAX_HEAD_DIM}")
    if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0]:
        raise ValueError(f"k/v: shapes {tuple(k.shape)} / {tuple(v.shape)} do not match q's batch {q.shape[0]}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"k: {k.shape[1]} kv heads do not divide q's {q.shape[1]} heads")


@functools.lru_cache(maxsize=64)
def _smem_layout(rows: int, bd: int, dtype: torch.dtype):
    """The shared-memory layout of a [1, 1, rows, bd] block (cached: building it is ~60 % of a descriptor's host
    cost, 6.6 of 11 µs on a 2-core VM)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, bd], getattr(gl, _GL_DTYPES[dtype]))


def _desc(t: torch.Tensor, rows: int, bd: int):
    """A 4-D TMA descriptor over ``t`` [B, H, S, D] with block [1, 1, rows, bd] (zero fill past S and D)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, bd], _smem_layout(rows, bd, t.dtype))


@functools.cache
def kernel(ws: int):
    """The jit function of a config's schedule (``GluonFwdConfig.WS``), looked up once per schedule: the import
    (Gluon) happens at the first launch or compile, not per call."""
    if ws:
        from attntune.kernels.gluon_flash.jit_ws import fa_fwd_ws
        return fa_fwd_ws
    from attntune.kernels.gluon_flash.jit import fa_fwd
    return fa_fwd


def positive_scale(q: torch.Tensor, scale: Optional[float]) -> Tuple[torch.Tensor, float]:
    """``(q', s)`` with ``s > 0`` and ``q' . k * s`` the scores of ``q . k * scale`` (``scale`` None: 1/sqrt(D)). The
    kernels fold the scale into the running max (``max(s) * scale``), valid only for a positive scale: a negative one
    runs as ``(-q) * |scale|``; at zero every admitted score is 0 but a masked one would be ``-inf * 0 = NaN``, so it
    runs as ``q * 0`` at scale 1 (as ``triton_flash``'s op does)."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if s < 0:
        return -q, -s
    if s == 0:
        return q * 0.0, 1.0
    return q, s


def q_rows(cfg: GluonFwdConfig) -> int:
    """Rows of the Q and O descriptors' blocks: the program's, or one consumer's under WS."""
    return cfg.BLOCK_M // 2 if cfg.WS else cfg.BLOCK_M


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: GluonFwdConfig, *, causal: bool = False,
            causal_align: str = "bottom_right", window: Optional[Tuple[int, int]] = None,
            scale: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, Hq, Sq, D] over k/v [B, Hkv, Skv, D] (:func:`check_inputs`) with the mask of
    :mod:`attntune.problem`; returns (out [B, Hq, Sq, D] in q's dtype, contiguous; lse [B, Hq, Sq] float32,
    natural log, -inf for a row that admits no key — its output row is 0)."""
    check_inputs(q, k, v)
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    ma = mask_args(sq, skv, causal, causal_align, window)
    if b * hq > MAX_GRID_Y:
        raise ValueError(f"q: batch * heads = {b * hq} > {MAX_GRID_Y} (the launch grid's second axis)")
    o = torch.empty(b, hq, sq, d, device=q.device, dtype=q.dtype)
    lse = torch.empty(b, hq, sq, device=q.device, dtype=torch.float32)
    if o.numel() == 0 or skv == 0:  # nothing to compute, or no key at all: zeros and LSE -inf (no descriptor
        return o.zero_(), lse.fill_(float("-inf"))  # over an empty axis)
    bd = block_d(d)
    q, sm_scale = positive_scale(q, scale)
    qk_scale = sm_scale * LOG2E
    bm, bn = cfg.BLOCK_M, cfg.BLOCK_N
    qrows = q_rows(cfg)
    kernel(cfg.WS)[(-(-sq // bm), b * hq)](
        _desc(q, qrows, bd), _desc(k, bn, bd), _desc(v, bn, bd), _desc(o, qrows, bd), lse,
        sq, skv, hq, hq // hkv, ma.diag_off, ma.win_left, ma.win_right, qk_scale,
        BM=bm, BN=bn, BD=bd, STAGES=cfg.num_stages, HAS_LEFT=ma.has_left, HAS_RIGHT=ma.has_right,
        **cfg.launch_opts())
    return o, lse


def compile_for(cfg: GluonFwdConfig, head_dim: int, *, has_left: bool = False, has_right: bool = False,
                dtype: torch.dtype = torch.bfloat16, arch: int = 90):
    """Compile the kernel for ``sm_{arch}`` without a GPU (the installed Triton's compiler and ptxas): the compiled
    kernel (``.asm["ptx"]``, ``.metadata.shared``). For checks and tests on a CPU machine; launches compile
    through the JIT instead."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    bd = block_d(head_dim)
    t = torch.empty(1, 1, 256, head_dim, dtype=dtype)
    rows = (q_rows(cfg), cfg.BLOCK_N, cfg.BLOCK_N, q_rows(cfg))
    sig = {n: mangle_type(_desc(t, r, bd)) for n, r in zip(("desc_q", "desc_k", "desc_v", "desc_o"), rows)}
    sig.update({"LSE": "*fp32", **{n: "i32" for n in ("seqlen_q", "seqlen_kv", "heads_q", "group", "diag_off",
                                                       "win_left", "win_right")}, "qk_scale": "fp32"})
    ce = {"BM": cfg.BLOCK_M, "BN": cfg.BLOCK_N, "BD": bd, "STAGES": cfg.num_stages, "HAS_LEFT": has_left,
          "HAS_RIGHT": has_right}
    sig.update({n: "constexpr" for n in ce})
    return triton.compile(GluonASTSource(kernel(cfg.WS), sig, constexprs=ce), target=GPUTarget("cuda", arch, 32),
                          options={**cfg.launch_opts(), "num_stages": 1})
