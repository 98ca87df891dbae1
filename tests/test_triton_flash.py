"""Triton flash attention (``triton_flash`` / ``triton_local``) against the float64 reference.

On the CPU the kernels run under the Triton interpreter (conftest sets TRITON_INTERPRET=1) at small
shapes, with small blocks so that every shape spans several blocks and exercises the masked / unmasked
/ skipped block ranges. fp16 and fp32 only there: bf16 ``tl.dot`` returns garbage in the triton 3.9
interpreter. The ``gpu`` tests take realistic sizes, bf16, and walk every config of the declared space.
"""

from __future__ import annotations

import math

import pytest
import torch
from attntune.kernels import registry
from attntune.kernels.reference import masked_softmax_attention
from attntune.kernels.triton_flash import launch
from attntune.kernels.triton_flash.op import flash_attention
from attntune.kernels.triton_flash.config import FlashFwdConfig
from attntune.kernels.triton_flash.space import flash_space
from helpers import assert_close

from attntune.problem import problem_from_tensors
from attntune.tolerances import tf32_allowed

HAS_GPU = torch.cuda.is_available()
DEV = "cuda" if HAS_GPU else "cpu"
# small blocks on the CPU: many blocks per sequence at interpreter-friendly sizes
SMALL_FWD = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
SMALL_BWD = {"BWD_BLOCK_M": 16, "BWD_BLOCK_N": 32, "BWD_WARPS": 4, "BWD_STAGES": 1}


def _rand(shape, dtype, seed, device=DEV):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def check(
    q,
    k,
    v,
    *,
    causal=False,
    align="bottom_right",
    window=None,
    scale=None,
    config=None,
    bwd_config=None,
    grad=True,
    seed=0,
    ref_dtype=torch.float64,
):
    """Run the op (forward, LSE, and gradients for a random dO) and compare with the reference."""
    dtype = q.dtype
    q, k, v = (t.detach().requires_grad_(grad) for t in (q, k, v))
    out, lse = flash_attention(
        q,
        k,
        v,
        causal=causal,
        causal_align=align,
        window=window,
        scale=scale,
        config=config,
        bwd_config=bwd_config,
        return_lse=True,
    )
    assert out.shape == q.shape and out.dtype == dtype
    prob = problem_from_tensors(q, k, v, causal=causal, causal_align=align, window=window, scale=scale)
    rq, rk, rv = (t.detach().to(ref_dtype).requires_grad_(grad) for t in (q, k, v))
    ref, ref_lse = masked_softmax_attention(rq, rk, rv, prob, compute_dtype=ref_dtype, return_lse=True)
    dtype_name = str(dtype).replace("torch.", "")
    tf32 = dtype == torch.float32 and tf32_allowed() and q.is_cuda
    assert_close(out, ref.detach(), dtype_name, tf32=tf32, what=f"{dtype_name} output")
    # LSE: -inf exactly where the reference row is empty, close elsewhere
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "LSE: empty rows differ"
    fin = torch.isfinite(ref_lse)
    assert not torch.isnan(lse).any()
    exact = dtype == torch.float32 and not tf32  # TF32 scores carry ~1e-3 absolute error into the LSE
    torch.testing.assert_close(
        lse[fin].double(), ref_lse[fin].double(), atol=1e-4 if exact else 2e-2, rtol=1e-3
    )
    if not grad:
        return out
    do = _rand(out.shape, dtype, seed + 1, device=q.device)
    out.backward(do)
    ref.backward(do.to(ref_dtype))
    for name, got, want in (("dq", q.grad, rq.grad), ("dk", k.grad, rk.grad), ("dv", v.grad, rv.grad)):
        assert got.shape == want.shape
        assert_close(got, want, dtype_name, backward=True, tf32=tf32, what=name)
    return out


def qkv(b, hq, hkv, sq, skv, d, dtype=torch.float32, seed=0):
    return (
        _rand((b, hq, sq, d), dtype, seed),
        _rand((b, hkv, skv, d), dtype, seed + 10),
        _rand((b, hkv, skv, d), dtype, seed + 20),
    )


# ---- semantics on small shapes (CPU interpreter or GPU) -----------------------------------------
CASES = [
    # id, (B, Hq, Hkv, Sq, Skv, D), kwargs
    ("dense", (1, 2, 2, 37, 37, 32), {}),
    ("causal-sq<skv", (1, 2, 2, 20, 45, 24), {"causal": True}),
    ("causal-sq>skv-empty-rows", (1, 2, 2, 45, 20, 24), {"causal": True}),
    ("causal-top-left-sq>skv", (1, 2, 2, 45, 20, 16), {"causal": True, "align": "top_left"}),
    ("causal-top-left-sq<skv", (1, 2, 2, 20, 45, 16), {"causal": True, "align": "top_left"}),
    ("window-local-l0", (2, 2, 1, 50, 50, 16), {"window": (7, 0)}),
    ("window-two-sided", (1, 2, 1, 50, 61, 16), {"window": (5, 3)}),
    ("window-diag-only", (1, 2, 2, 33, 33, 16), {"window": (0, 0)}),
    ("window-wider-than-seq", (1, 2, 1, 40, 50, 16), {"window": (100, 100), "causal": True}),
    ("window-left-unbounded", (1, 2, 2, 40, 40, 16), {"window": (-1, 4)}),
    ("window-right-unbounded", (1, 2, 2, 40, 40, 16), {"window": (4, -1)}),
    (
        "window+causal-top-left",
        (1, 2, 2, 30, 50, 16),
        {"window": (6, 3), "causal": True, "align": "top_left"},
    ),
    ("window-rows-beyond-keys", (1, 2, 1, 30, 10, 16), {"window": (2, 0)}),
    ("window-before-first-key", (1, 2, 2, 40, 8, 16), {"window": (3, 1), "align": "top_left"}),
    ("gqa-4:1", (2, 8, 2, 33, 40, 16), {"causal": True}),
    ("mqa", (1, 4, 1, 29, 29, 16), {"window": (9, 0)}),
    ("seqlen-1", (1, 2, 2, 1, 1, 16), {"causal": True}),
    ("seqlen-1x97", (1, 2, 1, 1, 97, 16), {"causal": True}),
    ("seqlen-3", (2, 2, 2, 3, 3, 16), {"causal": True}),
    ("seqlen-97-causal", (1, 2, 2, 97, 97, 16), {"causal": True}),
    ("seqlen-97x3", (1, 2, 2, 97, 3, 16), {}),
    ("seqlen-2", (1, 1, 1, 2, 2, 16), {"window": (1, 0)}),
    ("head-dim-80", (1, 2, 2, 33, 33, 80), {"causal": True}),
    ("head-dim-96", (1, 2, 1, 21, 40, 96), {"window": (8, 0)}),
    ("head-dim-40", (1, 2, 2, 19, 19, 40), {}),
    ("scale", (1, 2, 2, 30, 30, 16), {"scale": 0.3, "causal": True}),
    ("negative-scale", (1, 2, 2, 30, 30, 16), {"scale": -0.2}),
]


@pytest.mark.parametrize("shape,kw", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_forward_backward_fp32(shape, kw):
    check(*qkv(*shape), config=SMALL_FWD, bwd_config=SMALL_BWD, **kw)


@pytest.mark.parametrize(
    "shape,kw",
    [
        ((1, 2, 2, 37, 45, 32), {"causal": True}),
        ((1, 4, 1, 50, 50, 64), {"window": (11, 0)}),
        ((1, 2, 2, 97, 97, 80), {}),
    ],
    ids=["causal", "mqa-window", "d80"],
)
def test_forward_backward_fp16(shape, kw):
    check(*qkv(*shape, dtype=torch.float16), config=SMALL_FWD, bwd_config=SMALL_BWD, **kw)


def test_default_configs():
    """The op's own defaults (large blocks: one partial block per sequence here)."""
    check(*qkv(1, 2, 1, 70, 90, 64), causal=True)
    check(*qkv(1, 2, 2, 70, 70, 128, dtype=torch.float16), window=(20, 0))


def test_bf16_forward():
    if not HAS_GPU:
        pytest.skip("bf16 tl.dot returns garbage in the triton interpreter (CPU); covered by gpu tests")
    check(
        *qkv(1, 2, 2, 70, 70, 64, dtype=torch.bfloat16), causal=True, config=SMALL_FWD, bwd_config=SMALL_BWD
    )


def test_noncontiguous_inputs():
    """q/k/v as transposes of [B, S, H, D] and a sliced head dim: strides go in as they are."""
    b, s, h, d = 2, 37, 4, 32
    q = _rand((b, s, h, d), torch.float32, 1).transpose(1, 2)
    k = _rand((b, s, 2, d), torch.float32, 2).transpose(1, 2)
    v = _rand((b, s, 2, d + 8), torch.float32, 3).transpose(1, 2)[..., 4 : 4 + d]
    assert not q.is_contiguous() and not v.is_contiguous()
    out = check(q, k, v, causal=True, config=SMALL_FWD, bwd_config=SMALL_BWD)
    assert out.stride() == q.stride()  # the output keeps the [B, S, H, D] layout


def test_expanded_kv_stride_zero():
    """K/V broadcast over the batch with stride 0 (no copy)."""
    q = _rand((3, 2, 20, 16), torch.float32, 1)
    k = _rand((1, 2, 25, 16), torch.float32, 2).expand(3, 2, 25, 16)
    v = _rand((1, 2, 25, 16), torch.float32, 3).expand(3, 2, 25, 16)
    check(q, k, v, causal=True, config=SMALL_FWD, grad=False)


def _nan_framed(t: torch.Tensor, pad_s: int, pad_d: int) -> torch.Tensor:
    """A view equal to ``t`` inside a NaN-filled buffer larger along S and D."""
    b, h, s, d = t.shape
    big = torch.full((b, h, s + pad_s, d + pad_d), float("nan"), dtype=t.dtype, device=t.device)
    big[:, :, :s, :d] = t
    return big[:, :, :s, :d]


def test_padding_never_leaks_and_every_output_is_written(monkeypatch):
    """Inputs framed by NaN (any read past Sq/Skv/D poisons the result) and every buffer the kernels
    allocate filled with NaN first (any element left unwritten shows up)."""
    nan = float("nan")
    monkeypatch.setattr(launch, "_empty_like", lambda t: torch.full_like(t, nan))
    monkeypatch.setattr(launch, "_empty", lambda *a, **kw: torch.full(*a, nan, **kw))
    q, k, v = qkv(1, 4, 2, 45, 21, 40)  # D=40 pads to 64; 45/21 are not block multiples
    q, k, v = _nan_framed(q, 7, 24), _nan_framed(k, 11, 24), _nan_framed(v, 11, 24)
    for kw in ({"causal": True}, {"window": (3, 0)}, {}):  # causal: rows 0..23 are empty
        check(q, k, v, config=SMALL_FWD, bwd_config=SMALL_BWD, **kw)


def test_empty_rows_give_zeros_and_zero_gradients():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 2, 30, 10, 16))
    out, lse = flash_attention(
        q, k, v, causal=True, config=SMALL_FWD, bwd_config=SMALL_BWD, return_lse=True
    )  # rows 0..19 see no key (off = -20)
    assert torch.equal(out[:, :, :20], torch.zeros_like(out[:, :, :20]))
    assert torch.isneginf(lse[:, :, :20]).all() and torch.isfinite(lse[:, :, 20:]).all()
    out.sum().backward()
    assert torch.equal(q.grad[:, :, :20], torch.zeros_like(q.grad[:, :, :20]))
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


def test_empty_sequences():
    q, k, v = qkv(1, 2, 2, 0, 5, 16)
    assert flash_attention(q, k, v).shape == (1, 2, 0, 16)
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 2, 4, 0, 16))
    out = flash_attention(q, k, v)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))


def test_backward_is_deterministic():
    q, k, v = qkv(1, 8, 2, 40, 40, 16)
    grads = []
    for _ in range(2):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        flash_attention(
            qq, kk, vv, causal=True, config=SMALL_FWD, bwd_config=SMALL_BWD
        ).square().sum().backward()
        grads.append((qq.grad, kk.grad, vv.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_input_errors():
    q, k, v = qkv(1, 4, 2, 8, 8, 16)
    with pytest.raises(ValueError, match="head_dim"):
        flash_attention(q, k, v[..., :8])
    with pytest.raises(ValueError, match="multiple"):
        flash_attention(q, k[:, :1].expand(1, 3, 8, 16), v[:, :1].expand(1, 3, 8, 16))
    with pytest.raises(ValueError, match="dtype"):
        flash_attention(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="window"):
        flash_attention(q, k, v, window=(-2, 0))
    with pytest.raises(ValueError, match="causal_align"):
        flash_attention(q, k, v, causal=True, causal_align="middle")


def test_dot_precision_follows_float32_matmul_precision(monkeypatch):
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert launch.dot_precision(torch.float32) == "ieee"
        torch.set_float32_matmul_precision("high")
        assert launch.dot_precision(torch.float32) == "tf32"
        monkeypatch.setattr(torch.version, "hip", "6.0")
        assert launch.dot_precision(torch.float32) == "ieee"
    finally:
        torch.set_float32_matmul_precision(old)


def test_mask_args_fold_causal_into_the_window():
    m = launch.mask_args(10, 30, True, "bottom_right", None)
    assert (m.diag_off, m.has_left, m.has_right, m.win_right) == (20, False, True, 0)
    m = launch.mask_args(10, 30, True, "top_left", (5, 7))
    assert (m.diag_off, m.win_left, m.win_right, m.has_left) == (0, 5, 0, True)
    m = launch.mask_args(10, 30, False, "bottom_right", (-1, 3))
    assert (m.has_left, m.has_right, m.win_right) == (False, True, 3)


# ---- variants -------------------------------------------------------------------------------
def _problem(**kw):
    q, k, v = qkv(1, 4, 2, 40, 40, 32)
    return problem_from_tensors(q, k, v, **kw)


def test_variants_registered_with_reasons(monkeypatch):
    flash, local = registry.get("triton_flash"), registry.get("triton_local")
    assert flash.family == local.family == "triton"
    assert "attntune.kernels.triton_flash.jit_fwd" in flash.source_modules
    assert flash.supports(_problem()) == []
    assert local.supports(_problem()) and local.supports(_problem(window=(8, 0))) == []
    assert local.supports(_problem(causal=True, window=(-1, 4)))  # no finite left window
    assert any("kv_lens" in r for r in flash.supports(_problem().model_copy(update={"kv_lens": True})))
    big = _problem().model_copy(update={"head_dim": 320, "head_dim_v": 320})
    assert any("head_dim" in r for r in flash.supports(big))
    assert any("head_dim_v" in r for r in flash.supports(_problem().model_copy(update={"head_dim_v": 16})))
    assert any("float64" in r for r in flash.supports(_problem().model_copy(update={"dtype": "float64"})))
    assert flash.supports(_problem().model_copy(update={"approx": True})) == []
    from attntune.kernels import triton_common

    monkeypatch.setattr(triton_common, "HAS_TRITON", False)  # both Triton ops' device reasons read it
    assert any("triton is not installed" in r for r in flash.supports(_problem()))
    assert any("triton is not installed" in r for r in registry.get("triton_decode").supports(_problem()))
    monkeypatch.undo()
    if not HAS_GPU:
        monkeypatch.delenv("TRITON_INTERPRET")
        assert any("CUDA" in r for r in flash.supports(_problem()))


def test_space_is_modest_and_holds_the_hopper_configs():
    p = _problem().model_copy(update={"dtype": "bfloat16", "head_dim": 128, "head_dim_v": 128})
    s = flash_space(p)
    grid = list(s.grid())
    assert 10 <= len(grid) <= 150  # x3 since LOADS (pointer / descriptor / warp-specialized) on sm_90
    for cfg in (
        {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "LOADS": 0},
        {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "LOADS": 1},
    ):
        assert s.validate(cfg) == [], cfg
    assert s.validate({"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4, "LOADS": 0})  # > 227 KB
    d256 = flash_space(p.model_copy(update={"head_dim": 256, "head_dim_v": 256}))
    assert d256.validate({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "LOADS": 2}) == []
    train = flash_space(p.model_copy(update={"mode": "fwd_bwd"}))
    assert {"BWD_BLOCK_M", "BWD_BLOCK_N", "BWD_WARPS", "BWD_STAGES"} <= set(train.names)
    assert "BWD_BLOCK_M" not in s.names
    assert len(list(train.grid())) <= 700  # 4 backward stage counts (3-4 won on the H200) since session 11
    for prob in (p, train and p.model_copy(update={"mode": "fwd_bwd"})):
        for d in (16, 64, 80, 96, 128, 160, 256):
            for dt in ("float16", "bfloat16", "float32"):
                sp = flash_space(prob.model_copy(update={"head_dim": d, "head_dim_v": d, "dtype": dt}))
                assert sp.validate(sp.default) == [], (d, dt, prob.mode)


def test_variant_run_is_differentiable():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 40, 40, 32))
    for name, kw in (("triton_flash", {"causal": True}), ("triton_local", {"window": (9, 0)})):
        var = registry.get(name)
        prob = problem_from_tensors(q, k, v, **kw)
        assert prob.mode == "fwd_bwd"
        cfg = var.space(prob).first()
        out = var.run(q, k, v, prob, cfg)
        ref = masked_softmax_attention(q.double(), k.double(), v.double(), prob, compute_dtype=torch.float64)
        assert_close(out, ref, "float32")
        out.sum().backward()
        assert torch.isfinite(q.grad).all()
        q.grad = k.grad = v.grad = None


def _sample(grid, n):
    """A deterministic, evenly spread subset of a grid (the interpreter is too slow for all of it)."""
    grid = list(grid)
    step = max(1, math.ceil(len(grid) / n))
    return grid[::step]


@pytest.mark.parametrize(
    "shape,kw",
    [
        ((1, 4, 2, 45, 70, 40), {"causal": True}),
        ((1, 2, 1, 33, 33, 16), {"window": (5, 2)}),
    ],
    ids=["gqa-causal-odd", "window"],
)
def test_declared_space_configs_are_valid(shape, kw):
    """Configs of the declared space (a spread sample on the CPU, all of them on a GPU) compute the
    right result on awkward shapes. Forward and backward configs launch independently, so each
    forward config and each distinct backward config is walked once."""
    # fp16 on the GPU (the configs are meant for tensor cores; exact-fp32 dots take minutes to compile
    # for the large blocks), fp32 on the CPU (interpreter)
    q, k, v = qkv(*shape, dtype=torch.float16 if HAS_GPU else torch.float32)
    prob = problem_from_tensors(q, k, v, mode="fwd_bwd", **kw)
    space = registry.get("triton_flash").space(prob)
    fwd_space = registry.get("triton_flash").space(prob.model_copy(update={"mode": "fwd"}))
    fwd_cfgs = list(fwd_space.grid())
    bwd_cfgs = sorted({tuple((n, c[n]) for n in c if n.startswith("BWD")) for c in space.grid()})
    if not HAS_GPU:
        fwd_cfgs, bwd_cfgs = _sample(fwd_cfgs, 6), _sample(bwd_cfgs, 4)
    assert set(FlashFwdConfig.names()) <= set(fwd_cfgs[0])
    for cfg in fwd_cfgs:
        check(q, k, v, config=cfg, grad=False, **kw)
    for bcfg in bwd_cfgs:
        check(q, k, v, config=SMALL_FWD if not HAS_GPU else None, bwd_config=dict(bcfg), **kw)


# ---- GPU: realistic sizes, bf16, every config ---------------------------------------------------
GPU_CASES = [
    ("dense-d128", (2, 16, 16, 2048, 2048, 128), {}),
    ("causal-d64", (2, 16, 16, 4096, 4096, 64), {"causal": True}),
    ("gqa8-causal", (1, 32, 4, 2048, 2048, 128), {"causal": True}),
    ("window-local", (1, 16, 16, 4096, 4096, 128), {"window": (1024, 0)}),
    ("window-gqa-odd", (2, 16, 2, 1025, 1025, 128), {"window": (255, 0)}),
    ("causal-sq<skv-odd", (1, 8, 8, 1025, 3000, 64), {"causal": True}),
    ("d96-top-left", (1, 8, 8, 1500, 1000, 96), {"causal": True, "align": "top_left"}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,kw", [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_gpu_realistic(shape, kw, dtype):
    check(*qkv(*shape, dtype=dtype), ref_dtype=torch.float32, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_gpu_fp32(precision):
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        # D=40 (padded to 64 in the tiles) and odd lengths: under "highest" the fp32 dots are FMA loops
        # and D=128 took 77 s to compile (the GPU suite's second-longest item); "high" is TF32
        d = 40 if precision == "highest" else 128
        check(*qkv(1, 3, 3, 517, 611, d), causal=True)
    finally:
        torch.set_float32_matmul_precision(old)


def _gpu_config_cases():
    """One test item per config (so that pytest-xdist compiles them in parallel): every forward
    config and every distinct backward config of the declared space, for three head dims."""
    if not HAS_GPU:
        reason = "needs a CUDA GPU: one case per config of the GPU's declared space"
        return [pytest.param(None, None, None, None, marks=pytest.mark.skip(reason=reason), id="no-gpu")]
    from attntune.problem import AttentionProblem

    out = []
    for d, dt in ((128, "bfloat16"), (64, "float16"), (256, "bfloat16")):
        prob = AttentionProblem(
            batch=1,
            heads_q=4,
            heads_kv=2,
            seqlen_q=1025,
            seqlen_kv=1100,
            head_dim=d,
            head_dim_v=d,
            dtype=dt,
            device_type="cuda",
            causal=True,
            mode="fwd_bwd",
        )
        for cfg in flash_space(prob.model_copy(update={"mode": "fwd"})).grid():
            out.append(pytest.param(d, dt, cfg, None, id=f"d{d}-fwd-" + "-".join(map(str, cfg.values()))))
        bwd = sorted({tuple((n, c[n]) for n in c if n.startswith("BWD")) for c in flash_space(prob).grid()})
        for b in bwd:
            out.append(pytest.param(d, dt, None, dict(b), id=f"d{d}-bwd-" + "-".join(str(x[1]) for x in b)))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("d,dtype,cfg,bcfg", _gpu_config_cases())
def test_gpu_every_config_valid(d, dtype, cfg, bcfg):
    q, k, v = qkv(1, 4, 2, 1025, 1100, d, dtype=getattr(torch, dtype))
    check(q, k, v, causal=True, config=cfg, bwd_config=bcfg, grad=bcfg is not None, ref_dtype=torch.float32)


# ---- tensor-descriptor (TMA) loads: FlashFwdConfig.LOADS -------------------------------------------
DESC_CASES = [
    # id, (B, Hq, Hkv, Sq, Skv, D), dtype, kwargs — odd lengths (descriptor zero fill / clipped stores
    # past the sequence), D padded to the block (80 -> 128), GQA, windows, empty rows
    ("gqa-causal-d80", (2, 4, 2, 37, 53, 80), torch.float32, {"causal": True}),
    ("window-fp16", (1, 2, 1, 70, 70, 64), torch.float16, {"causal": True, "window": (20, 0)}),
    ("sq>skv-empty-rows", (1, 2, 2, 45, 20, 32), torch.float32, {"causal": True}),
    ("two-sided-window", (2, 2, 2, 33, 47, 16), torch.float32, {"window": (5, 9)}),
]


@pytest.mark.parametrize("loads", [1, 2])
@pytest.mark.parametrize("name,shape,dtype,kw", DESC_CASES, ids=[c[0] for c in DESC_CASES])
def test_descriptor_loads_match_the_reference_and_pointer_loads(loads, name, shape, dtype, kw):
    b, hq, hkv, sq, skv, d = shape
    q, k, v = qkv(b, hq, hkv, sq, skv, d, dtype=dtype)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # HF's [B, S, H, D] layout seen as [B, H, S, D]
    assert launch.descriptor_ok(q) and launch.descriptor_ok(k)
    cfg = dict(SMALL_FWD, LOADS=loads)
    out = check(q, k, v, config=cfg, grad=False, **kw)
    ptr = flash_attention(q, k, v, config=SMALL_FWD, **{n: x for n, x in kw.items()})
    torch.testing.assert_close(out, ptr, atol=1e-6, rtol=1e-5)


def test_descriptor_loads_fall_back_to_pointers_where_tma_cannot_read(monkeypatch):
    """Expanded (stride-0) K/V and rows that are not a multiple of 16 bytes (D=20 in fp16: 40 bytes)
    cannot be described: the launch takes pointer loads, with the same results."""
    taken = []
    real = launch._descriptors
    monkeypatch.setattr(launch, "_descriptors", lambda *a: taken.append(real(*a)) or taken[-1])
    q, k, v = qkv(1, 2, 1, 19, 23, 32)
    ke, ve = k.expand(1, 2, 23, 32), v.expand(1, 2, 23, 32)
    assert not launch.descriptor_ok(ke)
    check(q, ke, ve, causal=True, config=dict(SMALL_FWD, LOADS=1), grad=False)
    q2, k2, v2 = qkv(1, 2, 2, 19, 23, 20, dtype=torch.float16)
    assert not launch.descriptor_ok(q2)
    check(q2, k2, v2, causal=True, config=dict(SMALL_FWD, LOADS=1), grad=False)
    q3, k3, v3 = qkv(1, 2, 2, 19, 23, 32)
    check(q3, k3, v3, causal=True, config=dict(SMALL_FWD, LOADS=1), grad=False)
    assert [t is not None for t in taken] == [False, False, True]


def test_descriptor_loads_are_a_hopper_knob_of_forward_keys_only():
    from attntune.kernels.triton_flash.config import FlashTrainConfig
    from attntune.kernels.triton_flash.space import constraint_reasons

    cfg = FlashFwdConfig(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2, LOADS=2)
    assert constraint_reasons(cfg, 128, torch.bfloat16, "sm_90") == []
    assert constraint_reasons(FlashFwdConfig(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2, LOADS=1), 128,
                              torch.bfloat16, "sm_90") == []
    # the warp-specialized loop takes 8 warps (4 failed to compile on the H200 with Triton 3.6)
    four = FlashFwdConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, LOADS=2)
    assert constraint_reasons(four, 128, torch.bfloat16, "sm_90") == ["LOADS=2 (warp-specialized key loop) takes 8 warps"]
    for arch in ("sm_80", "sm_89", "gfx9"):
        assert any("LOADS" in r for r in constraint_reasons(cfg, 128, torch.bfloat16, arch)), arch
    assert dict(FlashFwdConfig.knobs(False))["LOADS"].choices == (0, 1, 2)
    assert dict(FlashTrainConfig.knobs(False))["LOADS"].choices == (0,)
    assert FlashTrainConfig(LOADS=0).forward.LOADS == 0
    with pytest.raises(ValueError, match="LOADS"):
        FlashFwdConfig.from_dict({"LOADS": 3}, rocm=False)


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_fp32_forward_copies_v_keys_contiguous_only_for_tf32(precision, monkeypatch):
    """TF32 (like FP8) wgmma needs the PV dot's B operand K-major: with TF32 allowed the launch stores V
    keys-contiguous (a copy), with exact fp32 dots it does not; either way one logical V gives one output."""
    from attntune.kernels.triton_flash import launch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        assert launch.v_keys_contiguous(torch.float32, fp8=False) == (precision == "high")
        assert not launch.v_keys_contiguous(torch.bfloat16, fp8=False)
        assert launch.v_keys_contiguous(torch.bfloat16, fp8=True)
        q, k, v = qkv(1, 2, 1, 19, 37, 24)
        copies = []
        real = launch._keys_contiguous_copy
        monkeypatch.setattr(launch, "_keys_contiguous_copy", lambda t: copies.append(t.shape) or real(t))
        a = flash_attention(q, k, v, causal=True, config={"BLOCK_M": 16, "BLOCK_N": 16})
        monkeypatch.setattr(launch, "_keys_contiguous_copy", real)
        assert bool(copies) == (precision == "high"), copies
        b = flash_attention(q, k, v.transpose(2, 3).contiguous().transpose(2, 3), causal=True,
                            config={"BLOCK_M": 16, "BLOCK_N": 16})
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    finally:
        torch.set_float32_matmul_precision(old)


TF32_CASES = ["causal-sq>skv-empty-rows", "causal-top-left-sq<skv", "window-two-sided", "window-before-first-key",
              "gqa-4:1", "mqa", "seqlen-1x97", "head-dim-40", "negative-scale"]


@pytest.mark.parametrize("shape,kw", [c[1:] for c in CASES if c[0] in TF32_CASES], ids=TF32_CASES)
def test_forward_backward_tf32_copies(shape, kw, monkeypatch):
    """With TF32 allowed the forward copies V keys-contiguous and the backward reads three of its B tiles
    from row/key-contiguous copies of q, dO and k (jit_bwd's ALT_B): outputs and gradients match the
    reference, and equal those of the launches without the copies (in the interpreter, where TF32 dots are
    exact float32, to the bit)."""
    from attntune.kernels.triton_flash import launch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        assert launch.tf32_b_copies(torch.float32) and not launch.tf32_b_copies(torch.bfloat16)
        q, k, v = qkv(*shape)
        check(q, k, v, config=SMALL_FWD, bwd_config=SMALL_BWD, **kw)

        def grads():
            qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            out = flash_attention(qq, kk, vv, causal=kw.get("causal", False), causal_align=kw.get("align", "bottom_right"),
                                  window=kw.get("window"), scale=kw.get("scale"), config=SMALL_FWD, bwd_config=SMALL_BWD)
            out.backward(torch.ones_like(out) * 0.37)
            return [out.detach()] + [t.grad for t in (qq, kk, vv)]

        with_copies = grads()
        monkeypatch.setattr(launch, "TF32_B_COPIES", False)
        monkeypatch.setattr(launch, "TF32_V_KEYS", False)
        for a, b in zip(with_copies, grads()):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    finally:
        torch.set_float32_matmul_precision(old)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values in a buffer whose data pointer is one element past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    return buf.view(t.shape).copy_(t)


def _wide_rows(t: torch.Tensor, pad: int = 8) -> torch.Tensor:
    """The same values with a row stride of D + pad elements (not a multiple of 16 for pad = 8)."""
    out = torch.empty(*t.shape[:-1], t.shape[-1] + pad, dtype=t.dtype, device=t.device)[..., : t.shape[-1]]
    return out.copy_(t)


@pytest.mark.gpu
def test_gpu_fast_launch_keys_every_specialization():
    """After its first launch of a specialization, each flash kernel launches through the compiled kernel's
    launcher (``FastKernel``), found by a key of everything Triton specializes on. One config serves calls
    that differ in one such thing at a time — pointer alignment, a stride's divisibility, a length or group of
    1, a length divisible by 16 or not, the mask's constexprs — each checked against the reference: a key that
    missed one would run a kernel compiled for another specialization (wrong values or a fault)."""
    cfg = FlashFwdConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    bcfg = {"BWD_BLOCK_M": 32, "BWD_BLOCK_N": 64, "BWD_WARPS": 4, "BWD_STAGES": 2}
    dt = torch.bfloat16
    base = qkv(2, 4, 2, 208, 208, 64, dtype=dt)
    kernels = (launch._FWD, launch._PRE, launch._DKDV, launch._DQ)
    for fk in kernels:
        fk.clear()  # count this test's keys only
    cases = [
        ("base", base, {}),
        ("repeat", qkv(2, 4, 2, 208, 208, 64, dtype=dt, seed=3), {}),
        ("q misaligned", (_misaligned(base[0]), *base[1:]), {}),
        ("k/v misaligned", (base[0], _misaligned(base[1]), _misaligned(base[2])), {}),
        ("row stride 72", tuple(_wide_rows(t) for t in base), {}),
        ("group 1", qkv(2, 2, 2, 208, 208, 64, dtype=dt), {}),
        ("lengths 197/203", qkv(2, 4, 2, 197, 203, 64, dtype=dt), {}),
        ("one query row", qkv(2, 4, 2, 1, 208, 64, dtype=dt), {"causal": True}),
        ("batch 1, one head per group", qkv(1, 1, 1, 208, 208, 64, dtype=dt), {}),
        ("causal", base, {"causal": True}),
        ("window", base, {"window": (37, 0)}),
        ("base again", base, {}),
    ]
    for name, (q, k, v), kw in cases:
        try:
            check(q, k, v, config=cfg, bwd_config=bcfg, ref_dtype=torch.float32, **kw)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e
        if name == "repeat":  # same specialization: the kept kernels launched, no new key
            assert [len(fk._compiled) for fk in kernels] == [1, 1, 1, 1]
    assert all(fk.direct for fk in kernels)
    assert len(launch._FWD._compiled) == len(cases) - 2  # every case but the two repeats specialized anew


def test_fast_kernel_integer_classes_and_alignment():
    """The key pieces FastKernel's callers build (:mod:`attntune.kernels.triton_launch`): Triton's classes of
    integer arguments (1; divisible by 16, zero and negative multiples included; neither) with a 64-bit marker
    for a value outside int32 at either end, the same answer from the memo, and pointer alignment (None kept)."""
    from attntune.kernels import triton_launch
    from attntune.kernels.triton_launch import aligned, int_class, int_classes

    triton_launch._CLASSES.clear()  # the memo may be full after other tests (it stops at _CLASSES_MAX)
    xs = (1, 0, 16, -32, 7, -3, 4096)
    assert int_classes(*xs) == (1, 16, 16, 16, 0, 0, 16) == tuple(int_class(x) for x in xs)
    assert int_classes(*xs) is int_classes(*xs)  # memoised
    assert int_classes(5, 2**31) == (0, 16, 64) and int_classes(-(2**31) - 1) == (0, 64)
    t = torch.zeros(64, dtype=torch.float16)
    assert aligned(t, None, t[1:], t[8:]) == (True, None, False, True)


@pytest.mark.gpu
def test_gpu_flash_attention_under_torch_compile():
    """``flash_attention`` called inside a torch.compile'd function: Inductor fails to re-compile this
    kernel when it traces it (Triton 3.6, torch 2.11, H100: a CompilationError in the forward's key loop, with
    the launch code of before and after FastKernel alike), so the call runs eagerly behind a graph break; its
    forward and backward match plain eager calls (whose second launch is FastKernel's direct one)."""
    cfg = FlashFwdConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    q, k, v = (t.requires_grad_() for t in qkv(2, 4, 2, 133, 141, 64, dtype=torch.bfloat16))

    def f(q, k, v):
        return flash_attention(q, k, v, causal=True, window=(40, 0), config=cfg)

    outs = []
    for fn in (f, f, torch.compile(f)):  # eager twice: the second launch is the direct one
        o = fn(q, k, v)
        o.float().square().sum().backward()
        outs.append([o.detach()] + [t.grad.clone() for t in (q, k, v)])
        q.grad = k.grad = v.grad = None
    for a, b in zip(outs[1], outs[2]):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def spy_launches(monkeypatch, name: str = "_FWD") -> list[dict]:
    """The arguments, by the kernel's parameter names, of every launch of ``launch.<name>`` (a FastKernel:
    every argument positional, constexprs included) while the test runs."""
    real = getattr(launch, name)
    seen = []

    def spy(key, grid, args, *rest):
        seen.append(dict(zip(real.fn.arg_names, args)))
        return real(key, grid, args, *rest)

    monkeypatch.setattr(launch, name, spy)
    return seen


@pytest.mark.parametrize("loads", [1, 2])
@pytest.mark.parametrize("skv", [53, 64])
def test_descriptor_loads_read_a_keys_contiguous_v_through_its_transpose(loads, skv, monkeypatch):
    """TF32 copies V keys-contiguous (FP8 too: tests/test_fp8_prefill.py); with descriptor loads the copy is
    described as the [B, Hkv, D, Skv] tensor it is (jit_fwd's V_T; rows padded to 16 bytes so any length
    qualifies) instead of falling back to pointer loads: same output as pointer loads."""
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    launches = spy_launches(monkeypatch)
    q, k, v = qkv(1, 4, 2, 37, skv, 32)
    desc = flash_attention(q, k, v, causal=True, window=(20, 0), config=dict(SMALL_FWD, LOADS=loads))
    ptr = flash_attention(q, k, v, causal=True, window=(20, 0), config=SMALL_FWD)
    torch.testing.assert_close(desc, ptr, atol=1e-6, rtol=1e-5)
    assert [(a["DESC"], a["V_T"]) for a in launches] == [(True, True), (False, False)]
    # the padded copy: logical shape and values of V, keys-contiguous, row stride a multiple of 16 bytes
    c = launch._keys_contiguous_copy(v)
    assert launch.v_transposed(c) and torch.equal(c, v) and (c.stride(3) * 4) % 16 == 0
