"""Canonical problems: every reduction keeps the mask — and so the reference output — exactly, and
canonicalisation is idempotent. Random problems with odd lengths, kv_lens, windows and both alignments."""

from __future__ import annotations

import random

import pytest
import torch

from attntune.kernels.masks import build_mask
from attntune.kernels.reference import reference_attention
from attntune.problem import AttentionProblem, canonical_mask, problem_from_tensors

LENGTHS = (0, 1, 2, 3, 5, 15, 16, 17, 33)
SIDES = (-1, 0, 1, 2, 3, 7, 16, 40, 10**6)


def _random_problem(rng: random.Random) -> AttentionProblem:
    window = None
    if rng.random() < 0.7:
        window = (rng.choice(SIDES), rng.choice(SIDES))
    return AttentionProblem(
        batch=rng.choice((1, 3)), heads_q=2, heads_kv=rng.choice((1, 2)), seqlen_q=rng.choice(LENGTHS),
        seqlen_kv=rng.choice(LENGTHS), head_dim=8, head_dim_v=8, dtype="float64", causal=rng.random() < 0.5,
        causal_align=rng.choice(("bottom_right", "top_left")), window=window, kv_lens=rng.random() < 0.4)


def _dense_mask(p: AttentionProblem, lens) -> torch.Tensor:
    """The problem's mask as [B, 1, Sq, Skv] booleans (None = every pair admitted)."""
    m = build_mask(p, "cpu", lens if p.kv_lens else None)
    full = torch.ones(p.batch, 1, p.seqlen_q, p.seqlen_kv, dtype=torch.bool)
    return full if m is None else (full & m)


def _lens(p: AttentionProblem, rng: random.Random) -> torch.Tensor:
    # values at the edges (0, Skv) and beyond them (clamped to [0, Skv] by definition)
    return torch.tensor([rng.choice((0, 1, p.seqlen_kv, rng.randint(0, p.seqlen_kv), p.seqlen_kv + 5))
                         for _ in range(p.batch)], dtype=torch.int64)


def test_canonical_keeps_the_mask_exactly_and_is_idempotent():
    rng = random.Random(0)
    changed = 0
    for _ in range(3000):
        p = _random_problem(rng)
        c = p.canonical()
        assert c.canonical() is c, f"not idempotent: {p} -> {c} -> {c.canonical()}"
        lens = _lens(p, rng)
        assert torch.equal(_dense_mask(p, lens), _dense_mask(c, lens)), f"{p} -> {c} changes the mask"
        changed += c is not p
    assert changed > 1000  # the generator does exercise the reductions


def test_canonical_reference_output_is_bitwise_equal():
    rng = random.Random(1)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        p = _random_problem(rng)
        c = p.canonical()
        if c is p:
            continue
        q = torch.randn(p.batch, p.heads_q, p.seqlen_q, p.head_dim, generator=g, dtype=torch.float64)
        k = torch.randn(p.batch, p.heads_kv, p.seqlen_kv, p.head_dim, generator=g, dtype=torch.float64)
        v = torch.randn(p.batch, p.heads_kv, p.seqlen_kv, p.head_dim, generator=g, dtype=torch.float64)
        lens = _lens(p, rng) if p.kv_lens else None
        assert torch.equal(reference_attention(q, k, v, p, lens), reference_attention(q, k, v, c, lens)), (p, c)


@pytest.mark.parametrize("args, want", [
    # one decode row, bottom-right: causal admits every key -> no mask (with or without kv_lens)
    ((1, 4096, False, True, "bottom_right", None), (False, "bottom_right", None)),
    ((1, 4096, True, True, "bottom_right", None), (False, "bottom_right", None)),
    # ... but top-left causal with one row sees key 0 only
    ((1, 4096, False, True, "top_left", None), (True, "top_left", None)),
    # causal ∩ window is one window; a window wider than the keys is no window
    ((8, 8, False, True, "bottom_right", (3, 5)), (False, "bottom_right", (3, 0))),
    ((8, 8, False, True, "bottom_right", (7, -1)), (True, "bottom_right", None)),
    ((8, 8, False, False, "bottom_right", (7, 7)), (False, "bottom_right", None)),
    ((8, 8, False, False, "bottom_right", (6, 7)), (False, "bottom_right", (6, -1))),
    # Sq == Skv: top-left is bottom-right, unless kv_lens moves the per-sequence diagonal
    ((8, 8, False, True, "top_left", None), (True, "bottom_right", None)),
    ((8, 8, True, True, "top_left", None), (True, "top_left", None)),
    # nothing to mask without rows or keys
    ((0, 9, True, True, "top_left", (1, 1)), (False, "bottom_right", None)),
    ((4, 0, False, True, "bottom_right", None), (False, "bottom_right", None)),
])
def test_canonical_cases(args, want):
    assert canonical_mask(*args) == want


def test_calls_build_canonical_problems():
    q = torch.randn(2, 4, 1, 8)
    k = torch.randn(2, 2, 37, 8)
    p = problem_from_tensors(q, k, k, causal=True, window=(1023, 0))
    assert (p.causal, p.window) == (False, None)  # a 1024-wide window over 37 keys, one row
    p = problem_from_tensors(q, k, k, causal=True, window=(5, 0))
    assert (p.causal, p.window) == (False, (5, -1))
    with pytest.raises(ValueError, match="window"):
        problem_from_tensors(q, k, k, window=(-3, 0))
