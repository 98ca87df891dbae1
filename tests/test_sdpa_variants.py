"""The SDPA and eager variants against the float64 reference, with odd shapes, on the CPU."""

import pytest
import torch

from attntune.kernels import registry
from attntune.kernels.reference import reference_attention
from attntune.problem import problem_from_tensors

from helpers import assert_close, rand_qkv

CPU_VARIANTS = ["eager", "sdpa_default", "sdpa_flash", "sdpa_math"]
SHAPES = [  # b, hq, hkv, sq, skv, d
    (1, 2, 2, 1, 1, 16),
    (2, 4, 2, 3, 3, 80),
    (17, 2, 1, 15, 15, 32),
    (1, 8, 2, 97, 97, 64),
    (2, 3, 3, 1, 97, 96),    # decode-like
    (1, 4, 4, 97, 3, 80),    # more queries than keys
]


@pytest.mark.parametrize("name", CPU_VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(name, shape, causal, dtype):
    b, hq, hkv, sq, skv, d = shape
    q, k, v = rand_qkv(b, hq, hkv, sq, skv, d, dtype=dtype, seed=sum(shape))
    p = problem_from_tensors(q, k, v, causal=causal)
    var = registry.get(name)
    if var.supports(p):
        pytest.skip(f"{name}: {var.supports(p)}")
    out = var.run(q, k, v, p, var.space(p).first() if var.space(p).params else {})
    assert out.shape == (b, hq, sq, d) and out.dtype == dtype
    ref = reference_attention(q, k, v, p)
    assert_close(out, ref, p.dtype, what=f"{name} {shape} causal={causal}")


@pytest.mark.parametrize("name", CPU_VARIANTS)
@pytest.mark.parametrize("window", [(0, 0), (4, 0), (2, 3), (200, 0), (-1, 5)])
def test_windows_and_kv_lens(name, window):
    q, k, v = rand_qkv(3, 4, 2, 19, 29, 32, seed=7)
    kv_lens = torch.tensor([29, 1, 17], dtype=torch.int32)
    p = problem_from_tensors(q, k, v, causal=window[1] == 0, window=window, kv_lens=kv_lens)
    var = registry.get(name)
    out = var.run(q, k, v, p, {}, kv_lens)
    ref = reference_attention(q, k, v, p, kv_lens)
    assert_close(out, ref, "float32", what=f"{name} window={window}")


@pytest.mark.parametrize("name", ["eager", "sdpa_math", "sdpa_flash"])
def test_gradients_match_reference(name):
    q, k, v = rand_qkv(2, 4, 2, 13, 21, 24, requires_grad=True, seed=3)
    p = problem_from_tensors(q, k, v, causal=True)
    assert p.mode == "fwd_bwd"
    var = registry.get(name)
    out = var.run(q, k, v, p, {})
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(q64, k64, v64, p)
    rq, rk, rv = torch.autograd.grad(ref, (q64, k64, v64), g.double())
    for a, b_, what in ((dq, rq, "dq"), (dk, rk, "dk"), (dv, rv, "dv")):
        assert_close(a, b_, "float32", backward=True, what=f"{name} {what}")


def test_empty_rows_are_zero_not_nan():
    # bottom-right causal with more queries than keys: the first Sq-Skv rows see no key
    q, k, v = rand_qkv(1, 2, 2, 9, 4, 16)
    p = problem_from_tensors(q, k, v, causal=True)
    for name in CPU_VARIANTS:
        out = registry.get(name).run(q, k, v, p, {})
        assert torch.isfinite(out).all(), name
        assert out[:, :, :5].abs().max() == 0, name
        assert_close(out, reference_attention(q, k, v, p), "float32", what=name)


def test_gpu_only_backends_say_why_on_cpu():
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    p = problem_from_tensors(q, k, v)
    for name in ("sdpa_efficient", "sdpa_cudnn"):
        assert registry.get(name).supports(p) == ["needs a CUDA/ROCm device"]


def test_registry_names_unique_and_env_filters(monkeypatch):
    names = [v.name for v in registry.all_variants()]
    assert len(names) == len(set(names))
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 16)
    p = problem_from_tensors(q, k, v)
    monkeypatch.setenv("ATTNTUNE_VARIANTS", "eager, sdpa_math")
    assert sorted(c.name for c in registry.candidates(p)) == ["eager", "sdpa_math"]
    monkeypatch.delenv("ATTNTUNE_VARIANTS")
    monkeypatch.setenv("ATTNTUNE_TRITON", "0")
    assert all(c.family != "triton" for c in registry.candidates(p))


def test_forced_backends_restore_torchs_flags_when_two_threads_interleave(monkeypatch):
    """Thread A forces one backend and is inside torch's call when thread B forces another: without
    serialisation B saves A's temporary flags and restores them last, leaving the process with one backend
    for good (audit: plain torch SDPA then raised "No available kernel"). B must wait for A instead."""
    import threading
    from torch.nn.attention import SDPBackend

    from attntune.kernels import sdpa

    flags = lambda: [get() for _, get, _ in sdpa._FLAGS]  # noqa: E731
    before = flags()
    a_inside, b_inside, a_returned = threading.Event(), threading.Event(), threading.Event()

    def fake(q, k, v, **kw):
        if threading.current_thread().name == "A":
            a_inside.set()
            b_inside.wait(0.5)  # B entering now would be the race; with the lock it cannot
        else:
            b_inside.set()
            a_returned.wait(2.0)
        return q

    monkeypatch.setattr(sdpa, "_torch_sdpa", fake)
    q = torch.zeros(1, 1, 2, 4)

    def a():
        sdpa._sdpa_with(frozenset({SDPBackend.MATH, SDPBackend.FLASH_ATTENTION}), q, q, q, {})
        a_returned.set()

    def b():
        a_inside.wait(2.0)
        sdpa._sdpa_with(frozenset({SDPBackend.MATH}), q, q, q, {})

    ts = [threading.Thread(target=a, name="A"), threading.Thread(target=b, name="B")]
    [t.start() for t in ts]
    [t.join(5.0) for t in ts]
    assert flags() == before


def test_a_backend_the_user_switched_off_is_never_switched_back_on():
    from attntune.kernels import sdpa

    q, k, v = rand_qkv(1, 2, 2, 7, 7, 16)
    p = problem_from_tensors(q, k, v, causal=True)
    was = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        with pytest.raises(RuntimeError, match="FLASH_ATTENTION is switched off"):
            registry.get("sdpa_flash").run(q, k, v, p, {})
        out = registry.get("sdpa_math").run(q, k, v, p, {})
        assert not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        assert sdpa._FLAGS_LOCK.acquire(blocking=False)  # released
        sdpa._FLAGS_LOCK.release()
    finally:
        torch.backends.cuda.enable_flash_sdp(was)
    assert_close(out, reference_attention(q, k, v, p), "float32", what="sdpa_math with flash off")


def test_eager_masks_exactly_at_extreme_negative_scales_and_empty_rows_stay_finite():
    """Masked scores are -inf in the eager variant (the safe fallback, and the CPU's choice for causal
    calls with scale <= 0): a finite floor (-1e30) let masked keys outweigh admissible scores below it
    (audit: scale -1e30, row 0 attended to future keys). Rows without any admissible key stay zeros with
    finite gradients."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.ones(1, 1, 4, 8, dtype=torch.float64)
    v = torch.arange(4.0, dtype=torch.float64).view(1, 1, 4, 1).expand(1, 1, 4, 8).contiguous()
    p = problem_from_tensors(q, q, v, causal=True, scale=-1e30)
    out = registry.get("eager").run(q, q, v, p, {})
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q, q, v, is_causal=True, scale=-1e30)
    torch.testing.assert_close(out, ref)
    assert out[0, 0, :, 0].tolist() == [0.0, 0.5, 1.0, 1.5]
    # causal bottom-right with Sq > Skv: the first Sq - Skv rows see no key
    q, k, v = rand_qkv(2, 4, 2, 9, 5, 16, requires_grad=True, seed=5)
    p = problem_from_tensors(q, k, v, causal=True)
    out = registry.get("eager").run(q, k, v, p, {})
    assert out[:, :, :4].abs().max() == 0
    out.square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert q.grad[:, :, :4].abs().max() == 0
