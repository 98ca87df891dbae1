"""The ``triton_decode`` variant: split-K flash-decoding over a KV cache (:mod:`.triton_decode`).

For decode and speculative decode (1..16 query positions), forward only; kv_lens, causal and sliding
windows, all aligned bottom-right per sequence (the queries are the last positions of each sequence; a
top-left problem runs only where it is the same mask). Its tunables: ``BLOCK_N``
(keys per tile), ``num_splits`` (0 = chosen per call from the shape and SM count), ``num_warps``,
``num_stages`` (0 = chosen per call from the program count and shared memory).
"""

from __future__ import annotations

from typing import List, Optional

import torch

from attntune.kernels.base import Config, Space, Variant
from attntune.kernels.launch_config import cached_parser
from attntune.kernels.triton_common import block_d, device_reasons, dot_precision
from attntune.kernels.triton_decode.launch import (SMEM_BLOCK_BUDGET, DecodeConfig, DecodeLaunch, block_m,
                                                   keys_per_program, kv_smem_bytes, prepare_decode)
from attntune.kernels.triton_launch import int_classes
from attntune.tolerances import tf32_allowed
from attntune.problem import KV_DTYPES, AttentionProblem

MAX_SEQLEN_Q = 16
#: Eager calls (not being captured in a CUDA graph) whose programs each read at most this many K+V bytes
#: run one split, whatever the tuned config says: tuned decode configs are ranked by device time under
#: CUDA graphs (two-kernel split-K), but an eager decode step is host-bound. Even against the fused
#: combine (one launch either way) one split skips the arrival counters, the partials and the combine's
#: tail. Measured on the H200 (``benchmarks/results/probe_decode_eager_fused_h200.json``, 8 eager calls a
#: step): one split 1.14-1.26x faster a step than the fused split at 256 and 512 KiB a program (KV 1024,
#: D 64 and 128, B 1 and 8); at 1 MiB and more it is 3-10x slower (one program streams too little).
EAGER_ONE_SPLIT_BYTES = 512 * 1024
#: prepared launches one plan keeps (one per layout: a decode loop over contiguous caches makes one per KV
#: length, their strides differ); past this many they are dropped and re-prepared on use
MAX_LAUNCHES = 4096
#: launches kept per layout for other length ranges (a loop alternating between caches of other lengths)
MAX_SPARE = 4
MAX_HEAD_DIM = 256
#: fp32 accumulator + score elements one thread may hold before the kernel spills
MAX_REGS_PER_THREAD = 192


class TritonDecodeVariant(Variant):
    name = "triton_decode"
    family = "triton"
    description = ("Triton split-K flash-decoding: K/V tiles read once per GQA group and query block, "
                   "splits over the key axis (of the window only) combined by LSE; kv_lens, causal, "
                   "sliding window; forward only, Sq <= 16")
    # space() reads head dims, the GQA group, Sq (exact in its bucket up to 16) and dtype only
    space_depends_on_lengths = False
    # FP8 K/V caches: codes widened in registers, K's scale folded into the softmax scale, V's applied to
    # the output (kernels/triton_decode/jit.py)
    kv_dtypes = tuple(KV_DTYPES)
    source_modules = (
        "attntune.kernels.launch_config",
        "attntune.kernels.triton_common",
        "attntune.kernels.triton_launch",
        "attntune.kernels.triton_decode.jit",
        "attntune.kernels.triton_decode.launch",
        "attntune.kernels.triton_decode.op",
        "attntune.kernels.triton_decode_variant",
    )

    def __init__(self) -> None:
        self._config = cached_parser(DecodeConfig)  # stored dict -> DecodeConfig, once per distinct dict
        self._single = {}   # DecodeConfig -> the same with num_splits 1

    def _one_split(self, cfg: DecodeConfig) -> DecodeConfig:
        one = self._single.get(cfg)
        if one is None:
            one = self._single.setdefault(cfg, cfg.replace(num_splits=1))
        return one

    def supports(self, problem: AttentionProblem) -> List[str]:
        reasons = device_reasons(problem)
        if problem.kv_dtype is not None:
            from attntune.fp8 import device_kv_reasons

            reasons.extend(device_kv_reasons(problem.kv_dtype, problem.device_type))
        if problem.seqlen_q > MAX_SEQLEN_Q:
            reasons.append(f"seqlen_q {problem.seqlen_q} > {MAX_SEQLEN_Q} (a decode kernel; use prefill)")
        if problem.mode == "fwd_bwd":
            reasons.append("forward only (no backward: decode is inference)")
        if problem.head_dim > MAX_HEAD_DIM:
            reasons.append(f"head_dim {problem.head_dim} > {MAX_HEAD_DIM}")
        if problem.head_dim != problem.head_dim_v:
            reasons.append(f"head_dim_v {problem.head_dim_v} != head_dim {problem.head_dim}")
        if (problem.causal or problem.window is not None) and problem.causal_align == "top_left":
            # The kernel's diagonal (causal and window alike) is the last Sq positions of each sequence
            # (bottom-right). Top-left gives the same mask only when it puts row 0 at key 0 too: Sq == Skv
            # without kv_lens.
            if problem.kv_lens or problem.seqlen_q != problem.seqlen_kv:
                reasons.append("causal/window with top-left alignment (only bottom-right decode alignment)")
        return reasons

    def space(self, problem: AttentionProblem) -> Space:
        bd = block_d(max(problem.head_dim, problem.head_dim_v))
        bm = block_m(problem.group, max(1, problem.seqlen_q), bd)
        itemsize = problem.torch_dtype.itemsize

        def constraint(cfg: DecodeConfig) -> List[str]:
            out = []
            n, w, st = cfg.BLOCK_N, cfg.num_warps, cfg.num_stages
            # auto stages (0) resolve to 3 only when 3 fit the budget, else 2
            smem = kv_smem_bytes(st or 2, n, bd, bd, itemsize)
            if smem > SMEM_BLOCK_BUDGET:
                out.append(f"K/V pipeline needs about {smem} B of shared memory > {SMEM_BLOCK_BUDGET}")
            regs = (bm * bd + 2 * bm * n) // (32 * w)  # accumulator + scores/probabilities, fp32
            if regs > MAX_REGS_PER_THREAD:
                out.append(f"about {regs} fp32 registers per thread for tiles (BLOCK_M={bm}) > "
                           f"{MAX_REGS_PER_THREAD}: would spill")
            if n > 128 and bd > 128:
                out.append("BLOCK_N > 128 with head_dim > 128 exceeds the register file")
            return out

        # Measured on H200 (benchmarks/results/decode_h200.json, "sweep"): BLOCK_N 64 with auto splits and
        # stages is within 5% of the best of 84 swept configs on each of 8 decode shapes, B=1 to B=64.
        default = DecodeConfig()
        if constraint(default):  # e.g. 128 rows x 256 dims: more warps
            default = DecodeConfig(BLOCK_N=32, num_warps=8)
        # the knobs' domains are DecodeConfig's: 0 = auto for splits (from the actual call's shape and the
        # SM count: robust across a tune bucket) and stages (3 when all programs stay resident, else 2)
        return DecodeConfig.space(default, constraint, rocm=False)

    def eager_config(self, cfg: DecodeConfig, seqlen_q: int, seqlen_kv: int, window, bytes_per_key: int,
                     cuda: bool) -> DecodeConfig:
        """The config of an eager call (not captured in a CUDA graph) of this exact shape.

        Tuned decode configs are ranked by device time under CUDA graphs. Outside a graph a small decode
        is host-bound, and one split saves the reduction's launch and the partials buffer, so a call
        whose programs each read at most :data:`EAGER_ONE_SPLIT_BYTES` (``bytes_per_key``: K and V bytes
        of one key) runs one split."""
        if cfg.num_splits == 1 or not cuda:
            return cfg
        span = keys_per_program(seqlen_kv, seqlen_q, None if window is None else window[0])
        return self._one_split(cfg) if span * bytes_per_key <= EAGER_ONE_SPLIT_BYTES else cfg

    def family_generic(self, problem: AttentionProblem, config: Config) -> bool:
        # supports() reads the lengths only for a causal/window mask aligned top-left (kv_lens, Sq != Skv);
        # the space does not depend on lengths; BoundDecode takes every shape from the tensors.
        return problem.causal_align == "bottom_right" or not (problem.causal or problem.window is not None)

    def bind(self, problem: AttentionProblem, config: Config) -> "BoundDecode":
        return BoundDecode(self, problem, config)

    def run(self, q, k, v, problem: AttentionProblem, config: Config,
            kv_lens: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
            v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        return BoundDecode(self, problem, config)(q, k, v, problem, config, kv_lens, k_scale, v_scale)


class BoundDecode:
    """``triton_decode``'s run for one plan, serving every shape of the plan's family (see
    :meth:`Variant.family_generic`): the runtime keeps one of these for a decode loop, whose KV length
    is new at every step.

    The host path of a decode step is its speed (an eager step is host-bound). The runtime has validated
    the inputs' consistency (its family signature), so the public op's argument checks are skipped;
    everything a launch needs besides the tensors and the KV length — tile sizes, splits, grid, the
    kernels' specialization keys and argument tails, the output's shape
    (:class:`~attntune.kernels.triton_decode.launch.DecodeLaunch`) — is prepared on the first call of each
    *layout* and kept, and serves the layout's other KV lengths while their plan is the same
    (:meth:`DecodeLaunch.covers`: a serving loop's views into one cache take one prepared launch per 64 to
    128 lengths, and a sliding window full of keys one for every longer cache). A layout is what the
    prepared launch depends on that the plan does not fix: the batch and query length (q's shape), Triton's
    class of the KV length (divisible by 16), whether a CUDA graph is being captured (eager calls may
    run one split, see :meth:`TritonDecodeVariant.eager_config`, and eager split-K combines in the split
    kernel: :data:`~attntune.kernels.triton_decode.launch.FUSED_REDUCE`), the strides of q/k/v, their
    pointers' 16-byte alignment, ``kv_lens``' dtype and alignment, and (float32 only) whether TF32 is
    allowed. Layouts that differ only in the strides' values, not in Triton's classes of them (HF's dynamic
    cache: a new contiguous K/V tensor every step), share prepared launches with the strides swapped in. The
    output is allocated here (contiguous, the caching allocator's alignment), so its layout
    is fixed. The mask, scale and config are the plan's: equal for every shape of the family (its
    signature holds the canonical mask)."""

    __slots__ = ("variant", "cfg", "causal", "window", "scale", "fp32", "cuda", "bytes_per_key", "launches",
                 "spare", "twins")

    def __init__(self, variant: TritonDecodeVariant, problem: AttentionProblem, config: Config):
        self.variant = variant
        self.cfg = variant._config(config)
        self.causal, self.window, self.scale = problem.causal, problem.window, problem.softmax_scale
        self.fp32 = problem.dtype == "float32"
        self.cuda = problem.device_type == "cuda"
        kv_size = (problem.torch_dtype if problem.kv_dtype is None else KV_DTYPES[problem.kv_dtype]).itemsize
        self.bytes_per_key = (problem.head_dim + problem.head_dim_v) * kv_size
        self.launches = {}  # layout -> the launch that served it last
        self.spare = {}     # layout -> the launches prepared for it, latest first (other length ranges)
        self.twins = {}     # layout with Triton's classes of the strides -> launches prepared, latest first

    def __call__(self, q, k, v, problem: AttentionProblem, config: Config,
                 kv_lens: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
                 v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        capturing = q.is_cuda and _capturing()
        tf32 = tf32_allowed() if self.fp32 else True
        s = k.shape[2]
        layout = (q.shape, s % 16 == 0, capturing, tf32, q.stride(), k.stride(), v.stride(), q.data_ptr() % 16,
                  k.data_ptr() % 16, v.data_ptr() % 16,
                  None if kv_lens is None else (kv_lens.dtype, kv_lens.data_ptr() % 16),
                  # FP8: one scale or one per head, and their alignment (the launch specializes on both)
                  None if k_scale is None else (k_scale.numel(), v_scale.numel(), k_scale.data_ptr() % 16,
                                                v_scale.data_ptr() % 16))
        launch = self.launches.get(layout)
        if launch is None or not launch.lo <= s <= launch.hi:  # the layout fixes the length's class
            return self._first(layout, q, k, v, kv_lens, capturing, k_scale, v_scale)
        return launch.launch(q, k, v, kv_lens, q.new_empty(launch.out_shape), q.get_device(), k_scale, v_scale)

    def _first(self, layout, q, k, v, kv_lens, capturing: bool, k_scale=None, v_scale=None) -> torch.Tensor:
        """A call whose layout has no launch for its KV length yet: one of the layout's launches for other
        length ranges (a loop that alternates between two caches), else a new one."""
        out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
        if out.numel() == 0:
            return out
        s = k.shape[2]
        spare = self.spare.get(layout) or []
        launch = next((x for x in spare if x.lo <= s <= x.hi), None)
        if launch is None:
            # A layout that differs from a prepared one only in its strides' values, not in Triton's classes
            # of them (HF's dynamic cache: a new contiguous K/V tensor every step, other batch and head
            # strides): that launch with this call's strides, instead of a new prepare (9.5 µs on a 2-core
            # CPU host, once per step). The output's strides are those of q's shape (allocated above).
            twin_key = layout[:4] + (int_classes(*q.stride(), *k.stride(), *v.stride()),) + layout[7:]
            twins = self.twins.get(twin_key) or []
            twin = next((x for x in twins if x.lo <= s <= x.hi), None)
            if twin is not None:
                launch = twin._replace(head=(*q.stride(), *k.stride(), *v.stride(), *twin.head[12:]))
            else:
                launch = self._prepare(q, k, v, kv_lens, out, capturing, k_scale, v_scale)
                self.twins[twin_key] = [launch] + twins[:MAX_SPARE - 1]
            if len(self.launches) >= MAX_LAUNCHES:  # e.g. contiguous caches of ever new lengths: new strides
                self.launches.clear()
                self.spare.clear()
            self.spare[layout] = [launch] + spare[:MAX_SPARE - 1]
        self.launches[layout] = launch
        return launch.launch(q, k, v, kv_lens, out, q.get_device(), k_scale, v_scale)

    def _prepare(self, q, k, v, kv_lens, out, capturing: bool, k_scale, v_scale) -> DecodeLaunch:
        """A launch for these inputs whose length range (:meth:`DecodeLaunch.covers`) keeps this call's
        config too: an eager call's one-split choice (:meth:`TritonDecodeVariant.eager_config`) changes with
        the length, so the range is cut where it would."""
        s, sq = k.shape[2], q.shape[2]
        if capturing:
            return prepare_decode(q, k, v, kv_lens, out, self.causal, self.scale, self.cfg, dot_precision(q.dtype),
                                  self.window, k_scale, v_scale)

        def config(n: int) -> DecodeConfig:
            return self.variant.eager_config(self.cfg, sq, n, self.window, self.bytes_per_key, self.cuda)

        cfg = config(s)
        launch = prepare_decode(q, k, v, kv_lens, out, self.causal, self.scale, cfg, dot_precision(q.dtype),
                                self.window, k_scale, v_scale)
        lo, hi = launch.lo, launch.hi
        # the one-split choice is monotone in the length: find where it flips inside [lo, hi]
        if config(hi) is not cfg:
            top = s  # config(top) is cfg, config(hi) is not
            while hi - top > 1:
                mid = (top + hi) // 2
                top, hi = (mid, hi) if config(mid) is cfg else (top, mid)
            hi = top
        if config(lo) is not cfg:
            bottom = s
            while bottom - lo > 1:
                mid = (lo + bottom) // 2
                lo, bottom = (lo, mid) if config(mid) is cfg else (mid, bottom)
            lo = bottom
        return launch if (lo, hi) == (launch.lo, launch.hi) else launch._replace(lo=lo, hi=hi)


_capturing = torch.cuda.is_current_stream_capturing

VARIANTS = [TritonDecodeVariant()]
