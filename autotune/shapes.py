"""``--shape`` specs: one problem written as ``field=value`` pairs separated by commas.

Fields (aliases in brackets; all but ``hq``, ``sq`` and ``d`` optional)::

    b [batch]      batch size                                   default 1
    hq [h]         query heads
    hkv            key/value heads (GQA/MQA: divides hq)          default hq
    sq [s]         query length
    skv            key/value length                              default sq
    d              head dim of q and k
    dv             head dim of v                                 default d
    causal         0/1 (true/false)                              default 0
    align          br (bottom-right, FlashAttention) | tl (top-left, SDPA is_causal)   default br
    window         LEFT:RIGHT, -1 = unbounded side, e.g. 256:0   default none
    kv_lens        0/1: per-sequence KV lengths (decode)         default 0
    dtype          float32 | float16 | bfloat16 | float64        default --dtype / device default
    mode           fwd | fwd_bwd                                 default --mode / fwd
    approx         0/1: approximate variants allowed             default 0
    kv             FP8 K/V codes: e4m3fn | e5m2 | e4m3fnuz (float8_ prefix optional)   default none
    tf32           0/1: float32 on CUDA with TF32 dots (the tuner measures the key under
                   float32_matmul_precision "high"; 0 = "highest", exact float32)   default 0

Example: ``b=4,hq=32,hkv=8,sq=2048,skv=2048,d=128,causal=1,window=256:0,kv_lens=1,dtype=bfloat16``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from pydantic import ValidationError

from attntune.problem import DTYPES, SIZE_MAX, AttentionProblem
from attntune.tolerances import tf32_supported


class ShapeSpecError(ValueError):
    """A ``--shape`` spec that cannot be parsed; the message names the offending field."""


def _int(field: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ShapeSpecError(f"field {field}: expected an integer, got {raw!r}") from None


#: the largest size a field takes (the keys' bound): a size past int64 crashed deep in torch (``randn``:
#: "Overflow when unpacking long long") instead of naming the field
MAX_SIZE = SIZE_MAX


def _pos(field: str, raw: str) -> int:
    """A size or length: 1 .. MAX_SIZE (``sq=0`` was tuned and stored as an "S0x0" key, a call that never needs
    a plan: attention() returns empty results for it without one)."""
    val = _int(field, raw)
    if not 1 <= val <= MAX_SIZE:
        raise ShapeSpecError(f"field {field}: expected an integer from 1 to {MAX_SIZE}, got {raw!r}")
    return val


def _bool(field: str, raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "y", "on"):
        return True
    if low in ("0", "false", "no", "n", "off"):
        return False
    raise ShapeSpecError(f"field {field}: expected 0/1 (or true/false), got {raw!r}")


def _window(field: str, raw: str):
    if raw.lower() in ("none", ""):
        return None
    parts = raw.split(":")
    if len(parts) != 2:
        raise ShapeSpecError(f"field {field}: expected LEFT:RIGHT (e.g. 256:0, -1 = unbounded), got {raw!r}")
    left, right = (_int(field, x) for x in parts)
    if left < -1 or right < -1 or max(left, right) > MAX_SIZE:
        raise ShapeSpecError(f"field {field}: sides must be 0 to {MAX_SIZE} or -1 (unbounded), got {raw!r}")
    return (left, right)


def _align(field: str, raw: str) -> str:
    m = {"br": "bottom_right", "bottom_right": "bottom_right", "tl": "top_left", "top_left": "top_left"}
    if raw.lower() not in m:
        raise ShapeSpecError(f"field {field}: expected br or tl, got {raw!r}")
    return m[raw.lower()]


def _dtype(field: str, raw: str) -> str:
    if raw not in DTYPES:
        raise ShapeSpecError(f"field {field}: expected one of {sorted(DTYPES)}, got {raw!r}")
    return raw


def _kv(field: str, raw: str) -> str:
    from attntune.problem import KV_DTYPES

    name = raw if raw.startswith("float8_") else "float8_" + raw
    if name not in KV_DTYPES:
        raise ShapeSpecError(f"field {field}: expected one of {[n.removeprefix('float8_') for n in KV_DTYPES]}, "
                             f"got {raw!r}")
    return name


def _mode(field: str, raw: str) -> str:
    if raw not in ("fwd", "fwd_bwd"):
        raise ShapeSpecError(f"field {field}: expected fwd or fwd_bwd, got {raw!r}")
    return raw


# spec field -> (AttentionProblem field, parser)
_FIELDS: Dict[str, tuple] = {
    "b": ("batch", _pos),
    "hq": ("heads_q", _pos),
    "hkv": ("heads_kv", _pos),
    "sq": ("seqlen_q", _pos),
    "skv": ("seqlen_kv", _pos),
    "d": ("head_dim", _pos),
    "dv": ("head_dim_v", _pos),
    "causal": ("causal", _bool),
    "align": ("causal_align", _align),
    "window": ("window", _window),
    "kv_lens": ("kv_lens", _bool),
    "dtype": ("dtype", _dtype),
    "mode": ("mode", _mode),
    "approx": ("approx", _bool),
    "kv": ("kv_dtype", _kv),
    "tf32": ("tf32", _bool),
}
_ALIASES = {"batch": "b", "h": "hq", "s": "sq"}
_BACK = {v[0]: k for k, v in _FIELDS.items()}  # problem field -> spec field, for error messages


def parse_shape(spec: str, *, device_type: str, dtype: str, mode: Optional[str] = None) -> AttentionProblem:
    """Parse ``spec`` into a problem on ``device_type``. ``dtype``/``mode`` apply unless the spec sets
    them. Raises :class:`ShapeSpecError` naming the bad field."""
    values: Dict[str, Any] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ShapeSpecError(f"{part!r}: expected field=value")
        name, raw = (x.strip() for x in part.split("=", 1))
        name = _ALIASES.get(name.lower(), name.lower())
        if name not in _FIELDS:
            raise ShapeSpecError(f"unknown field {name!r} (known: {', '.join(_FIELDS)})")
        target, parse = _FIELDS[name]
        if target in values:
            raise ShapeSpecError(f"field {name}: given twice")
        values[target] = parse(name, raw)
    for required in ("heads_q", "seqlen_q", "head_dim"):
        if required not in values:
            raise ShapeSpecError(f"field {_BACK[required]}: missing (required: hq, sq, d)")
    values.setdefault("batch", 1)
    values.setdefault("heads_kv", values["heads_q"])
    values.setdefault("seqlen_kv", values["seqlen_q"])
    values.setdefault("head_dim_v", values["head_dim"])
    values.setdefault("dtype", dtype)
    if values.get("tf32") and device_type == "cuda" and not tf32_supported(device_type):
        raise ShapeSpecError("field tf32: this GPU's kernels keep IEEE float32 dots (ROCm): no TF32 key")
    if mode is not None:
        values.setdefault("mode", mode)
    try:
        return AttentionProblem(device_type=device_type, **values)
    except ValidationError as e:
        err = e.errors()[0]
        loc = str(err["loc"][0]) if err.get("loc") else ""
        msg = str(err.get("msg", e)).removeprefix("Value error, ")
        # The problem's own messages start with its field name; say the spec's name for it instead.
        for pf, sf in _BACK.items():
            if msg.startswith(pf + ":"):
                msg = f"field {sf}:" + msg[len(pf) + 1 :]
                break
        else:
            if loc in _BACK:
                msg = f"field {_BACK[loc]}: {msg}"
        raise ShapeSpecError(msg) from None
