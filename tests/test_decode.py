"""Split-K flash-decoding (``triton_decode``) against the float64 reference.

On the CPU the kernels run under the Triton interpreter at small shapes (fp16/fp32; bf16 ``tl.dot`` is
broken in the triton 3.9 interpreter, so bf16 runs on the GPU only). The ``gpu`` tests cover the
serving shapes and bf16.
"""

from __future__ import annotations

import doctest
import functools
import itertools
import random

import pytest
import torch

from attntune.kernels import registry
from attntune.kernels.masks import build_mask
from attntune.kernels.reference import reference_attention
from attntune.kernels.triton_decode import launch
from attntune.kernels.triton_decode.op import decode_attention
from attntune.problem import AttentionProblem, dtype_name
from helpers import assert_close, rand_qkv

HAS_GPU = torch.cuda.is_available()
DEV = "cuda" if HAS_GPU else "cpu"
DTYPES = [torch.float16, torch.float32,
          pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
              not HAS_GPU, reason="bf16 tl.dot returns garbage in the triton interpreter (CPU)"))]


def problem_of(q, k, causal, with_lens, window=None):
    return AttentionProblem(batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2],
                            seqlen_kv=k.shape[2], head_dim=q.shape[3], head_dim_v=k.shape[3],
                            dtype=dtype_name(q.dtype), device_type=q.device.type, causal=causal,
                            window=window, kv_lens=with_lens)


def lens_with_edges(b, s_max, seed=0):
    """Random lengths in [0, s_max] that include 0, 1 and the full length when the batch allows."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, s_max + 1, (b,), generator=g)
    for i, edge in enumerate((s_max, 1, 0)[:b]):
        lens[i] = edge
    return lens.to(torch.int32)


def poison_padding(k, v, lens):
    """NaN in every cache slot past each sequence's length: any read of padding shows in the output."""
    k, v = k.clone(), v.clone()
    for b, n in enumerate(lens.tolist()):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    return k, v


def window_key_range(lens, b, sq, s_max, window):
    """Per sequence, the keys ``[lo, hi)`` the kernel may read: from row 0's first window key
    ``L - Sq - left`` (0 without a left bound) to ``L``, with ``L`` the length clamped to ``[0, s_max]``."""
    ranges = []
    for n in (lens.tolist() if lens is not None else [s_max] * b):
        n = min(max(n, 0), s_max)
        left = window[0] if window is not None and window[0] >= 0 else None
        ranges.append((0 if left is None else max(0, n - sq - left), n))
    return ranges


def poison_outside_window(k, v, lens, sq, window):
    """NaN in every cache slot outside each sequence's readable range (:func:`window_key_range`): before
    row 0's window start and past the length. Any read of them shows in the output."""
    k, v = k.clone(), v.clone()
    for b, (lo, hi) in enumerate(window_key_range(lens, k.shape[0], sq, k.shape[2], window)):
        for t in (k, v):
            t[b, :, :lo] = float("nan")
            t[b, :, hi:] = float("nan")
    return k, v


def check(q, k, v, lens, causal, config, k_ref=None, v_ref=None, window=None):
    """Run into a NaN-poisoned output and compare with the float64 reference (computed on ``k_ref``,
    ``v_ref`` when the kernel's inputs are poisoned)."""
    out = torch.full(q.shape[:3] + (v.shape[3],), float("nan"), device=q.device, dtype=q.dtype)
    res = decode_attention(q, k, v, kv_lens=lens, causal=causal, window=window, config=config, out=out)
    assert res.data_ptr() == out.data_ptr()
    ref = reference_attention(q, k if k_ref is None else k_ref, v if v_ref is None else v_ref,
                              problem_of(q, k, causal, lens is not None, window), lens)
    assert_close(out, ref, dtype_name(q.dtype))
    empty = (ref == 0).all(-1)  # rows without admissible keys: the reference gives exact zeros
    assert (out[empty] == 0).all(), "rows without keys must be exactly zero"
    return out


# ---- semantics of the reference: per-sequence bottom-right diagonal with kv_lens ------------------
def test_mask_with_kv_lens_aligns_each_sequence_to_its_own_length():
    p = AttentionProblem(batch=2, heads_q=1, heads_kv=1, seqlen_q=3, seqlen_kv=6, head_dim=8, head_dim_v=8,
                         dtype="float32", causal=True, kv_lens=True)
    m = build_mask(p, "cpu", torch.tensor([4, 2]))  # [B, 1, Sq, Skv]
    want = torch.tensor([
        [[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]],  # rows are positions 1, 2, 3 of 4
        [[0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]],  # positions -1, 0, 1 of 2
    ], dtype=torch.bool)
    assert torch.equal(m[:, 0], want)
    # Without kv_lens nothing changed: the diagonal sits at Skv - Sq.
    p2 = p.model_copy(update={"kv_lens": False})
    assert torch.equal(build_mask(p2, "cpu"), torch.ones(3, 6, dtype=torch.bool).tril(3))
    # Window with kv_lens: per-sequence diagonal as well (left reach 1).
    p3 = p.model_copy(update={"window": (1, 0)})
    m3 = build_mask(p3, "cpu", torch.tensor([4, 2]))[:, 0]
    assert m3[0, 2].tolist() == [0, 0, 1, 1, 0, 0] and m3[1, 2].tolist() == [1, 1, 0, 0, 0, 0]
    # Lengths are clamped to [0, Skv] before anything else: the diagonal of a length past the cache is
    # that of a full cache, a negative length is 0.
    assert torch.equal(build_mask(p3, "cpu", torch.tensor([9, -4])),
                       build_mask(p3, "cpu", torch.tensor([6, 0])))


# ---- correctness vs reference -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq, hkv", [(4, 1), (4, 2), (4, 4)])
@pytest.mark.parametrize("sq", [1, 4, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_kv_lens_matches_reference(dtype, hq, hkv, sq, causal):
    b, s_max, d = 4, 37, 64
    q, k, v = rand_qkv(b, hq, hkv, sq, s_max, d, dtype=dtype, device=DEV, seed=sq * 7 + hkv)
    lens = lens_with_edges(b, s_max, seed=hq + sq).to(DEV)
    kp, vp = poison_padding(k, v, lens)
    # Split count 1 (direct write) and 3 (partials + reduction, one split partly empty for short rows).
    for splits in (1, 3):
        out = check(q, kp, vp, lens, causal, {"BLOCK_N": 16, "num_splits": splits}, k, v)
        assert (out[lens == 0] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq, causal", [(1, False), (5, True), (5, False)])
def test_no_kv_lens_bottom_right(dtype, sq, causal):
    q, k, v = rand_qkv(2, 6, 2, sq, 45, 64, dtype=dtype, device=DEV, seed=3)
    check(q, k, v, None, causal, {"BLOCK_N": 16, "num_splits": 2})


@pytest.mark.parametrize("d", [64, 80, 96] + ([128, 160, 256] if HAS_GPU else []))
def test_head_dims(d):
    q, k, v = rand_qkv(2, 4, 2, 2, 40, d, dtype=torch.float16, device=DEV, seed=d)
    lens = torch.tensor([40, 17], dtype=torch.int32, device=DEV)
    check(q, k, v, lens, True, {"BLOCK_N": 32, "num_splits": 2})


def test_result_independent_of_split_count_and_tiles():
    q, k, v = rand_qkv(1, 4, 2, 3, 300, 64, dtype=torch.float32, device=DEV, seed=5)
    lens = torch.tensor([293], dtype=torch.int32, device=DEV)
    base = decode_attention(q, k, v, kv_lens=lens, causal=True, config={"BLOCK_N": 64, "num_splits": 1})
    ref = reference_attention(q, k, v, problem_of(q, k, True, True), lens)
    assert_close(base, ref, "float32")
    for cfg in ({"BLOCK_N": 16, "num_splits": 7, "num_stages": 1}, {"BLOCK_N": 32, "num_splits": 64},
                {"BLOCK_N": 64, "num_splits": 4, "num_stages": 3}, {"BLOCK_N": 16, "num_splits": "auto"}):
        out = decode_attention(q, k, v, kv_lens=lens, causal=True, config=cfg)
        torch.testing.assert_close(out, base, atol=2e-6, rtol=2e-6, msg=lambda m: f"{cfg}: {m}")


def test_arbitrary_strides_and_int64_lens():
    b, hq, hkv, sq, s, d = 2, 4, 2, 3, 33, 64
    g = torch.Generator().manual_seed(11)
    # q as a transposed [B, Sq, H, D] tensor; caches as [B, S, H, D] buffers sliced on S (vLLM-like).
    q = torch.randn(b, sq, hq, d, generator=g).to(DEV, torch.float16).transpose(1, 2)
    kbuf = torch.randn(b, s + 9, hkv, d, generator=g).to(DEV, torch.float16)
    vbuf = torch.randn(b, s + 9, hkv, d, generator=g).to(DEV, torch.float16)
    k, v = kbuf[:, :s].transpose(1, 2), vbuf[:, :s].transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    lens = torch.tensor([33, 20], dtype=torch.int64, device=DEV)
    obuf = torch.full((b, sq, hq, d), float("nan"), device=DEV, dtype=torch.float16)
    out = decode_attention(q, k, v, kv_lens=lens, causal=True, config={"BLOCK_N": 16, "num_splits": 2},
                           out=obuf.transpose(1, 2))
    ref = reference_attention(q, k, v, problem_of(q, k, True, True), lens)
    assert_close(out, ref, "float16")
    assert_close(obuf.transpose(1, 2), ref, "float16", what="strided out buffer")


def test_rows_without_keys_are_zero():
    # kv_lens 0 for everyone, and causal rows whose diagonal falls before key 0 (kv_lens < Sq).
    q, k, v = rand_qkv(3, 2, 1, 4, 20, 64, dtype=torch.float32, device=DEV, seed=2)
    lens = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEV)
    out = check(q, k, v, lens, True, {"BLOCK_N": 16, "num_splits": 2})
    assert (out[0] == 0).all()
    assert (out[1, :, :2] == 0).all() and (out[1, :, 2:] != 0).any()
    assert (out[2, :, :1] == 0).all() and (out[2, :, 1:] != 0).any()
    empty = torch.zeros(3, dtype=torch.int32, device=DEV)
    assert (decode_attention(q, k, v, kv_lens=empty) == 0).all()
    # A window's right reach empties the same rows; a left reach never empties a row (row i's window
    # starts at or before its diagonal key, which is < L_b).
    out_w = check(q, k, v, lens, False, {"BLOCK_N": 16, "num_splits": 2}, window=(1, 0))
    assert torch.equal(out_w == 0, out == 0)


def test_lengths_beyond_cache_are_clamped_for_reads_and_diagonal():
    q, k, v = rand_qkv(2, 2, 1, 2, 16, 64, dtype=torch.float32, device=DEV, seed=4)
    lens = torch.tensor([40, -3], dtype=torch.int32, device=DEV)
    cfg = {"BLOCK_N": 16, "num_splits": 2}
    out = check(q, k, v, lens, True, cfg)
    # The clamped length places the diagonal too: 40 on a 16-key cache is exactly a full cache (row 0 of
    # Sq = 2 does not see key 15), -3 is an empty sequence.
    clamped = torch.tensor([16, 0], dtype=torch.int32, device=DEV)
    assert torch.equal(out, decode_attention(q, k, v, kv_lens=clamped, causal=True, config=cfg))
    assert not torch.equal(out[0, :, 0], decode_attention(q, k, v, kv_lens=clamped, config=cfg)[0, :, 0])
    assert (out[1] == 0).all()
    # ... and the window's diagonal, with keys before the window poisoned.
    kp, vp = poison_outside_window(k, v, lens, 2, (3, 0))
    out_w = check(q, kp, vp, lens, False, cfg, k, v, window=(3, 0))
    assert torch.equal(out_w, decode_attention(q, kp, vp, kv_lens=clamped, window=(3, 0), config=cfg))


def test_scale_argument():
    q, k, v = rand_qkv(1, 2, 2, 1, 30, 64, dtype=torch.float32, device=DEV, seed=6)
    out = decode_attention(q, k, v, scale=0.3, config={"BLOCK_N": 16, "num_splits": 1})
    p = problem_of(q, k, False, False).model_copy(update={"scale": 0.3})
    assert_close(out, reference_attention(q, k, v, p), "float32")


def test_argument_errors():
    q, k, v = rand_qkv(2, 4, 2, 1, 8, 64, device=DEV)
    with pytest.raises(ValueError, match="seqlen_q 17"):
        decode_attention(q.expand(2, 4, 17, 64), k, v)
    with pytest.raises(ValueError, match="multiple"):
        decode_attention(q[:, :3], k, v)
    with pytest.raises(ValueError, match="k_cache/v_cache: dtype"):
        decode_attention(q, k.half(), v.half())
    with pytest.raises(ValueError, match="kv_lens"):
        decode_attention(q, k, v, kv_lens=torch.ones(3, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="kv_lens"):
        decode_attention(q, k, v, kv_lens=torch.ones(2, device=DEV))
    with pytest.raises(ValueError, match="v_cache"):
        decode_attention(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match="BLOCK_N"):
        decode_attention(q, k, v, config={"BLOCK_N": 24})
    with pytest.raises(ValueError, match="unknown"):
        decode_attention(q, k, v, config={"BLOCK_M": 16})
    with pytest.raises(ValueError, match="out"):
        decode_attention(q, k, v, out=torch.empty(2, 4, 1, 32, device=DEV))
    for bad in ((-2, 0), (0, -5), (1,), (1, 2, 3), (1.5, 0), (True, 0), "ab", 4):
        with pytest.raises(ValueError, match="window"):
            decode_attention(q, k, v, window=bad)


def test_auto_split_heuristic_doctests():
    assert doctest.testmod(launch, raise_on_error=False).failed == 0
    assert launch.block_m(4, 1, 128) == 16 and launch.block_m(8, 16, 128) == 128
    assert launch.block_m(32, 16, 256) == 64  # capped: accumulator 64 x 256
    # stages: 3 fit a D=128 program; D=256 with BLOCK_N 64 would exceed the per-program budget
    assert launch.auto_num_stages(8, 132, 228 * 1024, 64, 256, 256, 2) == 2
    p = launch.plan_launch(1, 32, 1, 128, 8, 8192, 128, 2, 132, 228 * 1024, launch.DecodeConfig())
    assert (p.splits, p.num_stages, p.grid) == (32, 3, (8, 32, 1))
    p = launch.plan_launch(64, 32, 1, 128, 8, 4096, 128, 2, 132, 228 * 1024, launch.DecodeConfig())
    assert (p.splits, p.num_stages, p.grid) == (1, 2, (512, 1, 1))
    # an explicit config is taken as given, except splits beyond the number of tiles
    p = launch.plan_launch(1, 4, 2, 64, 2, 100, 64, 2, 132, 228 * 1024,
                           launch.DecodeConfig.from_dict({"BLOCK_N": 32, "num_splits": 64, "num_stages": 1}))
    assert (p.splits, p.num_stages, p.grid) == (4, 1, (2, 4, 1))
    assert (p.has_left, p.has_right) == (False, False)


def test_plan_cached_by_tile_counts_equals_the_direct_plan():
    """plan_launch caches on the span's tile counts, not on S_max (a decode loop's new length must not
    make a new plan): its result equals the split rule applied to the exact span, for odd lengths,
    windows, configs and GQA shapes."""
    rng = random.Random(7)
    for _ in range(400):
        B, Hkv, g, Sq = rng.choice((1, 2, 3, 64)), rng.choice((1, 2, 8)), rng.choice((1, 4, 7)), rng.randint(1, 16)
        D = rng.choice((40, 64, 128))
        S = rng.randint(1, 70000)
        cfg = launch.DecodeConfig(BLOCK_N=rng.choice((16, 64, 256)), num_splits=rng.choice((0, 0, 3, 64)))
        causal = rng.random() < 0.5
        window = rng.choice((None, (rng.randint(0, 5000), rng.choice((-1, 0, 3)))))
        p = launch.plan_launch(B, Hkv * g, Sq, D, Hkv, S, D, 2, 132, 228 * 1024, cfg, causal, window)
        left, right = launch.mask_bounds(causal, window, Sq, S)
        span = launch.keys_per_program(S, Sq, left)
        programs = B * Hkv * p.grid[2]
        want = cfg.num_splits or launch.auto_num_splits(programs, span, 132, cfg.BLOCK_N)
        assert p.splits == max(1, min(want, -(-max(span, 1) // cfg.BLOCK_N))), (B, Hkv, g, Sq, D, S, cfg, window)
        assert (p.has_left, p.has_right, p.win_left, p.win_right) == (
            left is not None, right is not None, left or 0, right or 0)
        kv_bytes = B * Hkv * -(-max(span, 1) // cfg.BLOCK_N) * cfg.BLOCK_N * 2 * D * 2
        assert p.eager_fused == (p.splits > 1 and kv_bytes <= launch.EAGER_FUSE_MAX_BYTES)


def test_a_prepared_launch_serves_its_length_range_as_a_full_prepare_would():
    """A DecodeLaunch serves the KV lengths it covers (a serving loop's views into one cache, a new length
    every step) exactly as prepare_decode would launch them — kernel keys, grid, argument tails, range —
    and its plan is the same over the whole range; for odd lengths, windows, configs, GQA shapes and
    kv_lens. A length of 1 is served only by its own launch."""
    rng = random.Random(11)
    hits = 0
    for _ in range(300):
        B, Hkv, g, Sq = rng.choice((1, 3, 64)), rng.choice((1, 2)), rng.choice((1, 4, 7)), rng.randint(1, 16)
        D = rng.choice((16, 40, 64))
        S0 = rng.choice((1, rng.randint(1, 3000)))
        S1 = max(1, min(3000, S0 + rng.randint(-200, 200)))
        buf = torch.empty(B, Hkv, 3000, D, dtype=torch.float16)
        q = torch.empty(B, Hkv * g, Sq, D, dtype=torch.float16)
        out = torch.empty(B, Hkv * g, Sq, D, dtype=torch.float16)
        lens = torch.full((B,), S0, dtype=torch.int32) if rng.random() < 0.3 else None
        cfg = launch.DecodeConfig(BLOCK_N=rng.choice((16, 64, 256)), num_splits=rng.choice((0, 0, 1, 3)))
        causal = rng.random() < 0.5
        window = rng.choice((None, (rng.randint(0, 2000), rng.choice((-1, 0, 3)))))
        args = (causal, 0.3, cfg, "tf32", window)
        first = launch.prepare_decode(q, buf[:, :, :S0], buf[:, :, :S0], lens, out, *args)
        assert first.covers(S0) and (first.lo == 1) == (S0 == 1)
        plan = functools.partial(launch.plan_launch, B, Hkv * g, Sq, D, Hkv)
        for s in {first.lo, first.hi, (first.lo + first.hi) // 2, S0} - {2**31 - 1}:
            assert plan(s, D, 2, 132, 228 * 1024, cfg, causal, window) == first.plan, (S0, s, first.lo, first.hi)
        full = launch.prepare_decode(q, buf[:, :, :S1], buf[:, :, :S1], lens, out, *args)
        if first.covers(S1):
            assert full == first, (B, Hkv, g, Sq, D, S0, S1, cfg, window)
            hits += 1
        else:  # another range, or Triton's other class of the length
            assert not first.lo <= S1 <= first.hi or (S1 % 16 == 0) != (S0 % 16 == 0) or 1 in (S0, S1)
    assert hits > 100


def test_an_eager_launch_range_stops_where_the_one_split_choice_flips():
    """Eager calls run one split up to EAGER_ONE_SPLIT_BYTES a program (TritonDecodeVariant.eager_config):
    a prepared eager launch serves only lengths of its own choice, the cut found exactly."""
    from attntune.kernels import triton_decode_variant as tdv

    variant = registry.get("triton_decode")
    problem = AttentionProblem(batch=1, heads_q=8, heads_kv=2, seqlen_q=1, seqlen_kv=4000, head_dim=80,
                               head_dim_v=80, dtype="bfloat16", causal=True, device_type="cuda")
    bound = tdv.BoundDecode(variant, problem, {"BLOCK_N": 16, "num_splits": 0, "num_warps": 4, "num_stages": 0})
    flip = tdv.EAGER_ONE_SPLIT_BYTES // bound.bytes_per_key  # the longest one-split cache: 3276 keys
    q = torch.empty(1, 8, 1, 80, dtype=torch.bfloat16)
    buf = torch.empty(1, 2, 4000, 80, dtype=torch.bfloat16)
    for s in (flip - 5, flip, flip + 1, flip + 3):
        natural = launch.length_range(1, s, True, None, 16)
        assert natural[0] < flip < natural[1]  # the cut falls inside the plan's own range
        got = bound._prepare(q, buf[:, :, :s], buf[:, :, :s], None, q.new_empty(1, 8, 1, 80), False, None, None)
        one = s <= flip
        assert (got.cfg.num_splits == 1) == one
        assert (got.lo, got.hi) == ((natural[0], flip) if one else (flip + 1, natural[1])), (s, got.lo, got.hi)


def test_plan_follows_the_window():
    plan = functools.partial(launch.plan_launch, 1, 32, 1, 128, 8, 32768, 128, 2, 132, 228 * 1024,
                             launch.DecodeConfig())
    # A 1024-key window over a 32k cache: the splits divide the window (8 of 128 keys), not the cache.
    assert plan().splits == 32
    p = plan(True, (1023, 0))
    assert (p.splits, p.has_left, p.has_right, p.win_left) == (8, True, False, 1023)  # Sq=1: causal is free
    assert plan(False, (1023, -1)) == p
    # Sides that exclude no key are dropped; causal is a right reach of 0 once Sq > 1.
    assert plan(True) == plan() == plan(False, (32767, 5))
    plan4 = functools.partial(launch.plan_launch, 1, 32, 4, 128, 8, 32768, 128, 2, 132, 228 * 1024)
    p = plan4(launch.DecodeConfig(), True, (100, 7))
    assert (p.has_left, p.has_right, p.win_left, p.win_right) == (True, True, 100, 0)
    # Explicit splits beyond the window's tiles are cut to them: (100 + 4) keys = 2 tiles of 64.
    assert plan4(launch.DecodeConfig(num_splits=16), True, (100, 7)).splits == 2


# ---- sliding window ------------------------------------------------------------------------------------
WINDOWS = [(0, 0), (3, 0), (7, 2), (5, -1), (-1, 3), (40, 0)]
GROUPS = [(4, 1), (4, 2), (4, 4)]
WINDOW_CONFIGS = [{"BLOCK_N": 16, "num_splits": 1}, {"BLOCK_N": 16, "num_splits": 3},
                  {"BLOCK_N": 32, "num_splits": 3}, {"BLOCK_N": 32, "num_splits": 0},
                  {"BLOCK_N": 16, "num_splits": "auto"}]


def window_cases():
    """Every window x causal x Sq (1, 3, 5) once. dtype, GQA group, kv_lens and config rotate so that
    every window meets both dtypes, all three groups, all five configs, and kv_lens on and off with and
    without causal and at every Sq (the full product is too slow for the interpreter)."""
    cases = []
    for (w, window), (c, causal), (t, sq) in itertools.product(enumerate(WINDOWS), enumerate((False, True)),
                                                             enumerate((1, 3, 5))):
        dtype = (torch.float16, torch.float32)[(w + t) % 2]
        hq, hkv = GROUPS[(w + c + t) % 3]
        with_lens = (c + t) % 2 == 0
        cfg = WINDOW_CONFIGS[(w + 2 * c + t) % len(WINDOW_CONFIGS)]
        cases.append(pytest.param(window, causal, sq, dtype, hq, hkv, with_lens, cfg,
                                  id=f"w{window[0]},{window[1]}-{'causal-' if causal else ''}sq{sq}-"
                                     f"{dtype_name(dtype)}-{hq}/{hkv}-{'lens' if with_lens else 'nolens'}-"
                                     f"bn{cfg['BLOCK_N']}s{cfg['num_splits']}"))
    return cases


@pytest.mark.parametrize("window, causal, sq, dtype, hq, hkv, with_lens, cfg", window_cases())
def test_window_matches_reference(window, causal, sq, dtype, hq, hkv, with_lens, cfg):
    b, s_max = 4, 70  # 70: five 16-key tiles, the last one partial; (40, 0) leaves keys before the window
    q, k, v = rand_qkv(b, hq, hkv, sq, s_max, 64, dtype=dtype, device=DEV, seed=sq + hkv)
    lens = lens_with_edges(b, s_max, seed=sq).to(DEV) if with_lens else None  # L = 70, 1, 0 and random
    kp, vp = poison_outside_window(k, v, lens, sq, window)
    check(q, kp, vp, lens, causal, cfg, k, v, window=window)


def test_window_more_splits_than_window_tiles():
    # A 40-key window with Sq = 3 spans 43 keys, 3 tiles of 16: 64 splits are cut to 3, and the short
    # sequences (20 and 5 keys: 2 and 1 tiles) leave splits empty. Any split count gives the same result.
    q, k, v = rand_qkv(3, 4, 2, 3, 300, 64, dtype=torch.float32, device=DEV, seed=12)
    lens = torch.tensor([300, 20, 5], dtype=torch.int32, device=DEV)
    kp, vp = poison_outside_window(k, v, lens, 3, (40, 0))
    outs = [check(q, kp, vp, lens, True, cfg, k, v, window=(40, 0))
            for cfg in ({"BLOCK_N": 16, "num_splits": 64}, {"BLOCK_N": 16, "num_splits": 1},
                        {"BLOCK_N": 32, "num_splits": 7}, {"BLOCK_N": 16, "num_splits": 0})]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("splits, sq, hq, window, warps", [(2, 1, 8, None, 4), (3, 4, 8, (40, 0), 4),
                                                           (7, 1, 4, None, 4), (64, 3, 2, (100, -1), 4),
                                                           (64, 2, 4, None, 1), (37, 4, 8, (60, 0), 2)])
def test_fused_reduction_equals_the_two_kernel_path(monkeypatch, splits, sq, hq, window, warps):
    """The split kernel's last program combines the splits (FUSED_REDUCE): the same outputs as the
    separate reduction kernel (empty sequences, empty splits, windows, GQA row blocks), and every arrival
    counter is back at 0 after the launch (a kept buffer or a CUDA graph's serves the next launch)."""
    q, k, v = rand_qkv(3, hq, 2, sq, 300, 64, dtype=torch.float32, device=DEV, seed=31)
    lens = lens_with_edges(3, 300, seed=3).to(DEV)
    cfg = {"BLOCK_N": 16, "num_splits": splits}
    sems = []
    real = launch._semaphores
    monkeypatch.setattr(launch, "_semaphores", lambda *a: sems.append(real(*a)) or sems[-1])
    fused = check(q, k, v, lens, True, cfg, window=window)
    assert len(sems) == 1 and sems[0].numel() >= 3 * 2 and (sems[0] == 0).all()
    monkeypatch.setattr(launch, "FUSED_REDUCE", False)
    two = check(q, k, v, lens, True, cfg, window=window)
    assert len(sems) == 1  # the two-kernel path takes no counters
    torch.testing.assert_close(fused, two, atol=2e-6, rtol=2e-6)


def test_large_eager_launch_keeps_the_two_kernel_path(monkeypatch):
    """Past EAGER_FUSE_MAX_BYTES of K/V an eager split launch is device-bound and keeps the two kernels
    (no counters taken); the plan at the H200's measured sizes: 33.5 MB a call fuses, 67 MB does not."""
    plan = functools.partial(launch.plan_launch, Sq=1, Hkv=8, Dv=64, itemsize=2, sms=132,
                             smem_per_sm=228 * 1024, cfg=launch.DecodeConfig())
    assert plan(B=1, Hq=32, D=64, S_max=16384).eager_fused  # 33.5 MB
    assert not plan(B=8, Hq=32, D=64, S_max=4096).eager_fused  # 67 MB
    sems = []
    real = launch._semaphores
    monkeypatch.setattr(launch, "_semaphores", lambda *a: sems.append(real(*a)) or sems[-1])
    q, k, v = rand_qkv(2, 4, 2, 1, 200, 64, dtype=torch.float32, device=DEV, seed=33)
    cfg = {"BLOCK_N": 16, "num_splits": 4}
    check(q, k, v, None, False, cfg)
    assert len(sems) == 1
    # this launch reads B 2 * Hkv 2 * 13 tiles of 16 keys * (64 + 64) dims * 4 bytes: one byte under it
    monkeypatch.setattr(launch, "EAGER_FUSE_MAX_BYTES", 2 * 2 * 13 * 16 * 128 * 4 - 1)
    launch._plan.cache_clear()
    try:
        check(q, k, v, None, False, cfg)
        assert len(sems) == 1
    finally:
        launch._plan.cache_clear()


def test_window_equivalent_masks_are_bitwise_equal():
    # Masks that admit the same keys run the same compiled kernel on the same key range.
    q, k, v = rand_qkv(2, 4, 2, 3, 50, 64, dtype=torch.float32, device=DEV, seed=13)
    lens = torch.tensor([50, 17], dtype=torch.int32, device=DEV)
    cfg = {"BLOCK_N": 16, "num_splits": 2}

    def run(q, **kw):
        return decode_attention(q, k, v, kv_lens=lens, config=cfg, **kw)

    assert torch.equal(run(q, causal=True, window=(4, 2)), run(q, window=(4, 0)))  # causal ∩ window
    assert torch.equal(run(q, window=(49, 2)), run(q))  # sides that exclude no key: no window
    assert torch.equal(run(q[:, :, :1], causal=True), run(q[:, :, :1]))  # one row: causal is free


# ---- the registered variant ----------------------------------------------------------------------------
def _problem(**kw):
    base = dict(batch=2, heads_q=8, heads_kv=2, seqlen_q=1, seqlen_kv=4096, head_dim=128, head_dim_v=128,
                dtype="bfloat16", device_type="cuda")
    return AttentionProblem(**{**base, **kw})


def test_variant_registered_and_supports_reasons():
    var = registry.get("triton_decode")
    assert var.family == "triton" and var.exact
    assert "attntune.kernels.triton_decode.jit" in var.source_modules
    assert var.supports(_problem()) == []
    assert var.supports(_problem(seqlen_q=16, causal=True, kv_lens=True)) == []
    cases = {
        "seqlen_q 17": dict(seqlen_q=17),
        "forward only": dict(mode="fwd_bwd"),
        "head_dim 512": dict(head_dim=512, head_dim_v=512),
        "head_dim_v 64": dict(head_dim_v=64),
        "top-left": dict(seqlen_q=4, causal=True, causal_align="top_left"),
        "top-left alignment": dict(seqlen_q=4, window=(8, 0), causal_align="top_left"),  # windows too
        "float64": dict(dtype="float64"),
    }
    for needle, kw in cases.items():
        reasons = var.supports(_problem(**kw))
        assert any(needle in r for r in reasons), (needle, reasons)
    # top-left causal (or window) is the same mask when Sq == Skv and there are no kv_lens
    assert var.supports(_problem(seqlen_q=8, seqlen_kv=8, causal=True, causal_align="top_left")) == []
    assert var.supports(_problem(seqlen_q=8, seqlen_kv=8, window=(3, 1), causal_align="top_left")) == []
    assert var.supports(_problem(seqlen_q=8, seqlen_kv=8, window=(3, 1), causal_align="top_left",
                                 kv_lens=True))
    # sliding windows (bottom-right), alone or with causal and kv_lens
    for window in ((128, 0), (1023, -1), (-1, 4), (0, 0)):
        assert var.supports(_problem(window=window)) == []
        assert var.supports(_problem(seqlen_q=4, window=window, causal=True, kv_lens=True)) == []


def test_variant_cpu_needs_interpreter(monkeypatch):
    var = registry.get("triton_decode")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert any("CUDA" in r for r in var.supports(_problem(device_type="cpu")))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert var.supports(_problem(device_type="cpu")) == []


def test_variant_space():
    var = registry.get("triton_decode")
    for p in (_problem(), _problem(heads_kv=1, heads_q=32, seqlen_q=16, head_dim=256, head_dim_v=256),
              _problem(dtype="float32", head_dim=80, head_dim_v=80)):
        sp = var.space(p)
        assert sp.validate(sp.default) == [], (p.short(), sp.default)
        assert sp.names == ("BLOCK_N", "num_splits", "num_warps", "num_stages")
        n_valid = sum(1 for _ in sp.grid())
        assert 0 < n_valid < sp.raw_size()  # the constraint removes something, not everything
    big = var.space(_problem(heads_kv=1, heads_q=32, seqlen_q=16, head_dim=256, head_dim_v=256))
    bad = {"BLOCK_N": 256, "num_splits": 1, "num_warps": 1, "num_stages": 4}
    assert big.validate(bad)  # shared memory and registers
    assert big.validate({**bad, "num_splits": 3}) and big.validate({**bad, "num_splits": "auto"})


def test_variant_run_matches_reference():
    var = registry.get("triton_decode")
    q, k, v = rand_qkv(2, 4, 2, 2, 50, 64, dtype=torch.float16, device=DEV, seed=9)
    lens = torch.tensor([50, 9], dtype=torch.int32, device=DEV)
    for p in (problem_of(q, k, True, True), problem_of(q, k, True, True, (6, -1))):
        assert registry.reasons(var, p) == []
        out = var.run(q, k, v, p, var.space(p).first(), lens)
        assert_close(out, reference_attention(q, k, v, p, lens), "float16")


# ---- GPU grid ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b, s_max", [(8, 32), (1, 4096), (17, 1025)])
@pytest.mark.parametrize("hkv", [1, 2, 8])
@pytest.mark.parametrize("sq", [1, 4, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_grid(dtype, b, s_max, hkv, sq, causal):
    q, k, v = rand_qkv(b, 8, hkv, sq, s_max, 128, dtype=dtype, device="cuda", seed=b + hkv + sq)
    lens = lens_with_edges(b, s_max, seed=b * sq).cuda()
    kp, vp = poison_padding(k, v, lens)
    outs = [check(q, kp, vp, lens, causal, {"BLOCK_N": bn, "num_splits": ns, "num_warps": w, "num_stages": st},
                  k, v) for bn, ns, w, st in ((64, 0, 4, 0), (64, 1, 4, 3), (32, 16, 4, 2), (128, 64, 8, 2))]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=2e-2 if dtype == torch.bfloat16 else 4e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 80, 96, 128, 160, 256])
@pytest.mark.parametrize("hq, hkv, sq", [(32, 8, 1), (32, 1, 16), (8, 8, 4)])
def test_gpu_head_dims_and_groups(d, hq, hkv, sq):
    q, k, v = rand_qkv(3, hq, hkv, sq, 1500, d, dtype=torch.bfloat16, device="cuda", seed=d)
    lens = torch.tensor([1500, 1, 777], dtype=torch.int32, device="cuda")
    check(q, k, v, lens, True, None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("sq, causal, window", [(1, True, (1023, 0)), (4, True, (1023, 0)),
                                                (4, False, (1023, -1)), (3, False, (255, 8)),
                                                (4, False, (-1, 1))])
def test_gpu_window_serving(dtype, d, sq, causal, window):
    # Serving sizes: 4k cache, kv_lens from full to empty; every key outside the window range is NaN.
    q, k, v = rand_qkv(2, 32, 8, sq, 4096, d, dtype=dtype, device="cuda", seed=d + sq)
    lens = torch.tensor([4096, 1500], dtype=torch.int32, device="cuda")
    kp, vp = poison_outside_window(k, v, lens, sq, window)
    outs = [check(q, kp, vp, lens, causal, cfg, k, v, window=window)
            for cfg in (None, {"BLOCK_N": 64, "num_splits": 1, "num_stages": 3},
                        {"BLOCK_N": 32, "num_splits": 16, "num_stages": 2},
                        {"BLOCK_N": 128, "num_splits": 64, "num_warps": 8, "num_stages": 2})]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=2e-2 if dtype == torch.bfloat16 else 4e-3, rtol=0)


@pytest.mark.gpu
def test_gpu_window_over_long_cache_reads_only_the_window():
    # 32k cache, 1024-key window: everything before the window is NaN, lengths 32k, 1, 0 and 20000.
    q, k, v = rand_qkv(4, 32, 8, 1, 32768, 128, dtype=torch.bfloat16, device="cuda", seed=3)
    lens = torch.tensor([32768, 1, 0, 20000], dtype=torch.int32, device="cuda")
    kp, vp = poison_outside_window(k, v, lens, 1, (1023, 0))
    del k, v
    out = decode_attention(q, kp, vp, kv_lens=lens, causal=True, window=(1023, 0))
    assert torch.isfinite(out).all()
    k_win = torch.nan_to_num(kp, nan=0.0)  # the reference sees the same window; the rest is masked
    v_win = torch.nan_to_num(vp, nan=0.0)
    ref = reference_attention(q, k_win, v_win, problem_of(q, kp, True, True, (1023, 0)), lens,
                              dtype=torch.float32)
    assert_close(out, ref, "bfloat16")


@pytest.mark.gpu
def test_gpu_fp32_exact_and_graph_capture():
    q, k, v = rand_qkv(2, 32, 8, 1, 8192, 128, dtype=torch.float32, device="cuda", seed=1)
    lens = torch.tensor([8192, 5000], dtype=torch.int32, device="cuda")
    check(q, k, v, lens, False, None)
    qh, kh, vh = q.half(), k.half(), v.half()
    static_out = torch.empty_like(qh)
    decode_attention(qh, kh, vh, kv_lens=lens, out=static_out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(qh, kh, vh, kv_lens=lens, out=static_out)
    lens.copy_(torch.tensor([100, 8000], dtype=torch.int32))  # new lengths, same graph
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = reference_attention(qh, kh, vh, problem_of(qh, kh, False, True), lens)
    assert_close(static_out, ref, "float16")


# ---- the direct launch path (cached CompiledKernel, specialization keys, reused workspace) -------------
@pytest.mark.gpu
def test_gpu_direct_launches_keep_specializations_apart():
    """Same shapes, different things Triton specializes on — dtype, int32/int64 lengths, strides of other
    classes, misaligned pointers — one after the other: a key that conflated any two would launch the
    other's kernel on the second call and give wrong results (or fault)."""
    b, hq, hkv, s, d = 3, 8, 2, 300, 64
    lens = torch.tensor([300, 17, 0], dtype=torch.int32, device="cuda")
    for rep in range(2):  # the second round runs every case through the direct path
        for dtype in (torch.bfloat16, torch.float16):
            q, k, v = rand_qkv(b, hq, hkv, 2, s, d, dtype=dtype, device="cuda", seed=rep)
            check(q, k, v, lens, True, {"BLOCK_N": 32, "num_splits": 4})
            check(q, k, v, lens.long(), True, {"BLOCK_N": 32, "num_splits": 4})
            # [B, S, H, D] buffers sliced on S: strides of other classes than the contiguous case's
            kb = torch.randn(b, s + 3, hkv, d, device="cuda", dtype=dtype)
            vb = torch.randn(b, s + 3, hkv, d, device="cuda", dtype=dtype)
            check(q, kb[:, 3:].transpose(1, 2), vb[:, 3:].transpose(1, 2), lens, True,
                  {"BLOCK_N": 32, "num_splits": 4})
            # a K view starting one element in: 2-byte aligned only
            flat = torch.randn(b * hkv * s * d + 1, device="cuda", dtype=dtype)
            k_odd = flat[1:].view(b, hkv, s, d)
            check(q, k_odd, v, lens, True, {"BLOCK_N": 32, "num_splits": 1})


@pytest.mark.gpu
def test_gpu_reused_workspace_across_calls_and_streams():
    """Back-to-back calls with different split counts on one stream, and on a second stream, all
    correct: the per-stream partials buffer is reused in stream order."""
    q, k, v = rand_qkv(4, 32, 8, 1, 4096, 128, dtype=torch.bfloat16, device="cuda", seed=7)
    lens = torch.tensor([4096, 3000, 77, 1], dtype=torch.int32, device="cuda")
    ref = reference_attention(q, k, v, problem_of(q, k, False, True), lens, dtype=torch.float32)
    outs = [decode_attention(q, k, v, kv_lens=lens, config={"BLOCK_N": 64, "num_splits": n}) for n in (2, 16, 64)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        outs.append(decode_attention(q, k, v, kv_lens=lens, config={"BLOCK_N": 64, "num_splits": 8}))
    torch.cuda.synchronize()
    for out in outs:
        assert_close(out, ref, "bfloat16")


@pytest.mark.gpu
def test_gpu_dispatched_decode_step_captured_in_a_graph():
    """A decode step through attntune.attention (the runtime's plan, direct launches) captured once and
    replayed with new lengths, as a serving loop does; then eager calls at many new lengths."""
    import attntune

    attntune.reset()
    q, k, v = rand_qkv(2, 32, 8, 1, 2048, 64, dtype=torch.bfloat16, device="cuda", seed=9)
    lens = torch.tensor([2048, 1000], dtype=torch.int32, device="cuda")
    assert attntune.explain(q, k, v, kv_lens=lens).variant == "triton_decode"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            attntune.attention(q, k, v, kv_lens=lens)  # warm-up: plan resolved, kernels compiled
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attntune.attention(q, k, v, kv_lens=lens)
    for new in ([5, 2048], [1500, 1501]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference_attention(q, k, v, problem_of(q, k, False, True), lens, dtype=torch.float32)
        assert_close(out, ref, "bfloat16")
    for n in range(1000, 1040):  # eager, a never-seen KV length every call, causal (canonical: no mask)
        out = attntune.attention(q, k[:, :, :n], v[:, :, :n], causal=True)
        ref = reference_attention(q, k[:, :, :n], v[:, :, :n], problem_of(q, k[:, :, :n], False, False),
                                  dtype=torch.float32)
        assert_close(out, ref, "bfloat16")
    attntune.reset()


@pytest.mark.gpu
def test_gpu_decode_under_compiled_cudagraph_trees():
    """torch.compile(mode="reduce-overhead") — what transformers' compiled static-cache generation uses —
    warms up on a side stream with allocations routed to the CUDA-graph pool, then records. A partials
    buffer kept from the warm-up would be a live pool allocation the graph tree refuses ("tensor(s) in the
    cudagraph pool not tracked as outputs"); the decode launcher keeps buffers only on default streams."""
    import attntune

    attntune.reset()
    torch._dynamo.reset()
    q, k, v = rand_qkv(2, 32, 8, 1, 8192, 64, dtype=torch.bfloat16, device="cuda", seed=11)
    lens = torch.tensor([8192, 3001], dtype=torch.int32, device="cuda")  # many splits: partials are used
    step = torch.compile(lambda q, k, v, lens: attntune.attention(q, k, v, kv_lens=lens) * 1.0,
                         mode="reduce-overhead", fullgraph=True)
    for new in ([8192, 3001], [17, 8000], [4096, 4097], [1, 2]):  # warm-up, record, then replays
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        out = step(q, k, v, lens).clone()
        torch.cuda.synchronize()
        ref = reference_attention(q, k, v, problem_of(q, k, False, True), lens, dtype=torch.float32)
        assert_close(out, ref, "bfloat16")
    torch._dynamo.reset()
    attntune.reset()


@pytest.mark.gpu
def test_gpu_decode_family_slot_over_lengths_strides_and_batches():
    """One family-generic slot serves a decode loop whose lengths cross the split plans and Triton's length
    class (views: re-lengthed launches), HF-style new contiguous tensors
    (other strides), and two batches of one bucket — every output against the float32 reference."""
    import attntune
    from attntune.policies import runtime

    attntune.reset()
    q, kbuf, vbuf = rand_qkv(2, 32, 8, 1, 6000, 64, dtype=torch.bfloat16, device="cuda", seed=21)
    assert attntune.explain(q, kbuf[:, :, :3100], vbuf[:, :, :3100], causal=True).variant == "triton_decode"
    lengths = list(range(3073, 3140)) + list(range(4090, 4110)) + [5000, 5001, 5120, 5999]
    for n in lengths:
        k, v = kbuf[:, :, :n], vbuf[:, :, :n]
        for kk, vv in ((k, v), (k.contiguous(), v.contiguous())):
            out = attntune.attention(q, kk, vv, causal=True)
            ref = reference_attention(q, kk, vv, problem_of(q, kk, False, False), dtype=torch.float32)
            assert_close(out, ref, "bfloat16")
    q17, k17, v17 = rand_qkv(17, 32, 8, 1, 3000, 64, dtype=torch.bfloat16, device="cuda", seed=22)
    for b in (17, 20):
        qq, kk, vv = (t if b == 17 else torch.cat([t, t[:3]]) for t in (q17, k17, v17))
        out = attntune.attention(qq, kk, vv, causal=True)
        ref = reference_attention(qq, kk, vv, problem_of(qq, kk, False, False), dtype=torch.float32)
        assert_close(out, ref, "bfloat16")
    generic = {id(s) for s in runtime.SLOTS.values() if s.generic}
    assert len(generic) >= 2 and len(runtime.SLOTS) >= len(lengths)
    attntune.reset()


@pytest.mark.gpu
def test_gpu_fused_reduction_is_deterministic_and_race_free():
    """The fused split-K reduction (last arrival combines) against the two-kernel path and the reference,
    repeated: a missing fence or a stale L1 line would show as a result that changes between identical
    launches; the kept counters must stay 0 across hundreds of launches. A captured launch takes the
    two-kernel path (no counters): its replays equal the eager two-kernel result bit for bit."""
    q, k, v = rand_qkv(4, 32, 8, 1, 32768, 128, dtype=torch.bfloat16, device="cuda", seed=41)
    lens = torch.tensor([32768, 17, 20000, 1], dtype=torch.int32, device="cuda")
    cfg = {"BLOCK_N": 64, "num_splits": 64}
    first = check(q, k, v, lens, False, cfg)
    for i in range(300):
        out = decode_attention(q, k, v, kv_lens=lens, config=cfg)
        assert torch.equal(out, first), f"launch {i} differs"
    assert all((s == 0).all() for s in launch._SEMAPHORES.values())
    launch.FUSED_REDUCE = False
    try:
        two = decode_attention(q, k, v, kv_lens=lens, config=cfg)
    finally:
        launch.FUSED_REDUCE = True
    torch.testing.assert_close(two, first, atol=1e-2, rtol=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gout = decode_attention(q, k, v, kv_lens=lens, config=cfg)
    for _ in range(50):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(gout, two)


def test_eager_config_runs_one_split_only_for_small_programs():
    """Eager GPU calls whose programs read at most EAGER_ONE_SPLIT_BYTES of K+V run one split (the H200
    probe: 1.14-1.26x a step at 256-512 KiB); larger ones and captured/CPU calls keep the tuned config;
    a window bounds the keys a program reads."""
    from attntune.kernels.triton_decode_variant import EAGER_ONE_SPLIT_BYTES, TritonDecodeVariant

    var = TritonDecodeVariant()
    cfg = launch.DecodeConfig(BLOCK_N=64, num_splits=0)
    per_key = 2 * 128 * 2  # D 128 K and V, bf16: 512 KiB at 1024 keys
    assert EAGER_ONE_SPLIT_BYTES == 1024 * per_key
    assert var.eager_config(cfg, 1, 1024, None, per_key, True).num_splits == 1
    assert var.eager_config(cfg, 1, 1025, None, per_key, True) is cfg
    assert var.eager_config(cfg, 1, 1024, None, per_key, False) is cfg  # the CPU interpreter
    assert var.eager_config(cfg, 1, 32768, (1000, 0), per_key, True).num_splits == 1  # 1001 keys a program
    one = var.eager_config(cfg, 1, 1024, None, per_key, True)
    assert var.eager_config(cfg, 3, 900, None, per_key, True) is one  # one object per config: launch.cfg is cfg


def test_rocm_keeps_the_two_kernel_path(monkeypatch):
    """On ROCm an eager split launch does not fuse its combine (untested memory ordering across XCDs)."""
    q, k, v = rand_qkv(2, 4, 2, 1, 200, 64, dtype=torch.float32, device=DEV, seed=35)
    cfg = {"BLOCK_N": 16, "num_splits": 4}
    sems = []
    real = launch._semaphores
    monkeypatch.setattr(launch, "_semaphores", lambda *a: sems.append(real(*a)) or sems[-1])
    monkeypatch.setattr(launch, "_ROCM", True)
    check(q, k, v, None, False, cfg)
    assert sems == []
    monkeypatch.setattr(launch, "_ROCM", False)
    check(q, k, v, None, False, cfg)
    assert len(sems) == 1
