"""The flash forward over FP8 K/V (kernels/triton_flash with ``k_scale``/``v_scale``): both dots on FP8
tensor cores, q quantised per row and P with a fixed scale inside the kernel.

Compared with the float64 reference over the *dequantised* K/V (codes * scales): the only error left is
the kernel's own quantisation of q and P, bounded by :data:`attntune.tolerances.FP8_FWD` (per K/V format),
in units of each kv head's value scale (heads of very different magnitude: per-head scales matter). On
the CPU the kernel runs under the Triton interpreter, whose FP8 dots are exact; the ``gpu`` tests add
serving shapes and descriptor loads.
"""

from __future__ import annotations

import pytest
import torch

from attntune import fp8
from attntune.kernels.reference import reference_attention
from attntune.kernels.triton_flash.op import flash_attention
from attntune.problem import AttentionProblem, dtype_name
from attntune.tolerances import FP8_FWD
from helpers import rand_qkv

HAS_GPU = torch.cuda.is_available()
DEV = "cuda" if HAS_GPU else "cpu"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _case(b, hq, hkv, sq, skv, d, dtype=torch.float16, per="head", fmt=E4M3, seed=0):
    q, k, v = rand_qkv(b, hq, hkv, sq, skv, d, dtype=torch.float32, device=DEV, seed=seed)
    # heads of very different magnitude (per-head scales matter), scores still of unit size: k's heads are
    # scaled by m and their query heads by 1/m (FP8 rounds each score by ~2^-4 of its size, so scores of
    # size 10 would move softmax weights by tens of percent whatever the kernel)
    mag = torch.logspace(-2, 2, hkv, device=DEV).view(1, hkv, 1, 1)
    q = q / mag.repeat_interleave(hq // hkv, dim=1)
    k8, v8, ks, vs = fp8.quantize_kv(k * mag, v * mag.flip(1), per=per, dtype=fmt)
    return q.to(dtype), k8, v8, ks, vs


def _problem(q, k, causal, window):
    return AttentionProblem(batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1], seqlen_q=q.shape[2],
                            seqlen_kv=k.shape[2], head_dim=q.shape[3], head_dim_v=k.shape[3],
                            dtype=dtype_name(q.dtype), device_type=q.device.type, causal=causal, window=window)


def _check(q, k8, v8, ks, vs, causal=False, window=None, config=None):
    out = flash_attention(q, k8, v8, causal=causal, window=window, config=config, k_scale=ks, v_scale=vs)
    kd, vd = fp8.dequantize(k8, ks), fp8.dequantize(v8, vs)
    ref = reference_attention(q.double(), kd.double(), vd.double(), _problem(q, k8, causal, window))
    assert out.dtype == q.dtype and out.shape == q.shape and torch.isfinite(out.float()).all()
    # in units of each kv head's value spread (the tolerances are for unit-sized values, as the gate's are)
    unit = vd.double().std(dim=(0, 2, 3)).repeat_interleave(q.shape[1] // k8.shape[1]).view(1, -1, 1, 1)
    err = ((out.double() - ref) / unit).abs()
    atol, rtol = FP8_FWD[str(k8.dtype).removeprefix("torch.")]
    assert (err <= atol + rtol * (ref / unit).abs()).all(), float(err.max())
    return out, float(err.max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("per", ["head", "tensor"])
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, (9, 0)), (False, (5, 3))])
def test_fp8_forward_matches_the_dequantised_reference(dtype, per, causal, window):
    q, k8, v8, ks, vs = _case(2, 4, 2, 37, 45, 24, dtype=dtype, per=per, seed=len(str(window)) + causal)
    _check(q, k8, v8, ks, vs, causal=causal, window=window, config={"BLOCK_M": 16, "BLOCK_N": 16})


def test_fp8_forward_takes_v_in_either_memory_layout():
    """The launch stores V keys-contiguous for the FP8 PV dot (a copy) unless it already is: both layouts
    of one logical V give the same output, within the tolerance."""
    q, k8, v8, ks, vs = _case(1, 4, 2, 21, 40, 16, seed=7)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16}
    a, _ = _check(q, k8, v8, ks, vs, causal=True, config=cfg)
    b, _ = _check(q, k8, v8.transpose(2, 3).contiguous().transpose(2, 3), ks, vs, causal=True, config=cfg)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_fp8_forward_e5m2_gqa_and_even_head_dim():
    q, k8, v8, ks, vs = _case(1, 6, 2, 33, 50, 32, fmt=E5M2, seed=4)
    _check(q, k8, v8, ks, vs, causal=True, config={"BLOCK_M": 16, "BLOCK_N": 32})


def test_fp8_forward_is_closer_than_its_tolerance_and_the_scales_matter():
    """The error is the quantisation of q and P (well inside the tolerance), and a kernel that dropped
    either scale would be far off (both scales differ from 1 by orders of magnitude here)."""
    q, k8, v8, ks, vs = _case(2, 4, 2, 29, 40, 16, seed=9)
    out, err = _check(q, k8, v8, ks, vs, causal=True, config={"BLOCK_M": 16, "BLOCK_N": 16})
    assert err < FP8_FWD["float8_e4m3fn"][0] / 2
    kd, vd = fp8.dequantize(k8, ks), fp8.dequantize(v8, vs)
    for kk, vv in ((k8.float(), vd), (kd, v8.float())):  # codes read as numbers: one scale dropped
        wrong = reference_attention(q.double(), kk.double(), vv.double(), _problem(q, k8, True, None))
        assert (out.double() - wrong).abs().max() > 0.5


def test_fully_masked_rows_and_zero_query_rows_stay_finite():
    q, k8, v8, ks, vs = _case(1, 2, 1, 20, 12, 16, seed=2)
    q[:, :, 3] = 0  # an all-zero query row: its scale must not divide by zero
    # top-left causal with a window (2, -1) over Skv < Sq: rows past the keys admit nothing
    out = flash_attention(q, k8, v8, causal=True, causal_align="top_left", window=(2, -1),
                          config={"BLOCK_M": 16, "BLOCK_N": 16}, k_scale=ks, v_scale=vs)
    assert torch.isfinite(out.float()).all()
    _check(q, k8, v8, ks, vs, config={"BLOCK_M": 16, "BLOCK_N": 16})


def test_fp8_forward_argument_errors():
    q, k8, v8, ks, vs = _case(1, 2, 2, 5, 8, 16)
    with pytest.raises(ValueError, match="v_scale: required"):
        flash_attention(q, k8, v8, k_scale=ks)
    with pytest.raises(ValueError, match="k_scale: required"):
        flash_attention(q, k8, v8, v_scale=vs)
    with pytest.raises(ValueError, match="k_scale: only FP8"):
        flash_attention(q, q[:, :, :8].clone(), q[:, :, :8].clone(), k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="share one format"):
        flash_attention(q, k8, v8.to(E5M2), k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="q: with FP8"):
        flash_attention(q.float(), k8, v8, k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="v_scale: expected one scale or a contiguous"):
        flash_attention(q, k8, v8, k_scale=ks, v_scale=torch.ones(3, device=DEV))
    with pytest.raises(ValueError, match="inference"):
        flash_attention(q.requires_grad_(), k8, v8, k_scale=ks, v_scale=vs)


# ---- the runtime and the gate -----------------------------------------------------------------------------
def test_attention_serves_fp8_prefill_through_triton_flash(monkeypatch):
    """attntune.attention with FP8 K/V and Sq > 16: triton_flash reads the codes (a fixed plan here; untuned
    machines keep the fp8_dequant fallback until the tuner measures the FP8 forward)."""
    import attntune

    if HAS_GPU and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs an sm_89+ GPU (FP8 tensor cores) or the CPU interpreter")
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:triton_flash")
    attntune.reset()
    try:
        q, k8, v8, ks, vs = _case(2, 4, 2, 37, 45, 24, seed=6)
        out = attntune.attention(q, k8, v8, k_scale=ks, v_scale=vs, causal=True)
        [plan] = [p for p in attntune.stats()["plans"] if "kv:" in p["problem"]]
        assert plan["variant"] == "triton_flash", plan
        kd, vd = fp8.dequantize(k8, ks), fp8.dequantize(v8, vs)
        ref = reference_attention(q.double(), kd.double(), vd.double(), _problem(q, k8, True, None))
        unit = vd.double().std(dim=(0, 2, 3)).repeat_interleave(2).view(1, -1, 1, 1)
        atol, rtol = FP8_FWD["float8_e4m3fn"]
        assert (((out.double() - ref) / unit).abs() <= atol + rtol * (ref / unit).abs()).all()
    finally:
        attntune.reset()


def test_the_gate_holds_fp8_dots_to_the_format_tolerance(monkeypatch):
    """The gate passes triton_flash on an FP8 prefill key within FP8_FWD and records its error against the
    float32 cache; held to q's dtype's tolerance instead (as an exact-widening variant is) it would fail,
    so the tolerance choice is what lets it through — and a wrong kernel still fails."""
    from attntune.autotune import gate
    from attntune.kernels import registry
    from attntune.kernels.triton_flash.variant import FlashVariantBase

    p = AttentionProblem(batch=2, heads_q=4, heads_kv=2, seqlen_q=40, seqlen_kv=40, head_dim=32, head_dim_v=32,
                         dtype="float16", causal=True, kv_dtype="float8_e4m3fn")
    inp = gate.prepare(p, torch.device(DEV), seed=1)
    flash = registry.get("triton_flash")
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    res = gate.check(flash, cfg, inp)
    assert res.ok, res.reason
    assert "against the float32 cache" in res.reason and 1e-3 < res.rel_error < 0.2
    monkeypatch.setattr(FlashVariantBase, "fp8_dots", False)
    assert gate.check(flash, cfg, inp).status == "wrong"
    monkeypatch.setattr(FlashVariantBase, "fp8_dots", True)
    from attntune.kernels.triton_flash import op

    real = op.flash_attention
    monkeypatch.setattr(op, "flash_attention", lambda *a, **kw: real(*a, **{**kw, "v_scale": kw["v_scale"] * 1.5}))
    assert gate.check(flash, cfg, inp).status == "wrong"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("b, hq, hkv, sq, skv, d", [(2, 32, 8, 1025, 1100, 128), (3, 16, 16, 700, 700, 64)])
@pytest.mark.parametrize("loads", [0, 1])
def test_gpu_fp8_forward(dtype, b, hq, hkv, sq, skv, d, loads):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs an sm_89+ GPU (FP8 tensor cores)")
    q, k8, v8, ks, vs = _case(b, hq, hkv, sq, skv, d, dtype=dtype, seed=b + d)
    cfg = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "LOADS": loads}
    for causal, window in ((False, None), (True, None), (True, (255, 0))):
        _check(q, k8, v8, ks, vs, causal=causal, window=window, config=cfg)


def test_fp8_forward_descriptor_loads_read_v_through_its_transpose(monkeypatch):
    """With descriptor loads the FP8 forward reads its keys-contiguous V copy through a descriptor of the
    [B, Hkv, D, Skv] tensor it is (jit_fwd's V_T), at an odd length too (the copy's rows are padded to 16
    bytes): the same output as pointer loads."""
    from attntune.kernels.triton_flash import launch

    flags = []
    real = launch._FWD  # FastKernel: every argument positional, in the kernel's parameter order

    def spy(key, grid, args, *rest):
        a = dict(zip(real.fn.arg_names, args))
        flags.append((a["DESC"], a["V_T"]))
        return real(key, grid, args, *rest)

    monkeypatch.setattr(launch, "_FWD", spy)
    q, k8, v8, ks, vs = _case(1, 4, 2, 29, 45, 32, seed=3)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16}
    a, _ = _check(q, k8, v8, ks, vs, causal=True, config=dict(cfg, LOADS=1))
    b, _ = _check(q, k8, v8, ks, vs, causal=True, config=cfg)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert flags == [(True, True), (False, False)]
