"""Host launcher of split-K flash-decoding: argument checks, tile sizes, split count, allocation, grid.

Everything here is host arithmetic on shapes; the device code is in :mod:`.jit`. Strides of every
tensor go to the kernels explicitly, so any strided view (a slice of a paged-out cache, a transposed
``[B, S, H, D]`` tensor) works without a copy. Causal and the sliding window reach the kernel as one
pair of left/right bounds (:func:`mask_bounds`).
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Tuple

import torch

from attntune.kernels.launch_config import LaunchConfig, at_least, knob, pow2_at_least, warps_valid
from attntune.kernels.triton_common import LOG2E, MIN_BLOCK, ON_ROCM, block_d, next_pow2
from attntune.kernels.triton_decode.jit import decode_reduce_kernel, decode_split_kernel
from attntune.kernels.triton_launch import FastKernel, int_classes
from attntune.problem import canonical_mask, validate_window

MAX_SPLITS = 64
_INT32_MAX = 2**31 - 1
#: the fewest keys "auto" gives one split: below this a program's fixed cost (loading Q, writing a
#: partial row per query row) outweighs the bandwidth it adds (H200: 8 splits of 128 keys beat 4 of 256
#: at B=1, KV=1024)
MIN_KEYS_PER_SPLIT = 128
#: shared memory per SM assumed when the device does not say (H100/H200: 228 KiB)
DEFAULT_SMEM_PER_SM = 228 * 1024
#: most shared memory (by :func:`kv_smem_bytes`) a config may plan for one program: H100/H200 allow
#: 227 KiB per block; the estimate is loose for small BLOCK_M but wgmma tiles (BLOCK_M >= 64) add Q and P
#: staging (measured: BLOCK_M 64, D 256, BLOCK_N 64, 2 stages -> 160 KiB, estimate 128 KiB)
SMEM_BLOCK_BUDGET = 160 * 1024
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: FP8 K/V caches (codes, with float32 scales; q and the output in float16/bfloat16). e4m3fnuz is what
#: ROCm gfx942 computes in — a code path only, untested (no AMD GPU).
FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz")
                   if hasattr(torch, n))


@dataclass(frozen=True)
class DecodeConfig(LaunchConfig):
    """The decode op's launch config (:mod:`attntune.kernels.launch_config`). ``num_splits == 0`` /
    ``num_stages == 0`` mean "auto": chosen per call from the shape and the device
    (:func:`auto_num_splits`, :func:`auto_num_stages`); a dict may spell them ``"auto"`` or None."""

    BLOCK_N: int = knob(64, (16, 32, 64, 128, 256), "keys per tile", valid=pow2_at_least(MIN_BLOCK))
    num_splits: int = knob(0, (0, 1, 2, 4, 8, 16, 32, MAX_SPLITS), "splits of the key axis (0 = auto)",
                           valid=lambda v: None if 0 <= v <= MAX_SPLITS else f"must be in [0, {MAX_SPLITS}] (0 = auto)")
    num_warps: int = knob(4, (1, 2, 4, 8), "warps per program", valid=warps_valid)
    num_stages: int = knob(0, (0, 1, 2, 3, 4), "software-pipeline stages of the K/V loads (0 = auto)",
                           valid=at_least(0, " (0 = auto)"))

    @classmethod
    def coerce(cls, name: str, value):
        if name in ("num_splits", "num_stages") and value in ("auto", None):
            return 0
        return super().coerce(name, value)


def block_m(group: int, seqlen_q: int, d: int) -> int:
    """Rows per program: all ``group*seqlen_q`` rows in one tile when they fit, so K/V is read once.

    Capped so the fp32 accumulator ``[BLOCK_M, BLOCK_D]`` stays within 16 K elements (128 x 128, or
    64 x 256): beyond that the program would spill registers; more rows then take extra row blocks,
    which re-read the same K/V tiles mostly from L2.
    """
    want = max(MIN_BLOCK, next_pow2(max(1, group * seqlen_q)))
    cap = max(MIN_BLOCK, 16384 // block_d(d))
    return min(want, cap)


def kv_smem_bytes(stages: int, block_n: int, bd: int, bdv: int, itemsize: int) -> int:
    """Upper estimate of a program's shared memory: ``stages`` K and V tiles (Triton keeps one fewer in
    flight, plus scratch; measured on H200: 38 KiB at 2 stages and 70 KiB at 3 for BLOCK_N 64, D 128,
    bf16, against 64 and 96 KiB here)."""
    return stages * block_n * (bd + bdv) * itemsize


@functools.lru_cache(maxsize=16)
def _device_info(device_index: int):
    p = torch.cuda.get_device_properties(device_index)
    return p.multi_processor_count, int(getattr(p, "shared_memory_per_multiprocessor", 0) or DEFAULT_SMEM_PER_SM)


def device_info(device: torch.device):
    """(SM/CU count, shared memory per SM) of ``device``; an H100/H200's for the CPU interpreter."""
    if device.type != "cuda":
        return 132, DEFAULT_SMEM_PER_SM
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return _device_info(idx)


def mask_bounds(causal: bool, window: Optional[Tuple[int, int]], seqlen_q: int,
                s_max: int) -> Tuple[Optional[int], Optional[int]]:
    """The kernel's (left, right) reach around each row's diagonal key; ``None`` = unbounded.

    Causal is a right reach of 0, so causal ∩ window ``(l, r)`` is ``(l, min(r, 0))`` (``-1`` in
    ``window`` = unbounded). A side that can exclude no key is dropped, so the kernel compiles without its
    mask: with ``L <= s_max`` keys, row ``i``'s window is ``[L - Sq + i - l, L - Sq + i + r]``; the right
    side admits every key when ``r >= Sq - 1`` (row 0 reaches key ``L - 1``), the left side when
    ``l >= s_max - 1`` (row ``Sq - 1`` reaches key 0). This is :func:`attntune.problem.canonical_mask`
    for bottom-right alignment, read as the kernel's two bounds.

    >>> mask_bounds(True, None, 1, 4096)        # causal with one query: the diagonal is the last key
    (None, None)
    >>> mask_bounds(True, None, 4, 4096)        # speculative decode: the diagonal matters
    (None, 0)
    >>> mask_bounds(True, (1023, -1), 1, 32768)
    (1023, None)
    >>> mask_bounds(False, (8000, 2), 3, 4096)  # a window wider than the cache
    (None, None)
    """
    causal, _, window = canonical_mask(seqlen_q, s_max, False, causal, "bottom_right", window)
    if causal:
        return None, 0
    if window is None:
        return None, None
    return (window[0] if window[0] >= 0 else None), (window[1] if window[1] >= 0 else None)


def keys_per_program(s_max: int, seqlen_q: int, left: Optional[int]) -> int:
    """The most keys one program reads: ``S_max``, or under a left bound ``l`` the keys
    ``[L - Sq - l, L)`` that rows ``0..Sq-1`` reach, ``min(S_max, l + Sq)``."""
    return s_max if left is None or left < 0 else min(s_max, left + seqlen_q)


def length_range(seqlen_q: int, s_max: int, causal: bool, window: Optional[Tuple[int, int]],
                 block_n: int) -> Tuple[int, int]:
    """The KV lengths ``[lo, hi]`` around ``s_max`` (``lo <= s_max <= hi``) over which every input of
    :func:`_plan` that depends on the length keeps its value: the mask's bounds (:func:`mask_bounds`),
    the split chunk count and the tile count of the span (:func:`keys_per_program`). A launch prepared
    for ``s_max`` serves each of them with only the length argument changed — a decode loop's new
    length costs no planning (Triton's class of the length is the caller's to check).

    Without a left bound the span is the length, so the range is where its tile count
    (``BLOCK_N`` keys) and chunk count (``max(BLOCK_N, MIN_KEYS_PER_SPLIT)`` keys) hold. A left bound
    ``l`` exists only from ``S = l + 2`` on (below, it admits every key: :func:`mask_bounds`) and caps
    the span at ``l + Sq``: from ``max(l + Sq, l + 2)`` on, nothing depends on the length any more.

    >>> length_range(1, 1500, True, None, 64)          # tiles of 64 and chunks of 128 keys
    (1473, 1535)
    >>> length_range(1, 5000, True, (1023, -1), 64)    # a sliding window full of keys: every longer cache
    (1025, 2147483647)
    >>> length_range(1, 1000, True, (1023, -1), 64)    # still shorter than the window
    (961, 1023)
    """
    left = mask_bounds(causal, window, seqlen_q, _INT32_MAX)[0]  # the left bound of long enough caches
    lo, hi = 1, _INT32_MAX
    if left is not None:
        saturated = max(left + seqlen_q, left + 2)
        if s_max >= saturated:
            return saturated, _INT32_MAX
        if s_max <= left + 1:
            hi = left + 1
        else:
            lo, hi = left + 2, saturated - 1
    m = max(block_n, MIN_KEYS_PER_SPLIT)
    chunks, tiles = s_max // m, -(-s_max // block_n)
    return max(lo, chunks * m, (tiles - 1) * block_n + 1), min(hi, (chunks + 1) * m - 1, tiles * block_n)


def auto_num_splits(programs: int, seqlen_kv: int, sms: int, block_n: int) -> int:
    """Split count that fills the GPU: about two programs per SM in all, at least
    ``MIN_KEYS_PER_SPLIT`` keys (and one tile) per split, a power of two, at most ``MAX_SPLITS``.

    ``programs`` = batch * kv heads * row blocks, the programs one split gives. ``seqlen_kv`` = the most
    keys one program reads: ``S_max``, or ``min(S_max, l + Sq)`` under a left window bound ``l`` (the
    splits divide the window's keys, not the cache).

    >>> auto_num_splits(8, 8192, 132, 64)      # B=1, Hkv=8: 33 wanted -> 32 splits of 256 keys
    32
    >>> auto_num_splits(256, 8192, 132, 64)    # B=32, Hkv=8: the batch alone fills the GPU
    1
    >>> auto_num_splits(8, 1024, 132, 64)      # short cache: 8 splits of 128 keys
    8
    >>> auto_num_splits(8, 1023 + 1, 132, 64)  # window (1023, 0) over any cache, Sq=1: 8, not 32
    8
    """
    if programs >= sms:
        return 1
    want = math.ceil(2 * sms / max(1, programs))
    by_len = max(1, seqlen_kv // max(MIN_KEYS_PER_SPLIT, block_n))
    n = min(want, by_len, MAX_SPLITS)
    return 1 << (n.bit_length() - 1)  # round down to a power of two: fewer compiled variants


def auto_num_stages(programs: int, sms: int, smem_per_sm: int, block_n: int, bd: int, bdv: int,
                    itemsize: int) -> int:
    """3 pipeline stages when every program can be resident at once with 3 stages (and 3 fit the
    per-program budget ``SMEM_BLOCK_BUDGET``), else 2.

    A decode program streams K/V and does little math, so its speed is the bytes it keeps in flight:
    a third stage adds them (H200, B=32, KV=8192, 256 programs: 237 µs vs 259 µs at 2 stages) unless the
    extra shared memory pushes programs into a second wave (B=64, KV=4096, 512 programs: 2 stages win;
    both from the sweep in ``benchmarks/results/decode_h200_run1.json``).

    >>> auto_num_stages(256, 132, 228 * 1024, 64, 128, 128, 2)
    3
    >>> auto_num_stages(512, 132, 228 * 1024, 64, 128, 128, 2)
    2
    """
    need = kv_smem_bytes(3, block_n, bd, bdv, itemsize)
    if need > SMEM_BLOCK_BUDGET:
        return 2
    return 3 if programs <= (smem_per_sm // need) * sms else 2


class LaunchPlan(NamedTuple):
    grid: Tuple[int, int, int]
    splits: int
    block_m: int
    block_d: int
    block_dv: int
    even_d: bool
    num_warps: int
    num_stages: int
    block_s: int  # reduction: splits padded to a power of two
    reduce_warps: int
    eager_fused: bool  # split, and an eager launch combines in the split kernel (EAGER_FUSE_MAX_BYTES)
    has_left: bool  # the kernel's window bounds (mask_bounds); reach 0 where unbounded (then unread)
    has_right: bool
    win_left: int
    win_right: int


def plan_launch(B: int, Hq: int, Sq: int, D: int, Hkv: int, S_max: int, Dv: int, itemsize: int,
                sms: int, smem_per_sm: int, cfg: DecodeConfig, causal: bool = False,
                window: Optional[Tuple[int, int]] = None) -> LaunchPlan:
    """Everything about a launch that depends on shapes and mask only. ``window`` is a ``(left, right)``
    tuple, ``-1`` = unbounded.

    A decode loop brings a new ``S_max`` every step, but the plan depends on it only through the mask's
    bounds and the number of keys one program reads (the span), and on the span only through the two
    tile counts that set the split count. The plan is cached on those (:func:`_plan`): a new length costs
    a few arithmetic operations and one cache hit, not a new plan (the host cost of a new length is part
    of every decode step)."""
    left, right = mask_bounds(causal, window, Sq, S_max)
    span = max(keys_per_program(S_max, Sq, left), 1)
    bn = cfg.BLOCK_N
    return _plan(B, Hq, Sq, D, Hkv, Dv, itemsize, sms, smem_per_sm, cfg, left, right,
                 span // (bn if bn > MIN_KEYS_PER_SPLIT else MIN_KEYS_PER_SPLIT), -(-span // bn))


@functools.lru_cache(maxsize=4096)
def _plan(B: int, Hq: int, Sq: int, D: int, Hkv: int, Dv: int, itemsize: int, sms: int, smem_per_sm: int,
          cfg: DecodeConfig, left: Optional[int], right: Optional[int], split_chunks: int,
          tiles: int) -> LaunchPlan:
    """:func:`plan_launch` for a span of ``tiles`` tiles of ``BLOCK_N`` keys holding ``split_chunks``
    chunks of ``max(MIN_KEYS_PER_SPLIT, BLOCK_N)`` keys (:func:`auto_num_splits`' length limit)."""
    group = Hq // Hkv
    bd, bdv = block_d(D), block_d(Dv)
    bm = block_m(group, Sq, max(D, Dv))
    m_blocks = -(-group * Sq // bm)
    programs = B * Hkv * m_blocks
    splits = cfg.num_splits or auto_num_splits(programs, split_chunks * max(MIN_KEYS_PER_SPLIT, cfg.BLOCK_N),
                                               sms, cfg.BLOCK_N)
    # More splits than tiles only adds empty programs and partial rows.
    splits = max(1, min(splits, tiles))
    stages = cfg.num_stages or auto_num_stages(programs * splits, sms, smem_per_sm, cfg.BLOCK_N, bd, bdv,
                                               itemsize)
    bs = max(2, next_pow2(splits))
    # about 32 fp32 partial values per thread: the reduction's [BLOCK_S, BLOCK_DV] tile sits in registers
    reduce_warps = min(8, max(1, next_pow2(bs * bdv // 1024)))
    # K/V bytes the launch reads (its span rounded up to whole tiles): small enough, the eager call is
    # host-bound and one launch beats two; larger, the fused combine's tail costs more than a launch saves
    eager_fused = splits > 1 and B * Hkv * tiles * cfg.BLOCK_N * (D + Dv) * itemsize <= EAGER_FUSE_MAX_BYTES
    return LaunchPlan((B * Hkv, splits, m_blocks), splits, bm, bd, bdv, bd == D and bdv == Dv,
                      cfg.num_warps, stages, bs, reduce_warps, eager_fused, left is not None, right is not None,
                      left or 0, right or 0)


def check_window(window) -> Optional[Tuple[int, int]]:
    """``window`` as a ``(left, right)`` tuple of ints (hashable, for the plan cache), or None; raise
    ``ValueError`` naming ``window`` unless it is a pair of integers >= -1 (the core's rule,
    :func:`attntune.problem.validate_window`)."""
    return validate_window(window)


def check_decode_args(q, k_cache, v_cache, kv_lens, max_seqlen_q: int = 16, k_scale=None,
                      v_scale=None) -> None:
    """Raise ``ValueError`` naming the argument when the inputs do not fit the decode op (the window is
    checked by :func:`check_window`; FP8 scales by :func:`check_scales`, called from here)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES and not (name != "q" and t.dtype in FP8_DTYPES):
            raise ValueError(f"{name}: dtype {t.dtype} not supported; expected float16, bfloat16 or float32"
                             + (" (or FP8 codes with scales)" if name != "q" else ""))
        if t.device != q.device:
            raise ValueError(f"{name}: device {t.device} differs from q's {q.device}")
    fp8 = k_cache.dtype in FP8_DTYPES
    if fp8 or v_cache.dtype in FP8_DTYPES:
        if k_cache.dtype != v_cache.dtype:
            raise ValueError(f"k_cache/v_cache: FP8 caches must share one format, got {k_cache.dtype} and "
                             f"{v_cache.dtype}")
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"q: with FP8 k_cache/v_cache q must be float16 or bfloat16, got {q.dtype}")
    elif k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"k_cache/v_cache: dtype must match q ({q.dtype})")
    check_scales(k_cache, k_scale, v_scale)
    B, Hq, Sq, D = q.shape
    Bk, Hkv, S, Dk = k_cache.shape
    if Bk != B or v_cache.shape[0] != B:
        raise ValueError(f"k_cache/v_cache: batch must be {B} (q's), got {Bk} and {v_cache.shape[0]}")
    if Dk != D:
        raise ValueError(f"k_cache: head_dim {Dk} must equal q's {D}")
    if tuple(v_cache.shape[1:3]) != (Hkv, S):
        raise ValueError(f"v_cache: [B, Hkv, S_max] must match k_cache's {(B, Hkv, S)}, got "
                         f"{tuple(v_cache.shape[:3])}")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"q: heads ({Hq}) must be a multiple of k_cache's heads ({Hkv})")
    if Sq > max_seqlen_q:
        raise ValueError(f"q: seqlen_q {Sq} > {max_seqlen_q}; decode handles 1..{max_seqlen_q} query "
                         f"positions (use a prefill kernel)")
    if max(D, v_cache.shape[3]) > 256:
        raise ValueError(f"q/v_cache: head_dim up to 256 supported, got {D} and {v_cache.shape[3]}")
    if kv_lens is not None:
        if not isinstance(kv_lens, torch.Tensor) or kv_lens.dim() != 1 or kv_lens.shape[0] != B:
            raise ValueError(f"kv_lens: expected a 1-D tensor of length batch={B}")
        if kv_lens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"kv_lens: expected int32 (or int64), got {kv_lens.dtype}")
        if kv_lens.device != q.device:
            raise ValueError(f"kv_lens: device {kv_lens.device} differs from q's {q.device}")


def check_scales(k_cache: torch.Tensor, k_scale, v_scale) -> None:
    """FP8 caches need both scales, other caches none. A scale is a float32 tensor on the cache's device
    with one element (the whole tensor) or ``Hkv`` elements (one per kv head, contiguous)."""
    fp8 = k_cache.dtype in FP8_DTYPES
    for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not fp8:
            if sc is not None:
                raise ValueError(f"{name}: only FP8 caches take scales (k_cache is {k_cache.dtype})")
            continue
        if sc is None:
            raise ValueError(f"{name}: required with FP8 k_cache/v_cache ({k_cache.dtype})")
        if not isinstance(sc, torch.Tensor) or sc.dtype != torch.float32:
            raise ValueError(f"{name}: expected a float32 tensor, got "
                             f"{sc.dtype if isinstance(sc, torch.Tensor) else type(sc).__name__}")
        if sc.device != k_cache.device:
            raise ValueError(f"{name}: device {sc.device} differs from k_cache's {k_cache.device}")
        hkv = k_cache.shape[1]
        per_head = sc.numel() == hkv and hkv > 1
        if sc.numel() not in (1, hkv) or (per_head and (sc.dim() != 1 or sc.stride(0) != 1)):
            raise ValueError(f"{name}: expected one scale or a contiguous [Hkv={hkv}] tensor, got shape "
                             f"{tuple(sc.shape)}")


def scale_stride(sc: Optional[torch.Tensor]) -> int:
    """The kernel's stride over kv heads for a checked scale tensor: 0 for one scale, 1 per head."""
    return 0 if sc is None or sc.numel() == 1 else 1


#: the two kernels, launched through their cached CompiledKernels (:mod:`attntune.kernels.triton_launch`)
_SPLIT = FastKernel(decode_split_kernel)
_REDUCE = FastKernel(decode_reduce_kernel)
#: split partials, one float32 buffer per (device, thread), reused by the eager calls made on the device's
#: default stream: calls on one stream run in order, so the next call's partials never overwrite ones still
#: being read (one allocation fewer per call: 4 µs of host time on the H200 host). Allocated per call
#: instead (a) while a CUDA graph is being captured (the graph owns a buffer from its own pool), (b) on any
#: other stream — torch.compile's CUDA-graph trees run their warm-up on a side stream with allocations routed
#: to the graph pool, and a buffer kept from there is a live pool allocation the tree rejects ("tensor(s) in
#: the cudagraph pool not tracked as outputs"), and (c) above ``WORKSPACE_CACHE_BYTES``.
_WORKSPACE: Dict[Tuple[int, int], torch.Tensor] = {}
#: raw handles of CUDA's default streams: the legacy one (0) and the per-thread one (2)
_DEFAULT_STREAMS = (0, 2)
WORKSPACE_CACHE_BYTES = 64 << 20
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _keep_key(dev_idx: int) -> Optional[Tuple[int, int]]:
    """Where an eager call's buffers are kept: (device, thread) for a call on the device's default stream
    outside a capture, else None (allocate per call; see :data:`_WORKSPACE`). Decided once per launch for
    both of its buffers."""
    if dev_idx < 0 or _raw_stream is None or _raw_stream(dev_idx) not in _DEFAULT_STREAMS \
            or torch.cuda.is_current_stream_capturing():
        return None
    return (dev_idx, threading.get_ident())


def _kept(cache: Dict[Tuple[int, int], torch.Tensor], n: int, key: Optional[Tuple[int, int]],
          make) -> torch.Tensor:
    """A buffer of at least ``n`` elements from ``make(n)``: kept in ``cache`` under ``key``
    (:func:`_keep_key`) up to ``WORKSPACE_CACHE_BYTES``, fresh where ``key`` is None or above that."""
    if key is None or n * 4 > WORKSPACE_CACHE_BYTES:
        return make(n)
    buf = cache.get(key)
    if buf is None or buf.numel() < n:
        buf = make(n)
        cache[key] = buf
    return buf


def _workspace(n: int, device: torch.device, key: Optional[Tuple[int, int]]) -> torch.Tensor:
    return _kept(_WORKSPACE, n, key, lambda m: torch.empty(m, device=device, dtype=torch.float32))


#: the fused reduction's arrival counters, kept like the partials (:data:`_WORKSPACE`). They are zero
#: when allocated and every launch leaves them zero (the last arrival resets its counter), so one buffer
#: serves every later call on the stream; a fresh one (a CUDA graph's, another stream's) is zeroed.
_SEMAPHORES: Dict[Tuple[int, int], torch.Tensor] = {}
#: eager split-K launches combine their splits in the split kernel's last program (one launch) instead
#: of a second kernel; False keeps the two-kernel path (a switch for tests and for comparing both on a
#: device). Launches captured in a CUDA graph always take the two-kernel path. Measured on the H200
#: (``probe_decode_eager_fused_h200.json``, 8 calls a step, B 1/8, D 64/128, KV 1k-16k): eagerly the fused
#: launch was 1.25-1.40x faster a step where a call reads <= 33.5 MB of K/V (host-bound: one launch
#: instead of two); under a graph, where launches cost nothing, the two-kernel path's device time was
#: 1.1-1.8x lower (the last split's combine is a serial tail of ~4 µs).
FUSED_REDUCE = True
#: ... and only launches that read at most this many K/V bytes (B * Hkv * keys * (D + Dv) * itemsize):
#: measured on the H200 host (``probe_decode_eager_fused_h200.json``, 8 eager calls a step), fused won
#: at 33.5 MB a call (1.25-1.38x a step: B 1 D 64 KV 16k, B 8 D 128 KV 1k) and lost at 67 MB (0.89-0.93x:
#: B 8 D 64 KV 4k, B 1 D 128 KV 16k), where the device, not the host, sets the pace and the last split's
#: combine (~4 µs) outweighs the launch it saves.
EAGER_FUSE_MAX_BYTES = 48 << 20
#: ROCm keeps the two-kernel path: the fused combine's cross-program visibility (an acq_rel arrival at GPU
#: scope, then ``.cg`` loads of the other programs' partials) is tested on NVIDIA only, and MI300's
#: per-XCD L2s make "reads bypass L1" a weaker promise there. Untested on AMD hardware either way.
FUSE_ON_ROCM = False
_ROCM = ON_ROCM


def _semaphores(n: int, device: torch.device, key: Optional[Tuple[int, int]]) -> torch.Tensor:
    return _kept(_SEMAPHORES, n, key, lambda m: torch.zeros(m, device=device, dtype=torch.int32))


class DecodeLaunch(NamedTuple):
    """One launch of the decode op with every argument but the tensors and the KV length fixed: what
    :func:`prepare_decode` derives from the shapes, strides, alignments, mask and config. It serves every
    KV length in ``[lo, hi]`` of Triton's class of the one it was prepared for (:meth:`covers`): a decode
    loop over views into one cache (a new length every step) and a repeated shape launch from it with
    one tuple and one or two calls of the compiled kernels (:meth:`launch`)."""

    grid: Tuple[int, int, int]
    split: bool
    fused: bool         # split, with the reduction in the split kernel's last program (FUSED_REDUCE)
    ws_numel: int       # float32 partials (O then LSE) when split, else 0
    key: tuple          # the split kernel's FastKernel key (everything Triton specializes on)
    head: tuple         # its arguments after (q, k, v, kv_lens, ws, out, sem, k_scale, v_scale): the strides,
    rest: tuple         # ... S_max (k_cache.shape[2] at each launch), then these
    num_warps: int
    num_stages: int
    rgrid: Tuple[int, int, int]
    rkey: Optional[tuple]
    rtail: tuple        # the reduction's arguments after (ws, out)
    reduce_warps: int
    out_shape: Tuple[int, int, int, int]  # [B, Hq, Sq, Dv]
    plan: LaunchPlan
    plan_args: tuple    # plan_launch's arguments but S_max, in its order (B, Hq, Sq, D, Hkv, Dv, ..., window)
    lo: int             # the KV lengths this launch serves: [lo, hi] (length_range; 1 only for a length of 1)
    hi: int
    div16: bool         # ... of Triton's class of the length it was prepared for: divisible by 16, or not

    def launch(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               kv_lens: Optional[torch.Tensor], out: torch.Tensor, dev_idx: int,
               k_scale: Optional[torch.Tensor] = None,
               v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Launch into ``out`` (allocated with the layout this launch was prepared for) over the KV tensors'
        length (one :meth:`covers`). The partials buffer comes from :func:`_workspace` (its alignment is
        the caching allocator's: 512 bytes)."""
        ws = sem = out
        if self.split:
            keep = _keep_key(dev_idx)
            ws = sem = _workspace(self.ws_numel, q.device, keep)
            # the counters are read only when fused; otherwise any pointer of the key's alignment stands in
            if self.fused:
                sem = _semaphores(self.grid[0] * self.grid[2], q.device, keep)
        # without scales any pointer stands in (never read: HAS_SCALE is False)
        ksc = out if k_scale is None else k_scale
        vsc = out if v_scale is None else v_scale
        _SPLIT(self.key, self.grid, (q, k_cache, v_cache, kv_lens, ws, out, sem, ksc, vsc, *self.head,
                                     k_cache.shape[2], *self.rest),
               self.num_warps, self.num_stages, dev_idx)
        if self.split and not self.fused:
            _REDUCE(self.rkey, self.rgrid, (ws, out) + self.rtail, self.reduce_warps, None, dev_idx)
        return out

    @property
    def cfg(self) -> "DecodeConfig":
        """The config this launch was prepared with (``plan_args`` holds plan_launch's arguments)."""
        return self.plan_args[9]

    def covers(self, s_max: int) -> bool:
        """Whether this launch serves KV tensors of length ``s_max`` (and this launch's strides): the plan
        is the same (:func:`length_range`) and so is Triton's class of the length (divisible by 16 or not;
        a length of 1, a class of its own, gets a launch whose range is itself)."""
        return self.lo <= s_max <= self.hi and (s_max % 16 == 0) == self.div16


def prepare_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   kv_lens: Optional[torch.Tensor], out: torch.Tensor, causal: bool, scale: float,
                   cfg: DecodeConfig, dot_precision: str = "tf32",
                   window: Optional[Tuple[int, int]] = None, k_scale: Optional[torch.Tensor] = None,
                   v_scale: Optional[torch.Tensor] = None) -> DecodeLaunch:
    """The :class:`DecodeLaunch` of these inputs (checked, as for :func:`launch_decode`). It depends on
    the tensors only through their shapes, dtypes, strides and the 16-byte alignment of their data
    pointers (and ``kv_lens``' dtype), and on whether a CUDA graph is being captured (:data:`FUSED_REDUCE`),
    so a caller may keep it for later calls that agree on those."""
    B, Hq, Sq, D = q.shape
    Hkv, S_max, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    sms, smem = device_info(q.device)
    # K/V bytes per element: what the plan's size rules count (FP8 caches read half of bf16's)
    kv_size = k_cache.element_size()
    plan_args = (B, Hq, Sq, D, Hkv, Dv, kv_size, sms, smem, cfg, bool(causal), window)
    p = plan_launch(B, Hq, Sq, D, Hkv, S_max, Dv, kv_size, sms, smem, cfg, bool(causal), window)
    has_scale = k_scale is not None
    ksc_stride, vsc_stride = scale_stride(k_scale), scale_stride(v_scale)
    split = p.splits > 1
    fused = (p.eager_fused and FUSED_REDUCE and (FUSE_ON_ROCM or not _ROCM)
             and not (q.is_cuda and torch.cuda.is_current_stream_capturing()))
    # the fused combine's chunk of splits: a [chunk, BLOCK_DV] tile of about 32 floats a thread
    rbs = min(p.block_s, max(2, next_pow2(p.num_warps * 32 * 32 // p.block_dv))) if fused else 2
    rows = B * Hq * Sq
    lse_off = rows * p.splits * Dv
    qs, ks, vs, os_ = q.stride(), k_cache.stride(), v_cache.stride(), out.stride()
    # Everything Triton compiles for — launch options, constexprs, pointer types (dtypes) and alignment,
    # the classes of the specialized integers and the width of the large ones — and nothing else: the
    # grid, the split count and the lengths change with every KV length of a decode loop and must not
    # make a new key (each would take Triton's slow launch path once and grow the cache). The partials
    # buffer is a fresh or cached allocation of the caching allocator: 16-byte aligned.
    key = (p.num_warps, p.num_stages, split, fused, rbs, p.has_left, p.has_right, p.block_m, cfg.BLOCK_N, p.block_d,
           p.block_dv, p.even_d, q.dtype, None if kv_lens is None else (kv_lens.dtype, kv_lens.data_ptr() % 16 == 0),
           dot_precision, D, Dv, q.data_ptr() % 16 == 0, k_cache.data_ptr() % 16 == 0,
           v_cache.data_ptr() % 16 == 0, True if split else out.data_ptr() % 16 == 0, out.data_ptr() % 16 == 0,
           int_classes(*qs, *ks, *vs, *os_, S_max, lse_off),
           # FP8: the caches' code type, the scales' alignment and per-head stride (0/1: specialized)
           (k_cache.dtype, v_cache.dtype, k_scale.data_ptr() % 16 == 0, v_scale.data_ptr() % 16 == 0,
            ksc_stride, vsc_stride) if has_scale else None)
    head = (*qs, *ks, *vs, *os_, Hkv, Hq // Hkv, Sq)  # then S_max, read from k_cache at each launch
    rest = (D, Dv, p.splits, lse_off, p.win_left, p.win_right, scale * LOG2E,
            ksc_stride, vsc_stride,
            kv_lens is not None, split, fused, has_scale,  # HAS_LENS, SPLIT, FUSED, HAS_SCALE
            p.has_left, p.has_right,  # HAS_LEFT/RIGHT
            p.block_m, cfg.BLOCK_N, p.block_d, p.block_dv, p.even_d, dot_precision, rbs)
    rkey = rtail = None
    if split and not fused:
        rkey = (p.block_s, p.block_dv, p.reduce_warps, out.dtype, Dv, True, out.data_ptr() % 16 == 0,
                int_classes(*os_, lse_off))
        rtail = (*os_, Hq, Sq, Dv, p.splits, lse_off, p.block_s, p.block_dv)
    # the lengths that share this launch: same plan inputs (length_range), same Triton class (a length of 1
    # is a class of its own; a length past int32 changes the argument's width)
    lo, hi = length_range(Sq, S_max, bool(causal), window, cfg.BLOCK_N) if S_max > 1 else (1, 1)
    return DecodeLaunch(p.grid, split, fused, rows * p.splits * (Dv + 1) if split else 0, key, head, rest,
                        p.num_warps, p.num_stages, (rows, 1, 1), rkey, rtail or (), p.reduce_warps, (B, Hq, Sq, Dv),
                        p, plan_args, max(lo, 2) if S_max > 1 else 1, min(hi, _INT32_MAX), S_max % 16 == 0)


def launch_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  kv_lens: Optional[torch.Tensor], out: torch.Tensor, causal: bool, scale: float,
                  cfg: DecodeConfig, dot_precision: str = "tf32",
                  window: Optional[Tuple[int, int]] = None, k_scale: Optional[torch.Tensor] = None,
                  v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Launch the split kernel (and the reduction when more than one split): ``out`` [B, Hq, Sq, Dv]
    receives the result. Inputs are assumed checked (:func:`check_decode_args`, :func:`check_window`:
    ``window`` a tuple). No host synchronisation; safe to capture in a CUDA graph once a call of the same
    shapes has run (compiled) outside the capture."""
    if out.numel() == 0:
        return out
    return prepare_decode(q, k_cache, v_cache, kv_lens, out, causal, scale, cfg, dot_precision, window,
                          k_scale, v_scale).launch(q, k_cache, v_cache, kv_lens, out, q.get_device(), k_scale,
                                                   v_scale)
