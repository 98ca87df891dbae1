"""Problem model: construction from tensors, validation errors naming the argument, derived sizes."""

import pytest
import torch

from attntune.problem import AttentionProblem, problem_from_tensors


def _qkv(b=2, hq=4, hkv=2, sq=5, skv=7, d=16, dv=None, dtype=torch.float32):
    return (torch.randn(b, hq, sq, d, dtype=dtype), torch.randn(b, hkv, skv, d, dtype=dtype),
            torch.randn(b, hkv, skv, dv or d, dtype=dtype))


def test_from_tensors_fields():
    q, k, v = _qkv()
    p = problem_from_tensors(q, k, v, causal=True, window=(3, 0))
    assert (p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_kv, p.head_dim) == (2, 4, 2, 5, 7, 16)
    assert p.dtype == "float32" and p.device_type == "cpu" and p.group == 2
    assert p.offset == 2 and p.window_bounds == (3, 0) and p.mode == "fwd"
    assert hash(p) == hash(problem_from_tensors(q, k, v, causal=True, window=(3, 0)))


def test_mode_follows_requires_grad():
    q, k, v = _qkv()
    assert problem_from_tensors(q.requires_grad_(), k, v).mode == "fwd_bwd"
    with torch.no_grad():
        assert problem_from_tensors(q, k, v).mode == "fwd"


@pytest.mark.parametrize("mutate, arg", [
    (lambda q, k, v: (q[0], k, v), "q"),
    (lambda q, k, v: (q, k[..., 0], v), "k"),
    (lambda q, k, v: (q, k[:1], v[:1]), "batch"),
    (lambda q, k, v: (q, k[..., :8], v), "head_dim"),
    (lambda q, k, v: (q, k.double(), v.double()), "dtype"),
    (lambda q, k, v: (q[:, :3], k, v), "heads_q"),
    (lambda q, k, v: (q, k, v[:, :, :3]), "v"),
])
def test_bad_input_names_argument(mutate, arg):
    q, k, v = mutate(*_qkv())
    with pytest.raises(ValueError, match=arg):
        problem_from_tensors(q, k, v)


def test_device_mismatch_and_kv_lens_errors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="device"):
        problem_from_tensors(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="kv_lens"):
        problem_from_tensors(q, k, v, kv_lens=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="kv_lens"):
        problem_from_tensors(q, k, v, kv_lens=torch.tensor([1.0, 2.0]))


def test_model_validation():
    base = dict(batch=1, heads_q=8, heads_kv=2, seqlen_q=4, seqlen_kv=4, head_dim=64, head_dim_v=64, dtype="float16")
    AttentionProblem(**base)
    with pytest.raises(ValueError, match="heads_kv"):
        AttentionProblem(**{**base, "heads_kv": 3})
    with pytest.raises(ValueError, match="dtype"):
        AttentionProblem(**{**base, "dtype": "int8"})
    with pytest.raises(ValueError, match="window"):
        AttentionProblem(**{**base, "window": (-2, 0)})


@pytest.mark.parametrize("sq, skv, causal, window", [
    (7, 7, False, None), (7, 7, True, None), (3, 9, True, None), (9, 3, True, None), (16, 16, True, (4, 0)),
    (5, 11, False, (2, 3)),
])
def test_attended_pairs_matches_mask(sq, skv, causal, window):
    from attntune.kernels.masks import build_mask

    p = AttentionProblem(batch=1, heads_q=1, heads_kv=1, seqlen_q=sq, seqlen_kv=skv, head_dim=8, head_dim_v=8,
                         dtype="float32", causal=causal, window=window)
    m = build_mask(p, "cpu")
    expected = sq * skv if m is None else int(m.sum())
    assert p.attended_pairs() == expected
    assert p.flops() == 4 * 8 * expected


@pytest.mark.parametrize("window", [None, (100, 0), (-1, 3)])
def test_resized_equals_model_copy(window):
    """The runtime's fast copy for a new shape of a family is the same model as pydantic's copy: equal,
    same hash, same dump, same fields-set, still frozen; the original is untouched."""
    p = problem_from_tensors(torch.randn(2, 6, 3, 40), torch.randn(2, 3, 77, 40), torch.randn(2, 3, 77, 24),
                             causal=True, window=window)
    r = p.resized(5, 1, 1001)
    m = p.model_copy(update={"batch": 5, "seqlen_q": 1, "seqlen_kv": 1001})
    assert r == m and hash(r) == hash(m) and r.model_dump() == m.model_dump()
    assert r.__pydantic_fields_set__ == m.__pydantic_fields_set__
    assert (p.batch, p.seqlen_q, p.seqlen_kv) == (2, 3, 77)
    with pytest.raises(Exception):
        r.batch = 7  # frozen like any AttentionProblem


@pytest.mark.parametrize("b, sq, skv, causal, window, lens, align", [
    (1, 1, 300, False, (40, -1), False, "bottom_right"),   # a decode row in a window: 41 keys read, not 300
    (3, 1, 77, False, None, True, "bottom_right"),         # kv_lens decode: the timed lengths' keys
    (5, 1, 131, False, (20, -1), True, "bottom_right"),    # both
    (2, 6, 45, True, (9, 0), True, "bottom_right"),        # chunked prefill over a padded cache
    (2, 6, 45, True, (3, 2), True, "top_left"),
    (2, 17, 17, True, None, False, "bottom_right"),        # causal prefill: every key is read
    (1, 9, 4, True, None, False, "bottom_right"),          # more queries than keys: rows with no key
    (2, 5, 30, False, (0, 0), False, "top_left"),          # a diagonal: 5 keys of 30
])
def test_flops_and_bytes_count_what_the_mask_and_the_timed_lengths_admit(b, sq, skv, causal, window, lens, align):
    """Against the materialised mask of the timed ``kv_lens`` (kernels.masks, independent of problem.py's
    interval arithmetic): pairs = admitted entries, keys read = columns with any admitted entry."""
    from attntune.kernels.masks import build_mask

    p = AttentionProblem(batch=b, heads_q=4, heads_kv=2, seqlen_q=sq, seqlen_kv=skv, head_dim=8, head_dim_v=16,
                         dtype="float16", causal=causal, window=window, kv_lens=lens, causal_align=align)
    kv = torch.tensor(p.timed_kv_lens()) if lens else None
    m = build_mask(p, "cpu", kv)
    if m is None:
        m = torch.ones(sq, skv, dtype=torch.bool)
    if kv is not None:
        m = m[:, 0] & (torch.arange(skv)[None, None, :] < kv[:, None, None])  # [B, Sq, Skv]
    else:
        m = m.expand(b, sq, skv)
    pairs, keys = int(m.sum()), int(m.any(dim=1).sum())
    assert p.flops() == 4 * 4 * pairs * 12  # Hq=4, mean head dim (8 + 16) / 2
    q_o = b * 4 * sq * (8 + 16) * 2
    assert p.bytes_moved() == q_o + 2 * keys * (8 + 16) * 2
