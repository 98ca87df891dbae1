"""The attention problem: what one attention call asks for, independent of any implementation.

Tensor layout everywhere in attntune (the layout of ``torch.nn.functional.scaled_dot_product_attention``):

    q: [B, Hq, Sq, D]      k: [B, Hkv, Skv, D]      v: [B, Hkv, Skv, Dv]      out: [B, Hq, Sq, Dv]

with ``Hq % Hkv == 0`` (GQA/MQA: query head ``h`` reads kv head ``h // (Hq // Hkv)``).

Mask semantics (exact). Let ``off = Skv - Sq`` when ``causal_align == "bottom_right"`` and ``0`` when
``"top_left"``. With ``kv_lens`` and ``"bottom_right"`` the offset is per sequence,
``off_b = kv_lens[b] - Sq``: the queries are the last ``Sq`` positions of each sequence's *own* length,
not of the padded ``Skv`` (the FlashAttention/vLLM convention for a padded KV cache, which decode with
``Sq > 1`` and chunked prefill need; for ``Sq == 1`` both readings coincide). Query row ``i`` of batch
element ``b`` may attend key column ``j`` iff all of these hold:

* causal:            ``j <= i + off``
* window (l, r):     ``i + off - l <= j <= i + off + r`` (a side given as -1 is unbounded)
* kv_lens:           ``j < kv_lens[b]`` (per batch element)

A row with no admissible key yields zeros (as FlashAttention), never NaN. ``kv_lens`` values are clamped
to ``[0, Skv]`` first; the clamped length is the one the diagonal uses.

Canonical problems (:func:`canonical_mask`, :meth:`AttentionProblem.canonical`): many argument sets
describe the same mask, and every problem is reduced to the simplest one before it is keyed or planned,
so that equivalent calls share a key, a plan and the cheapest implementation:

* causal ∩ window ``(l, r)`` is the one window ``(l, min(r, 0))`` (-1 on the right counts as +inf);
* a window side that admits every key of every row is unbounded (the left side when
  ``l >= Sq - 1 + off``, the right side when ``r >= Skv - 1 - off``; with ``kv_lens`` and bottom-right
  alignment the per-sequence offset never makes these weaker);
* the window ``(-1, 0)`` is ``causal`` and ``(-1, -1)`` is no mask at all — so a bottom-right causal
  mask with ``Sq <= 1`` (one decode row sees every key) is no mask;
* the alignment of a problem without causal/window mask, or with ``Sq == Skv`` and no ``kv_lens``, is
  ``bottom_right`` (both alignments coincide there).
"""

from __future__ import annotations

import operator
from typing import Any, Literal, Optional, Tuple

import torch
from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from attntune.tolerances import tf32_active

Mode = Literal["fwd", "fwd_bwd"]
Align = Literal["bottom_right", "top_left"]

#: Decode-like problems: at most this many query rows (one new token, or a few speculative ones). Their
#: KV length typically changes at every call, so per-shape setup costs matter (kernels/sdpa.py).
DECODE_MAX_SQ = 16

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

#: FP8 formats of a K/V cache (``kv_dtype``): K and V hold these codes, with float32 scales beside them
#: (``k_scale``/``v_scale`` of :func:`attntune.attention`); q and the output stay float16/bfloat16.
#: e4m3fnuz is ROCm gfx942's format (a code path, untested without an AMD GPU).
KV_DTYPES = {n: getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz") if hasattr(torch, n)}
KV_DTYPE_NAMES = {v: k for k, v in KV_DTYPES.items()}
#: q dtypes an FP8 K/V cache may serve
FP8_Q_DTYPES = ("float16", "bfloat16")


#: the largest size (batch, heads, lengths, head dim) a key or a --shape takes: kernels index them in 32-bit ints
SIZE_MAX = 2**31 - 1
#: a window side at or beyond this admits every key of any sequence that fits in memory: larger sides are
#: clamped to it (canonicalisation then makes the side unbounded), so no size overflows a kernel's int
WINDOW_SIDE_MAX = SIZE_MAX


def validate_window(window: Any) -> Optional[Tuple[int, int]]:
    """``window`` as a ``(left, right)`` tuple of Python ints, or None. Each side is an integer (a bool is
    not), ``-1`` (unbounded) or ``>= 0``; any size is accepted and clamped to :data:`WINDOW_SIDE_MAX`
    (a side that long covers every key). Anything else — floats (``inf``, ``1.7``), bools, strings,
    ``None`` sides, other lengths — raises ``ValueError`` naming ``window``.

    >>> validate_window((10**30, 0)), validate_window((-1, 3))
    ((2147483647, 0), (-1, 3))
    """
    if window is None:
        return None
    if type(window) is tuple and len(window) == 2:  # the common case, checked cheaply (attention() per call)
        left, right = window
        if type(left) is int and type(right) is int and -1 <= left <= WINDOW_SIDE_MAX \
                and -1 <= right <= WINDOW_SIDE_MAX:
            return window
    try:
        if isinstance(window, (str, bytes, set, frozenset, dict)) or len(window) != 2:
            raise TypeError  # a set has no order: {2, 0} would silently become (0, 2)
        sides = []
        for x in window:
            if isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool):
                raise TypeError
            sides.append(operator.index(x))
    except TypeError:
        raise ValueError(f"window: expected (left, right) integers, -1 for an unbounded side, got {window!r}") \
            from None
    left, right = sides
    if left < -1 or right < -1:
        raise ValueError(f"window: sides must be >= 0 or -1 (unbounded), got {(left, right)}")
    return min(left, WINDOW_SIDE_MAX), min(right, WINDOW_SIDE_MAX)


def canonical_mask(seqlen_q: int, seqlen_kv: int, kv_lens: bool, causal: bool, align: str,
                   window: Optional[Tuple[int, int]]) -> Tuple[bool, str, Optional[Tuple[int, int]]]:
    """The simplest ``(causal, align, window)`` with exactly the mask of the arguments (module docstring).

    Plain integer arithmetic (no pydantic): the dispatch hot path calls it for never-seen shapes.

    >>> canonical_mask(1, 4096, False, True, "bottom_right", None)        # one decode row sees every key
    (False, 'bottom_right', None)
    >>> canonical_mask(5, 4096, True, True, "bottom_right", (1023, 3))    # causal ∩ window = one window
    (False, 'bottom_right', (1023, 0))
    >>> canonical_mask(1, 4096, True, True, "bottom_right", (1023, 0))    # one row: the right side is moot
    (False, 'bottom_right', (1023, -1))
    >>> canonical_mask(1, 900, False, True, "bottom_right", (1023, -1))   # the window covers every key
    (False, 'bottom_right', None)
    >>> canonical_mask(4, 900, False, False, "bottom_right", (-1, 0))     # (-1, 0) is causal
    (True, 'bottom_right', None)
    >>> canonical_mask(7, 7, False, True, "top_left", None)               # Sq == Skv: alignments agree
    (True, 'bottom_right', None)
    """
    left = right = None
    if window is not None:
        left = None if window[0] < 0 else window[0]
        right = None if window[1] < 0 else window[1]
    if causal:
        right = 0 if right is None else min(right, 0)
    if seqlen_q == 0 or seqlen_kv == 0:
        left = right = None  # no rows or no keys: every mask gives the same (empty or all-zero) output
    else:
        off = seqlen_kv - seqlen_q if align == "bottom_right" else 0
        if left is not None and left >= seqlen_q - 1 + off:
            left = None
        if right is not None and right >= seqlen_kv - 1 - off:
            right = None
    if left is None and right is None:
        return False, "bottom_right", None
    if left is None and right == 0:
        causal, window = True, None
    else:
        causal, window = False, (-1 if left is None else left, -1 if right is None else right)
    if seqlen_q == seqlen_kv and not kv_lens:
        align = "bottom_right"
    return causal, align, window


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"dtype: unsupported {dtype}; expected one of {sorted(DTYPES)}") from None


#: :meth:`AttentionProblem.resized`'s pieces: a frozen model's attributes are set through object's setter
_new_object = object.__new__
_set_attr = object.__setattr__
_SHAPE_FIELDS = frozenset({"batch", "seqlen_q", "seqlen_kv"})


class AttentionProblem(BaseModel):
    """One attention call's signature (shapes, dtype, semantics) — hashable, frozen.

    ``window`` is ``(left, right)``; -1 on a side means unbounded on that side. ``None`` means no window.
    ``scale`` ``None`` means ``1/sqrt(head_dim)``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_kv: int
    head_dim: int
    head_dim_v: int
    dtype: str
    device_type: str = "cpu"
    causal: bool = False
    causal_align: Align = "bottom_right"
    window: Optional[Tuple[int, int]] = None
    kv_lens: bool = False
    mode: Mode = "fwd"
    approx: bool = False
    scale: Optional[float] = None
    #: None: K/V in ``dtype``; else their FP8 format (:data:`KV_DTYPES`), dequantised by float32 scales
    kv_dtype: Optional[str] = None
    #: float32 dots in TF32 (:func:`attntune.tolerances.tf32_active`: CUDA float32 with
    #: ``float32_matmul_precision`` below "highest"); False for every other problem
    tf32: bool = False

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in DTYPES:
            raise ValueError(f"dtype: unsupported {v!r}; expected one of {sorted(DTYPES)}")
        return v

    @field_validator("kv_dtype")
    @classmethod
    def _kv_dtype(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in KV_DTYPES:
            raise ValueError(f"kv_dtype: unsupported {v!r}; expected None or one of {sorted(KV_DTYPES)}")
        return v

    @field_validator("window")
    @classmethod
    def _window(cls, v):
        if v is None:
            return v
        left, right = v
        if left < -1 or right < -1:
            raise ValueError(f"window: sides must be >= 0 or -1 (unbounded), got {v}")
        return (int(left), int(right))

    @model_validator(mode="after")
    def _check(self) -> "AttentionProblem":
        for name in ("batch", "heads_q", "heads_kv", "head_dim", "head_dim_v"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("seqlen_q", "seqlen_kv"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"heads_kv: heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})"
            )
        if self.kv_dtype is not None and self.dtype not in FP8_Q_DTYPES:
            raise ValueError(f"kv_dtype: an FP8 K/V cache needs q in {list(FP8_Q_DTYPES)}, got {self.dtype}")
        if self.kv_dtype is not None and self.mode != "fwd":
            raise ValueError("kv_dtype: an FP8 K/V cache is for inference (mode 'fwd', no gradients)")
        if self.tf32 and (self.dtype != "float32" or self.device_type != "cuda"):
            raise ValueError(f"tf32: only a float32 problem on a CUDA device has TF32 dots, got {self.dtype} "
                             f"on {self.device_type}")
        return self

    # ---- derived -------------------------------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def group(self) -> int:
        """Query heads per kv head (1 = MHA)."""
        return self.heads_q // self.heads_kv

    @property
    def offset(self) -> int:
        """Column offset of query row 0 on the key axis (see module docstring). With ``kv_lens`` and
        bottom-right alignment the actual offset is per sequence, ``kv_lens[b] - Sq``; this property
        (shape-only) then describes a sequence of full length ``Skv``."""
        return self.seqlen_kv - self.seqlen_q if self.causal_align == "bottom_right" else 0

    @property
    def window_bounds(self) -> Tuple[Optional[int], Optional[int]]:
        """Effective (left, right) reach in keys, combining causal and window; None = unbounded."""
        left = right = None
        if self.window is not None:
            left = None if self.window[0] < 0 else self.window[0]
            right = None if self.window[1] < 0 else self.window[1]
        if self.causal:
            right = 0 if right is None else min(right, 0)
        return left, right

    @property
    def is_local(self) -> bool:
        """True when a finite left window makes the cost grow with S*W rather than S^2."""
        return self.window_bounds[0] is not None

    def canonical(self) -> "AttentionProblem":
        """The equivalent problem in canonical form (module docstring); ``self`` when already canonical.
        Idempotent; the mask, and so every output, is exactly the same."""
        c, a, w = canonical_mask(self.seqlen_q, self.seqlen_kv, self.kv_lens, self.causal, self.causal_align,
                                 self.window)
        if c == self.causal and a == self.causal_align and w == self.window:
            return self
        return self.model_copy(update={"causal": c, "causal_align": a, "window": w})

    def resized(self, batch: int, seqlen_q: int, seqlen_kv: int) -> "AttentionProblem":
        """This problem with another batch and lengths, unvalidated: for the runtime's family reuse, where
        the caller has checked that the new shape keeps the canonical mask (its family signature holds the
        canonical mask of the exact shape). ``model_copy(update=...)`` does the same in 6 µs; this is the
        copy a new KV length of a decode loop pays, so it is done directly (1 µs)."""
        new = _new_object(type(self))
        d = self.__dict__.copy()
        d["batch"], d["seqlen_q"], d["seqlen_kv"] = batch, seqlen_q, seqlen_kv
        _set_attr(new, "__dict__", d)
        _set_attr(new, "__pydantic_extra__", None)
        fields = self.__pydantic_fields_set__
        # shared with the original when it already names the shape (it does after one resize): one
        # object fewer per new shape for the garbage collector
        _set_attr(new, "__pydantic_fields_set__",
                  fields if _SHAPE_FIELDS <= fields else fields | _SHAPE_FIELDS)
        _set_attr(new, "__pydantic_private__", None)
        return new

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    def timed_kv_lens(self) -> Optional[Tuple[int, ...]]:
        """The ``[B]`` valid lengths every timed call of a ``kv_lens`` problem uses (None without
        ``kv_lens``): sequence ``b`` holds ``Skv - (b * Skv) // (2 B)`` keys — the first the full length (the
        KV capacity, which sets a split-K launch's grid), the rest spread evenly down to just above half of it,
        as a serving batch's sequences are; B = 1: the full length. The tuner times at these
        (``autotune.gate.timing_kv_lens``), so :meth:`flops` and :meth:`bytes_moved` count them.

        >>> AttentionProblem(batch=4, heads_q=1, heads_kv=1, seqlen_q=1, seqlen_kv=100, head_dim=8, head_dim_v=8,
        ...                  dtype="float32", kv_lens=True).timed_kv_lens()
        (100, 88, 75, 63)
        """
        if not self.kv_lens:
            return None
        b, skv = self.batch, max(self.seqlen_kv, 1)
        return tuple(max(skv - (i * skv) // (2 * b), 1) for i in range(b))

    def _admitted(self, seqlen_kv: int) -> Tuple[int, int]:
        """For one sequence of ``seqlen_kv`` keys (its own length: with ``kv_lens`` the bottom-right diagonal
        sits at it): the (query, key) pairs the mask admits, and the keys at least one query attends. Each
        row's admitted keys are one interval, and consecutive rows' intervals move by at most one key, so
        the keys attended are the span from the first non-empty row's start to the last one's end."""
        off = seqlen_kv - self.seqlen_q if self.causal_align == "bottom_right" else 0
        i = torch.arange(self.seqlen_q, dtype=torch.int64) + off
        lo = torch.zeros_like(i)
        hi = torch.full_like(i, seqlen_kv - 1)
        left, right = self.window_bounds
        if left is not None:
            lo = torch.clamp(i - left, min=0)
        if right is not None:
            hi = torch.clamp(i + right, max=seqlen_kv - 1)
        n = (hi - lo + 1).clamp(min=0)
        rows = n > 0
        keys = int(hi[rows].max() - lo[rows].min() + 1) if bool(rows.any()) else 0
        return int(n.sum()), keys

    def attended_pairs(self) -> int:
        """Number of (query, key) pairs the mask admits, per batch element and head (kv_lens ignored)."""
        return self._admitted(self.seqlen_kv)[0]

    def _per_sequence(self, what: int) -> int:
        """The sum over the batch of :meth:`_admitted`'s ``what`` (0: pairs, 1: keys), at the timed lengths
        of a ``kv_lens`` problem and at ``Skv`` otherwise."""
        lens = self.timed_kv_lens()
        if lens is None:
            return self.batch * self._admitted(self.seqlen_kv)[what]
        return sum(self._admitted(n)[what] for n in lens)

    def flops(self) -> float:
        """FLOPs: 4*D per admitted (q, k) pair (QK^T and PV) times Hq, summed over the batch — so causal is
        about half of 4*B*H*Sq*Skv*D; a ``kv_lens`` problem counts the keys its timed lengths hold
        (:meth:`timed_kv_lens`); forward+backward counts 3.5x the forward (as the baselines do)."""
        d = (self.head_dim + self.head_dim_v) / 2
        f = 4.0 * self.heads_q * self._per_sequence(0) * d
        return f * (3.5 if self.mode == "fwd_bwd" else 1.0)

    def bytes_moved(self) -> float:
        """Fewest bytes a forward must move: Q read and O written once, and the K/V rows some query attends
        read once — a window's span, not the whole cache, and for a ``kv_lens`` problem the keys of its
        timed lengths (:meth:`timed_kv_lens`) — K/V at their FP8 size where ``kv_dtype`` is set. (Counting
        every key of the cache made a windowed FP8 decode key read 7.2 TB/s on a 3.35 TB/s H100.)"""
        es = self.torch_dtype.itemsize
        kes = es if self.kv_dtype is None else KV_DTYPES[self.kv_dtype].itemsize
        q = self.batch * self.heads_q * self.seqlen_q * self.head_dim
        o = self.batch * self.heads_q * self.seqlen_q * self.head_dim_v
        kv = self.heads_kv * self._per_sequence(1) * (self.head_dim + self.head_dim_v)
        return float((q + o) * es + kv * kes)

    def rates(self, ms: float) -> Tuple[float, float]:
        """``(TFLOP/s, TB/s)`` of a forward (or forward+backward) measured at ``ms`` milliseconds: :meth:`flops`
        and :meth:`bytes_moved` over the time — the figures a cache row stores beside its median."""
        s = ms * 1e-3
        return self.flops() / s / 1e12, self.bytes_moved() / s / 1e12

    def short(self) -> str:
        s = (f"B{self.batch} H{self.heads_q}/{self.heads_kv} S{self.seqlen_q}x{self.seqlen_kv} "
             f"D{self.head_dim} {self.dtype}")
        if self.causal:
            s += " causal" + ("" if self.causal_align == "bottom_right" else "(top-left)")
        if self.window is not None:
            s += f" win{self.window}"
        if self.kv_lens:
            s += " kv_lens"
        if self.kv_dtype is not None:
            s += f" kv:{self.kv_dtype.removeprefix('float8_')}"
        if self.tf32:
            s += " tf32"
        return s + f" {self.mode}"


def validate_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 kv_lens: Optional[torch.Tensor] = None, fp8: bool = False) -> None:
    """Raise ``ValueError`` naming the offending argument when q/k/v/kv_lens do not fit together.
    ``fp8``: k and v are FP8 codes (:data:`KV_DTYPES`, one format for both) of a float16/bfloat16 q."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.is_nested:  # ragged lengths: no one [B, H, S, D] shape to plan for (torch's SDPA takes them)
            raise ValueError(f"{name}: nested tensors are not supported; pad to [B, H, S, D] (kv_lens gives "
                             "each sequence's key length) or call torch's scaled_dot_product_attention")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor [B, H, S, D], got shape {tuple(t.shape)}")
    if fp8:
        if k.dtype not in KV_DTYPE_NAMES or v.dtype != k.dtype:
            raise ValueError(f"k/v: with k_scale/v_scale, k and v must be one FP8 format "
                             f"({sorted(KV_DTYPES)}), got k {k.dtype}, v {v.dtype}")
        if DTYPE_NAMES.get(q.dtype) not in FP8_Q_DTYPES:
            raise ValueError(f"q: an FP8 K/V cache needs q in {list(FP8_Q_DTYPES)}, got {q.dtype}")
    elif k.dtype in KV_DTYPE_NAMES or v.dtype in KV_DTYPE_NAMES:
        raise ValueError(f"k/v: FP8 codes ({k.dtype}, {v.dtype}) need their float32 k_scale and v_scale")
    elif q.dtype not in DTYPE_NAMES:  # named before the k/v match: an int q is q's fault, not k's
        raise ValueError(f"q: unsupported dtype {q.dtype}; expected one of {sorted(DTYPES)}")
    elif k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"k/v: dtype must match q ({q.dtype}), got k {k.dtype}, v {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"k/v: device must match q ({q.device}), got k {k.device}, v {v.device}")
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        raise ValueError(f"k/v: batch must match q ({q.shape[0]}), got k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"k: head_dim {k.shape[3]} must match q's head_dim {q.shape[3]}")
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"v: heads {v.shape[1]} must match k's heads {k.shape[1]}")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"v: seqlen {v.shape[2]} must match k's seqlen {k.shape[2]}")
    if (k.shape[1] == 0 and q.shape[1] != 0) or (k.shape[1] and q.shape[1] % k.shape[1]):  # 0/0 heads: empty
        raise ValueError(f"k: heads_q ({q.shape[1]}) must be a multiple of heads_kv ({k.shape[1]})")
    if kv_lens is not None:
        if not isinstance(kv_lens, torch.Tensor) or kv_lens.dim() != 1 or kv_lens.shape[0] != q.shape[0]:
            raise ValueError(f"kv_lens: expected a 1-D integer tensor of length batch={q.shape[0]}")
        if kv_lens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"kv_lens: expected int32 or int64, got {kv_lens.dtype}")
        if kv_lens.device != q.device:
            raise ValueError(f"kv_lens: device must match q ({q.device}), got {kv_lens.device}")


def problem_from_tensors(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    causal_align: Align = "bottom_right",
    window: Optional[Tuple[int, int]] = None,
    kv_lens: Optional[torch.Tensor] = None,
    mode: Optional[Mode] = None,
    approx: bool = False,
    scale: Optional[float] = None,
    validate: bool = True,
) -> AttentionProblem:
    """Build the *canonical* problem of a call in O(1) (shapes only; no data is read): the mask
    arguments are reduced by :func:`canonical_mask` before the model is built (once). K/V in an FP8
    format (:data:`KV_DTYPES`) set ``kv_dtype``.

    ``mode`` defaults to ``fwd_bwd`` when grad is enabled and any input requires grad.
    """
    kv_dtype = KV_DTYPE_NAMES.get(k.dtype) if isinstance(k, torch.Tensor) else None
    if validate:
        validate_qkv(q, k, v, kv_lens, fp8=kv_dtype is not None)
    if mode is None:
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        mode = "fwd_bwd" if needs_grad else "fwd"
    window = validate_window(window)  # canonical_mask reads -1 as unbounded: refuse the rest here
    causal, causal_align, window = canonical_mask(q.shape[2], k.shape[2], kv_lens is not None, bool(causal),
                                                  causal_align, window)
    return AttentionProblem(
        batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2],
        seqlen_kv=k.shape[2], head_dim=q.shape[3], head_dim_v=v.shape[3], dtype=dtype_name(q.dtype),
        device_type=q.device.type, causal=causal, causal_align=causal_align, window=window,
        kv_lens=kv_lens is not None, mode=mode, approx=bool(approx), scale=scale, kv_dtype=kv_dtype,
        tf32=tf32_active(dtype_name(q.dtype), q.device.type),
    )
