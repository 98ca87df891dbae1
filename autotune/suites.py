"""Named suites: lists of problem templates the tuner measures.

A template is an :class:`~attntune.problem.AttentionProblem` whose ``dtype`` and ``device_type`` are
placeholders (``float32`` / ``cpu``): :func:`materialize` fills in the device the tuner runs on and the
dtype (``--dtype``; by default float32 on the CPU, bfloat16 on a GPU), and optionally overrides the
mode (``--mode``). Two kinds of template pin their dtype when ``--dtype`` is not given: an FP8 K/V cache
(``kv_dtype``; q in bfloat16) and a *TF32 template* (``tf32=True``, written on ``cuda``: float32 with
TF32 dots on an NVIDIA GPU, exact float32 elsewhere, ROCm included). Shapes follow the tensor layout of
:mod:`attntune.problem`: q ``[B, Hq, Sq, D]``, k/v ``[B, Hkv, Skv, D]``.

Sizes are chosen on bucket values of :func:`attntune.key.bucket`, so a suite problem *is* the
representative of its key and the tuner measures exactly what is listed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from attntune.problem import AttentionProblem
from attntune.tolerances import tf32_supported


def _p(
    b: int,
    hq: int,
    hkv: int,
    sq: int,
    skv: int,
    d: int,
    *,
    causal: bool = False,
    window=None,
    kv_lens: bool = False,
    mode: str = "fwd",
    kv_dtype=None,
    tf32: bool = False,
) -> AttentionProblem:
    """A template (placeholder dtype/device; see module docstring), in canonical form (the runtime keys
    calls by their canonical problem: causal + window ``(W, 0)`` is the window ``(W, 0)``). ``tf32``: a
    float32 template with TF32 dots (written on ``cuda``, the only device where the flag is valid)."""
    return AttentionProblem(
        batch=b,
        heads_q=hq,
        heads_kv=hkv,
        seqlen_q=sq,
        seqlen_kv=skv,
        head_dim=d,
        head_dim_v=d,
        dtype="float32" if kv_dtype is None else "bfloat16",  # an FP8 K/V cache takes a 16-bit q
        device_type="cuda" if tf32 else "cpu",
        causal=causal,
        window=window,
        kv_lens=kv_lens,
        mode=mode,
        kv_dtype=kv_dtype,
        tf32=tf32,
    ).canonical()


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    build: Callable[[], List[AttentionProblem]]

    def templates(self) -> List[AttentionProblem]:
        return self.build()


def _demo() -> List[AttentionProblem]:
    # CPU-friendly: every key tunes the CPU SDPA backends + eager in a few seconds on two cores.
    out = []
    for s in (128, 256, 512):
        for causal in (False, True):
            out.append(_p(2, 4, 4, s, s, 64, causal=causal))
    out.append(_p(2, 8, 2, 256, 256, 64, causal=True))  # GQA 8/2
    out.append(_p(4, 8, 2, 1, 512, 64, kv_lens=True))  # decode-like: q_len 1, KV cache
    return out


def _default() -> List[AttentionProblem]:
    # The H200 mix (bf16 by default): prefill, chunked prefill, decode, sliding window, and three float32
    # keys with TF32 dots. 37 keys, sized so that the whole suite tunes in minutes with --trials 24.
    out = [
        # prefill, head_dim 64
        _p(32, 16, 16, 512, 512, 64, causal=True),
        _p(32, 16, 16, 512, 512, 64),
        _p(16, 16, 16, 2048, 2048, 64, causal=True),
        _p(16, 16, 16, 2048, 2048, 64),
        _p(4, 16, 16, 8192, 8192, 64, causal=True),
        # prefill, head_dim 128 (GQA 32/8 as Llama-3-8B, and MHA)
        _p(4, 32, 8, 1024, 1024, 128, causal=True),
        _p(4, 32, 8, 2048, 2048, 128, causal=True),
        _p(4, 32, 8, 2048, 2048, 128),
        _p(2, 32, 8, 4096, 4096, 128, causal=True),
        _p(1, 32, 8, 8192, 8192, 128, causal=True),
        _p(1, 32, 8, 8192, 8192, 128),
        _p(8, 32, 32, 2048, 2048, 128, causal=True),
        # odd head dims
        _p(4, 16, 16, 4096, 4096, 80),
        _p(4, 16, 16, 4096, 4096, 96, causal=True),
        _p(4, 16, 16, 4096, 4096, 256),
        # chunked prefill: 512 new queries against a 4096 cache, bottom-right causal
        _p(1, 32, 8, 512, 4096, 128, causal=True),
        # decode: q_len 1 over a KV cache with per-sequence lengths
        _p(1, 32, 8, 1, 4096, 128, kv_lens=True),
        _p(1, 32, 8, 1, 32768, 128, kv_lens=True),
        _p(8, 32, 8, 1, 8192, 128, kv_lens=True),
        _p(16, 32, 8, 1, 2048, 128, kv_lens=True),
        _p(32, 32, 8, 1, 8192, 128, kv_lens=True),
        _p(64, 32, 8, 1, 4096, 128, kv_lens=True),
        _p(16, 32, 32, 1, 2048, 128, kv_lens=True),
        _p(8, 32, 8, 1, 4096, 64, kv_lens=True),
        # decode as Hugging Face generate makes it (head_dim 64, GQA 32/8): a dynamic cache's step is
        # unmasked (one row sees every key), a static cache's carries kv_lens, a sliding layer a window
        _p(1, 32, 8, 1, 4096, 64),
        _p(8, 32, 8, 1, 1024, 64),
        _p(32, 32, 8, 1, 4096, 64),
        _p(8, 32, 8, 1, 6144, 64, kv_lens=True),
        _p(2, 32, 8, 1, 16384, 128, window=(1024, -1), kv_lens=True),
        # sliding window (causal, left window W)
        _p(4, 16, 16, 8192, 8192, 64, causal=True, window=(512, 0)),
        _p(2, 32, 8, 4096, 4096, 128, causal=True, window=(1024, 0)),
        _p(1, 32, 8, 16384, 16384, 128, causal=True, window=(1024, 0)),
        _p(1, 32, 8, 8192, 8192, 128, causal=True, window=(4096, 0)),
        # a Mistral-style prefill as HF generate makes it (D64, GQA 32/8; sliding_window 1024 is window
        # (1023, 0), whose key bucket this is): bench_generate's SWA cases ran it on the heuristic's default
        # config (no tuned key of its family)
        _p(8, 32, 8, 4096, 4096, 64, causal=True, window=(1024, 0)),
        # float32 with TF32 dots (torch's float32_matmul_precision "high"; a separate key from exact
        # float32): the Triton forward runs it 4.1-4.7x faster than SDPA's float32 (probe_tf32_h200.json)
        _p(4, 16, 16, 4096, 4096, 128, tf32=True),
        _p(4, 16, 16, 4096, 4096, 128, causal=True, tf32=True),
        _p(8, 16, 16, 2048, 2048, 64, causal=True, mode="fwd_bwd", tf32=True),
    ]
    return out


def _decode() -> List[AttentionProblem]:
    out = []
    for b, skv in (
        (1, 1024),
        (1, 8192),
        (1, 32768),
        (1, 131072),
        (4, 8192),
        (8, 32768),
        (16, 2048),
        (32, 8192),
        (64, 4096),
        (128, 2048),
    ):
        out.append(_p(b, 32, 8, 1, skv, 128, kv_lens=True))
    for b, skv in ((1, 8192), (16, 2048)):  # MHA decode
        out.append(_p(b, 32, 32, 1, skv, 128, kv_lens=True))
    out.append(_p(8, 64, 8, 1, 8192, 128, kv_lens=True))  # 70B-style GQA 64/8
    out.append(_p(8, 16, 16, 1, 4096, 64, kv_lens=True))
    out.append(_p(8, 32, 8, 4, 8192, 128, causal=True, kv_lens=True))  # speculative decoding: 4 queries
    return out


def _long() -> List[AttentionProblem]:
    out = []
    for s in (16384, 24576, 32768):
        out.append(_p(1, 32, 8, s, s, 128, causal=True))
    out.append(_p(1, 32, 8, 32768, 32768, 128))
    out.append(_p(1, 32, 32, 32768, 32768, 128, causal=True))
    out.append(_p(1, 16, 16, 16384, 16384, 64, causal=True))
    out.append(_p(1, 32, 8, 32768, 32768, 128, causal=True, window=(4096, 0)))
    out.append(_p(1, 32, 8, 16384, 16384, 128, causal=True, window=(1024, 0)))
    out.append(_p(1, 32, 8, 4096, 32768, 128, causal=True))  # chunked prefill at long context
    return out


def _training() -> List[AttentionProblem]:
    m = "fwd_bwd"
    return [
        _p(16, 16, 16, 2048, 2048, 64, causal=True, mode=m),
        _p(8, 16, 16, 4096, 4096, 64, causal=True, mode=m),
        _p(4, 16, 16, 8192, 8192, 64, causal=True, mode=m),
        _p(4, 32, 8, 4096, 4096, 128, causal=True, mode=m),
        _p(4, 32, 32, 8192, 8192, 128, causal=True, mode=m),
        _p(4, 32, 32, 8192, 8192, 128, mode=m),
        _p(8, 16, 16, 4096, 4096, 64, mode=m),
        _p(2, 32, 8, 8192, 8192, 128, causal=True, window=(1024, 0), mode=m),
        _p(8, 16, 16, 4096, 4096, 96, causal=True, mode=m),
    ]


def _fp8() -> List[AttentionProblem]:
    """FP8 (e4m3) KV caches: decode at the serving shapes of ``_decode`` whose K+V reach the sizes where the
    bytes set the pace, plus one small batch (launch-bound); two prefill keys (dense causal, chunked)."""
    f8 = "float8_e4m3fn"
    return [
        _p(1, 32, 8, 1, 8192, 128, kv_lens=True, kv_dtype=f8),
        _p(8, 32, 8, 1, 8192, 128, kv_lens=True, kv_dtype=f8),
        _p(32, 32, 8, 1, 8192, 128, kv_lens=True, kv_dtype=f8),
        _p(16, 32, 8, 1, 32768, 128, kv_lens=True, kv_dtype=f8),
        _p(64, 32, 8, 1, 4096, 64, kv_lens=True, kv_dtype=f8),
        _p(8, 32, 8, 1, 16384, 128, kv_lens=True, window=(4096, -1), kv_dtype=f8),
        # prefill over an FP8 cache (FP8StaticCache's first step; chunked prefill): the FP8 forward's keys
        _p(1, 32, 8, 4096, 4096, 128, causal=True, kv_dtype=f8),
        _p(1, 32, 8, 512, 4096, 128, causal=True, kv_dtype=f8),
    ]


def _seed() -> List[AttentionProblem]:
    # The baseline shapes (baselines/h200-*.md): seq2048·b16, seq4096·b8, seq8192·b4 at H16 D64.
    out = []
    for mode in ("fwd", "fwd_bwd"):
        for b, s in ((16, 2048), (8, 4096), (4, 8192)):
            for causal in (False, True):
                out.append(_p(b, 16, 16, s, s, 64, causal=causal, mode=mode))
    return out


SUITES: Dict[str, Suite] = {
    s.name: s
    for s in (
        Suite(
            "demo",
            "CPU-friendly: small fp32 problems (S 128-512, D64, causal and not, GQA, one decode)",
            _demo,
        ),
        Suite(
            "default",
            "GPU mix: prefill D64/80/96/128/256, chunked prefill, decode B1-64, sliding window, float32 (TF32)",
            _default,
        ),
        Suite(
            "decode", "q_len 1 (and 4) over KV caches of 1k-128k with per-sequence lengths, B1-128", _decode
        ),
        Suite("long", "long context: S 16k-32k, causal, GQA, windows, chunked prefill", _long),
        Suite("training", "forward+backward prefill shapes (mode fwd_bwd)", _training),
        Suite("fp8", "FP8 (e4m3) KV caches: decode B1-64, KV 4k-32k, kv_lens; prefill S4096 and chunked (GPU)", _fp8),
        Suite(
            "seed", "baseline shapes seq2048·b16, seq4096·b8, seq8192·b4 (H16 D64), fwd and fwd_bwd", _seed
        ),
    )
}


def get_suite(name: str) -> Suite:
    try:
        return SUITES[name]
    except KeyError:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(SUITES)}") from None


def default_dtype(device_type: str) -> str:
    """float32 on the CPU (no fast bf16 there), bfloat16 on GPUs."""
    return "float32" if device_type == "cpu" else "bfloat16"


def materialize(
    templates: Sequence[AttentionProblem],
    device_type: str,
    dtype: Optional[str] = None,
    mode: Optional[str] = None,
) -> List[AttentionProblem]:
    """Concrete problems for ``device_type``: ``dtype`` (default :func:`default_dtype`) and ``mode``
    (default: each template's own) replace the template's. Re-validated; duplicates dropped."""
    dt = dtype or default_dtype(device_type)
    out: List[AttentionProblem] = []
    seen = set()
    for t in templates:
        fields = t.model_dump()
        if t.tf32 and dtype is None:
            # a TF32 template keeps float32; TF32 dots exist on NVIDIA GPUs only (elsewhere, ROCm included,
            # exact float32: the key a float32 call there looks up)
            fields.update(dtype="float32", device_type=device_type, tf32=tf32_supported(device_type))
        else:
            # an FP8 K/V template needs a 16-bit q: float32 (the CPU's default) becomes bfloat16 there
            fields.update(dtype="bfloat16" if t.kv_dtype is not None and dt == "float32" and dtype is None else dt,
                          device_type=device_type, tf32=False)
        if mode is not None:
            fields["mode"] = mode
        p = AttentionProblem(**fields)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
