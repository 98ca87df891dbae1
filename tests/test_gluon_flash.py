"""The Gluon Hopper forward (``gluon_flash``): on unless ATTNTUNE_GLUON=0; what it refuses and why;
its typed config and shared-memory model; argument errors naming the argument; the kernel compiles for sm_90 with
the softmax overlapping the PV wgmma (CPU: the installed Triton's compiler, no GPU); on an H100/H200 (gpu tests)
its output and LSE against a float32 reference over odd shapes, GQA, both causal alignments and windows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attntune.kernels import registry
from attntune.kernels.gluon_flash.config import SMEM_LIMIT, GluonFwdConfig, smem_bytes
from attntune.kernels.gluon_flash_variant import ENV, _has_gluon_hopper, gluon_reasons
from attntune.problem import AttentionProblem

ROOT = Path(__file__).resolve().parent.parent


def _problem(**kw) -> AttentionProblem:
    base = dict(batch=2, heads_q=8, heads_kv=2, seqlen_q=333, seqlen_kv=1000, head_dim=80, head_dim_v=80,
                dtype="bfloat16", device_type="cuda")
    base.update(kw)
    return AttentionProblem(**base)


def test_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert not any(ENV in r for r in gluon_reasons(_problem()))
    for value in ("1", ""):
        monkeypatch.setenv(ENV, value)
        assert not any(ENV in r for r in gluon_reasons(_problem()))
    for value in ("0", "yes"):
        monkeypatch.setenv(ENV, value)
        assert any(ENV in r for r in gluon_reasons(_problem()))


def test_a_candidate_only_where_it_runs(monkeypatch):
    """Not a candidate on a machine without a Hopper GPU (this one), nor anywhere with the switch at 0."""
    monkeypatch.delenv(ENV, raising=False)
    v = registry.get("gluon_flash")
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and _has_gluon_hopper()
    assert (v in registry.candidates(_problem())) == hopper
    monkeypatch.setenv(ENV, "0")
    assert v not in registry.candidates(_problem())


@pytest.mark.parametrize("change,reason", [
    (dict(dtype="float32"), "float32 not supported"),
    (dict(seqlen_q=1, kv_lens=True), "kv_lens"),
    (dict(seqlen_q=16), "decode (Sq <= 16)"),
    (dict(kv_dtype="float8_e4m3fn"), "FP8 K/V"),
    (dict(head_dim=100, head_dim_v=100), "head_dim 100"),
    (dict(head_dim=192, head_dim_v=192), "head_dim 192"),
    (dict(head_dim_v=64), "head_dim_v != head_dim"),
    (dict(batch=9000, heads_q=8), "batch * heads_q = 72000"),
    (dict(device_type="cpu"), "needs an NVIDIA Hopper GPU"),
])
def test_refusals_say_why(monkeypatch, change, reason):
    monkeypatch.setenv(ENV, "1")
    got = gluon_reasons(_problem(**change))
    assert any(reason in r for r in got), got


def test_takes_what_it_declares(monkeypatch):
    """With the switch on, a 16-bit forward problem with a head dim of 8..128 (multiple of 8), any mask, GQA, is
    refused for no reason of its own — only for the machine (no Hopper GPU here, or no Gluon)."""
    monkeypatch.setenv(ENV, "1")
    own = ("float", "inference", "kv_lens", "FP8", "head_dim", "batch")
    for kw in (dict(), dict(causal=True), dict(mode="fwd_bwd"), dict(window=(127, 0)),
               dict(causal=True, causal_align="top_left"), dict(head_dim=8, head_dim_v=8),
               dict(head_dim=128, head_dim_v=128), dict(dtype="float16")):
        got = gluon_reasons(_problem(**kw))
        assert not [r for r in got if r.startswith(own)], (kw, got)


def test_config_round_trips_and_refuses_out_of_domain_values():
    space = registry.get("gluon_flash").space(_problem())
    grid = list(space.grid())
    assert len(grid) == 8 and space.default in grid
    for d in grid:
        cfg = GluonFwdConfig.from_dict(d)
        assert cfg.to_dict() == d and GluonFwdConfig.from_dict(cfg.to_dict()) == cfg
    for bad, key in (({"BLOCK_M": 64}, "BLOCK_M"), ({"num_warps": 4}, "num_warps"), ({"BLOCK_N": 48}, "BLOCK_N"),
                     ({"num_stages": 0}, "num_stages"), ({"BLOCK_K": 64}, "unknown keys"),
                     ({"BLOCK_N": "128"}, "BLOCK_N"), ({"WS": 2}, "WS")):
        with pytest.raises(ValueError, match=key):
            GluonFwdConfig.from_dict(bad)


def test_warp_specialized_schedule_needs_a_two_deep_ring():
    """A WS consumer releases block j-1 only after issuing S_j, so with one ring slot the loader could never bring
    block j: the space refuses that config (naming why) and the default for every head dim is WS with a ring that
    fits."""
    from attntune.kernels.gluon_flash.config import constraint_reasons, default_config

    assert any("num_stages >= 2" in r for r in constraint_reasons(GluonFwdConfig(num_stages=1, WS=1), 64))
    assert not constraint_reasons(GluonFwdConfig(num_stages=1, WS=0), 64)
    for d in (8, 64, 96, 128):
        cfg = default_config(d)
        assert cfg.WS == 1 and not constraint_reasons(cfg, d)
    assert GluonFwdConfig(WS=1).launch_opts()["num_warps"] == 4  # the first consumer: the default partition


def test_shared_memory_model_matches_the_compiler():
    """The model is what Triton 3.6 allocated for sm_90 (committed compile results: 3 head dims x 3 masks x 8
    configs, both schedules) plus at most its margin, and every config of the space fits Hopper's 227 KB."""
    res = json.loads((ROOT / "benchmarks/results/probe_gluon_fwd_compile_sm90_triton36_ws.json").read_text())["result"]
    assert len(res) == 72
    for name, r in res.items():
        d, _mask, bm, bn, stages, warps, ws = name.split("/")
        cfg = GluonFwdConfig(BLOCK_M=int(bm), BLOCK_N=int(bn), num_stages=int(stages), num_warps=int(warps),
                             WS=int(ws))
        assert 0 <= smem_bytes(cfg, int(d[1:])) - r["shared_bytes"] <= (512 if cfg.WS else 128), name
        # ptxas reports the warp-specialized kernel at its maxnreg (168); its masked 128-key configs spill 4 bytes
        # there (the consumers' raised budget is set at run time)
        assert r["spill_bytes"] == [0, 0] or (cfg.WS and max(r["spill_bytes"]) <= 8), name
    for d in (8, 64, 72, 128):
        assert all(smem_bytes(GluonFwdConfig.from_dict(c), d) <= SMEM_LIMIT
                   for c in registry.get("gluon_flash").space(_problem(head_dim=d, head_dim_v=d)).grid())


def _qkv(b=1, hq=4, hkv=2, sq=40, skv=50, d=64, dtype=torch.bfloat16, device="cpu"):
    return (torch.zeros(b, hq, sq, d, dtype=dtype, device=device),
            torch.zeros(b, hkv, skv, d, dtype=dtype, device=device),
            torch.zeros(b, hkv, skv, d, dtype=dtype, device=device))


def test_argument_errors_name_the_argument():
    from attntune.kernels.gluon_flash.launch import check_inputs

    q, k, v = _qkv()
    check_inputs(q, k, v)
    with pytest.raises(ValueError, match="q: dtype torch.float32"):
        check_inputs(q.float(), k, v)
    with pytest.raises(ValueError, match="k: dtype torch.float16 differs"):
        check_inputs(q, k.half(), v)
    with pytest.raises(ValueError, match="v: expected"):
        check_inputs(q, k, v[0])
    with pytest.raises(ValueError, match="q: the head dim must be contiguous"):
        check_inputs(q.transpose(-1, -2), k, v)
    narrow = torch.zeros(1, 4, 40, 12, dtype=torch.bfloat16)[..., :8]  # rows 24 bytes apart
    with pytest.raises(ValueError, match="q: strides"):
        check_inputs(narrow, *_qkv(d=8)[1:])
    with pytest.raises(ValueError, match="head dim 136"):
        check_inputs(*_qkv(d=136))
    with pytest.raises(ValueError, match="k/v: head dims"):
        check_inputs(q, *_qkv(d=32)[1:])
    with pytest.raises(ValueError, match="k: 3 kv heads"):
        check_inputs(q, *_qkv(hkv=3)[1:])


def test_empty_calls_return_zeros_without_a_launch():
    """No key (Skv = 0): zeros and LSE -inf; no query row: empty outputs — both before any descriptor or launch
    (so on the CPU too). batch * heads past the grid's axis is refused naming q."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from attntune.kernels.gluon_flash.launch import forward

    q, k, v = _qkv(skv=0)
    q.fill_(1.0)
    o, lse = forward(q, k, v, GluonFwdConfig())
    assert o.shape == q.shape and (o == 0).all() and torch.isneginf(lse).all()
    o, lse = forward(*_qkv(sq=0), GluonFwdConfig(), causal=True)
    assert o.shape == (1, 4, 0, 64) and lse.shape == (1, 4, 0)
    with pytest.raises(ValueError, match="q: batch \\* heads = 65536"):
        forward(*_qkv(b=16384, sq=1, skv=1, d=8), GluonFwdConfig())


@pytest.mark.skipif(not _has_gluon_hopper(), reason="needs triton.experimental.gluon (Hopper) to compile")
@pytest.mark.parametrize("ws", [0, 1])
def test_compiles_for_sm90_with_the_softmax_overlapping_the_pv_wgmma(ws):
    """The installed Triton compiles the causal D80 kernel for sm_90 (no GPU needed), and inside the key loop the
    kernel waits for the scores with one wgmma group still outstanding (the PV of the previous block); the
    warp-specialized schedule (WS=1) also moves registers between its partitions (setmaxnreg)."""
    # a child process: the tests run Triton's interpreter (TRITON_INTERPRET=1), under which Gluon's library
    # functions are interpreter objects that the compiler refuses
    code = ("import json; from attntune.kernels.gluon_flash.launch import compile_for; "
            "from attntune.kernels.gluon_flash.config import GluonFwdConfig; "
            f"k = compile_for(GluonFwdConfig(BLOCK_N=64, num_stages=2, WS={ws}), 80, has_right=True); "
            "print(json.dumps([ln.strip() for ln in k.asm['ptx'].splitlines() "
            "if ln.strip().startswith(('wgmma.wait_group', 'ex2.approx', 'setmaxnreg'))]))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ops = json.loads(r.stdout.strip().splitlines()[-1])
    # a wait with one group outstanding exists only where the scores are taken while PV still runs (the source's
    # softmax sits between it and the wait for 0; Triton 3.9 lays the loop's blocks out rotated, so their text
    # order is not checked)
    assert "wgmma.wait_group.sync.aligned 1;" in ops and "wgmma.wait_group.sync.aligned 0;" in ops
    # the softmax's exponentials: BM x BN / threads of the one partition, or 64 x BN / 128 in each consumer
    assert sum(o.startswith("ex2.approx") for o in ops) >= 64
    assert any(o.startswith("setmaxnreg") for o in ops) == bool(ws)


def _reference(q, k, v, causal, align, window):
    """float32 attention with the library's reference (rows admitting no key: 0 and LSE -inf): (out, lse)."""
    from attntune.kernels.reference import masked_softmax_attention
    from attntune.problem import problem_from_tensors

    problem = problem_from_tensors(q, k, v, causal=causal, causal_align=align, window=window)
    return masked_softmax_attention(q, k, v, problem, compute_dtype=torch.float32, return_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dict(BLOCK_N=64, num_stages=2), dict(BLOCK_N=128, num_stages=3),
                                 dict(BLOCK_N=64, num_stages=2, WS=1), dict(BLOCK_N=128, num_stages=3, WS=1)])
@pytest.mark.parametrize("shape,causal,align,window", [
    ((2, 8, 2, 333, 1000, 80), True, "bottom_right", None),
    ((1, 4, 4, 1000, 333, 128), True, "bottom_right", None),  # rows with no key: output 0, LSE -inf
    ((2, 6, 3, 515, 515, 64), False, "bottom_right", (127, 0)),
    ((3, 4, 2, 77, 77, 96), False, "bottom_right", None),
    ((1, 4, 2, 300, 700, 16), False, "bottom_right", (100, 50)),
    ((1, 4, 2, 200, 500, 64), True, "top_left", None),
    ((1, 2, 1, 1, 4099, 128), False, "bottom_right", None),
])
def test_gpu_matches_a_float32_reference(cfg, shape, causal, align, window):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    from attntune.kernels.gluon_flash.launch import forward

    b, hq, hkv, sq, skv, d = shape
    torch.manual_seed(0)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o, lse = forward(q, k, v, GluonFwdConfig(**cfg), causal=causal, causal_align=align, window=window)
    ref_o, ref_lse = _reference(q, k, v, causal, align, window)
    assert not torch.isnan(o).any()
    assert ((o.float() - ref_o).norm() / ref_o.norm().clamp_min(1e-30)).item() < 1e-2
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-2
    assert (o.float()[~fin.unsqueeze(-1).expand_as(o)] == 0).all()


@pytest.mark.gpu
def test_gpu_serves_attention_when_enabled(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    import attntune

    monkeypatch.setenv(ENV, "1")
    # an untuned key takes the heuristic rules: the fixed policy serves this variant whatever they say
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:gluon_flash")
    attntune.reset()
    try:
        torch.manual_seed(0)
        q = torch.randn(2, 8, 257, 64, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(2, 2, 257, 64, device="cuda", dtype=torch.float16) for _ in range(2))
        out = attntune.attention(q, k, v, causal=True)
        ref, _ = _reference(q, k, v, True, "bottom_right", None)
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
        assert attntune.explain(q, k, v, causal=True).variant == "gluon_flash"
    finally:
        attntune.reset()


# ---- training: the Gluon forward's output and LSE, then triton_flash's backward --------------------------------

def test_training_config_round_trips_and_keeps_both_launches():
    """A fwd_bwd key's space is GluonTrainConfig's: the warp-specialized forward x triton_flash's backward knobs, the
    default (the forward's and the backward's defaults) first; every config round-trips through its stored dict and
    splits into the two launches; the backward's register and shared-memory model refuses what spills."""
    from attntune.kernels.gluon_flash.config import GluonTrainConfig, default_train_config
    from attntune.kernels.gluon_flash_variant import train_reasons
    from attntune.kernels.triton_flash.config import FlashBwdConfig, default_bwd_config

    p = _problem(head_dim=128, head_dim_v=128, mode="fwd_bwd")
    space = registry.get("gluon_flash").space(p)
    grid = list(space.grid())
    assert space.default == default_train_config(128, torch.bfloat16).to_dict() and space.default in grid
    assert 100 < len(grid) < 200 and all(c["WS"] == 1 for c in grid)
    for d in grid:
        cfg = GluonTrainConfig.from_dict(d)
        assert cfg.to_dict() == d and GluonTrainConfig.from_dict(cfg.to_dict()) == cfg
        assert cfg.forward.to_dict() == {k: d[k] for k in GluonFwdConfig.names()}
        assert cfg.backward == FlashBwdConfig.from_dict({k: d[k] for k in FlashBwdConfig.names()})
    assert default_train_config(64, torch.float16).backward == default_bwd_config(64, torch.float16)
    spills = GluonTrainConfig(BWD_BLOCK_M=64, BWD_BLOCK_N=128, BWD_WARPS=4)
    assert any("fp32 values per thread" in r for r in train_reasons(spills, p))
    assert spills.to_dict() not in grid
    with pytest.raises(ValueError, match="BWD_BLOCK_N"):
        GluonTrainConfig.from_dict({"BWD_BLOCK_N": 96})


def _triton_forward_as_gluon(monkeypatch):
    """Stand the Gluon forward in with triton_flash's (the interpreter runs it on the CPU): the same contract, (o,
    lse natural log, -inf for rows without a key), so the training wiring around it is what the test checks."""
    from attntune.kernels.gluon_flash import train
    from attntune.kernels.triton_flash import launch as flash_launch
    from attntune.kernels.triton_flash.config import FlashFwdConfig

    seen = []

    def forward(q, k, v, cfg, *, causal, causal_align, window, scale):
        assert isinstance(cfg, GluonFwdConfig) and scale > 0
        seen.append(scale)
        mask = flash_launch.mask_args(q.shape[2], k.shape[2], causal, causal_align, window)
        return flash_launch.forward(q, k, v, mask, scale, FlashFwdConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4,
                                                                         num_stages=1))

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(train.gluon_launch, "forward", forward)
    return seen


def _assert_matches_the_reference(q, k, v, do, out, grads, dtype: str, *, causal, causal_align, window, scale):
    """``out`` and ``grads`` (dq, dk, dv for the upstream gradient ``do``) within ``dtype``'s tolerances of the float32
    reference attention with the same mask and scale."""
    from attntune.kernels.reference import masked_softmax_attention
    from attntune.problem import problem_from_tensors
    from helpers import assert_close

    p = problem_from_tensors(q, k, v, causal=causal, causal_align=causal_align, window=window, scale=scale)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = masked_softmax_attention(qf, kf, vf, p, compute_dtype=torch.float32)
    ref_grads = torch.autograd.grad(ref, (qf, kf, vf), do.float())
    assert_close(out.detach(), ref.detach(), dtype)
    for name, g, r in zip("qkv", grads, ref_grads):
        assert_close(g, r, dtype, backward=True, what=f"d{name}")


@pytest.mark.parametrize("causal,align,window,scale", [
    (True, "bottom_right", None, None),
    (False, "bottom_right", (5, 3), 0.3),
    (True, "top_left", None, -0.3),
    (False, "bottom_right", (9, -1), 0.0),
])
def test_training_wiring_gives_the_reference_gradients_on_the_cpu(monkeypatch, causal, align, window, scale):
    """GQA, odd lengths, both causal alignments, a two-sided window, and scales the kernels cannot take as such
    (negative, zero: run as rewritten q, which autograd differentiates): the output and dq/dk/dv of the training path
    match a float32 reference; the compiled op's split (forward_saving/backward_saved) gives the same gradients, or
    None where the scale needs the rewrite."""
    from attntune.kernels.gluon_flash import train
    from attntune.kernels.gluon_flash.config import GluonTrainConfig
    from helpers import rand_qkv

    seen = _triton_forward_as_gluon(monkeypatch)
    cfg = GluonTrainConfig(BWD_BLOCK_M=16, BWD_BLOCK_N=16, BWD_WARPS=4, BWD_STAGES=1)
    q, k, v = rand_qkv(1, 4, 2, 37, 50, 16, dtype=torch.float16, requires_grad=True, seed=3)
    mask = dict(causal=causal, causal_align=align, window=window, scale=scale)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(torch.float16)
    out = train.attention(q, k, v, cfg, **mask)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert len(seen) == 1

    _assert_matches_the_reference(q, k, v, do, out, grads, "float16", **mask)

    saved = train.forward_saving(q.detach(), k.detach(), v.detach(), cfg, **mask)
    if scale is not None and scale <= 0:
        assert saved is None and train.backward_saved(do, q, k, v, out, out, cfg, **mask) is None
        return
    o, lse = saved
    split = train.backward_saved(do, q.detach(), k.detach(), v.detach(), o, lse, cfg, **mask)
    assert torch.equal(o, out.detach())
    for g, s in zip(grads, split):
        assert torch.equal(g, s)


def test_the_variant_routes_training_keys_to_the_training_path(monkeypatch):
    """run() of a fwd_bwd key goes through the training path with the key's parsed GluonTrainConfig (a fwd key's run
    keeps the forward alone), so a tuned training row runs the backward it was timed with."""
    from attntune.kernels.gluon_flash import train
    from attntune.kernels.gluon_flash.config import GluonTrainConfig

    got = {}
    monkeypatch.setattr(train, "attention", lambda q, k, v, cfg, **kw: got.setdefault("cfg", cfg))
    v = registry.get("gluon_flash")
    p = _problem(mode="fwd_bwd")
    cfg = dict(v.space(p).default, BWD_BLOCK_M=32)
    v.run(None, None, None, p, cfg)
    assert got["cfg"] == GluonTrainConfig.from_dict(cfg) and got["cfg"].backward.BWD_BLOCK_M == 32


@pytest.mark.gpu
@pytest.mark.parametrize("shape,causal,align,window,scale", [
    ((2, 8, 2, 333, 1000, 80), True, "bottom_right", None, None),
    ((1, 4, 4, 1000, 333, 128), True, "bottom_right", None, None),  # rows with no key: zero gradients
    ((2, 6, 3, 515, 515, 64), False, "bottom_right", (127, 0), None),
    ((1, 4, 2, 300, 700, 16), False, "bottom_right", (100, 50), -0.2),
    ((1, 4, 2, 200, 500, 96), True, "top_left", None, 0.0),
])
def test_gpu_training_matches_a_float32_reference(shape, causal, align, window, scale):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    from attntune.kernels.gluon_flash.config import default_train_config
    from attntune.kernels.gluon_flash import train

    b, hq, hkv, sq, skv, d = shape
    torch.manual_seed(0)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    mask = dict(causal=causal, causal_align=align, window=window, scale=scale)
    out = train.attention(q, k, v, default_train_config(d, torch.bfloat16), **mask)
    grads = torch.autograd.grad(out, (q, k, v), do)
    _assert_matches_the_reference(q, k, v, do, out, grads, "bfloat16", **mask)


@pytest.mark.gpu
def test_gpu_serves_a_training_step_and_its_compiled_op(monkeypatch):
    """attntune.attention with gradients on the pinned variant, eager and inside torch.compile (the compiled op's
    split backward: the Gluon forward runs once, its output and LSE feed the backward): the same gradients."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    import attntune
    from attntune.kernels.gluon_flash import train
    from helpers import assert_close

    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:gluon_flash")
    torch._dynamo.reset()
    attntune.reset()
    calls = []
    real = train.gluon_launch.forward
    monkeypatch.setattr(train.gluon_launch, "forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    try:
        torch.manual_seed(0)
        q = torch.randn(2, 8, 300, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(2, 2, 300, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        do = torch.randn_like(q)

        def step(fn):
            out = fn(q, k, v, causal=True, window=(100, 0))
            return (out, *torch.autograd.grad(out, (q, k, v), do))

        eager = step(attntune.attention)
        assert attntune.explain(q, k, v, causal=True, window=(100, 0)).variant == "gluon_flash"
        assert len(calls) == 1
        compiled = step(torch.compile(attntune.attention, fullgraph=True))
        assert len(calls) == 2
        for what, a, b in zip(("out", "dq", "dk", "dv"), eager, compiled):
            assert_close(b, a, "bfloat16", backward=what != "out", what=what)
    finally:
        attntune.reset()
        torch._dynamo.reset()


def test_untuned_hopper_prefill_tries_it_first_where_it_was_measured_ahead(monkeypatch):
    """The heuristic rules (a GPU faked: every variant usable): an untuned inference window or chunked prefill with
    64 < D <= 128 plans gluon_flash (the H100's tuned keys: 1.07-1.21x our Triton forward), with the Triton kernel
    next; at D64 (where it lost), in training, and where SDPA takes the mask natively, the plan is what it was."""
    from attntune.policies import policy
    from attntune.problem import AttentionProblem

    monkeypatch.setattr(policy, "usable", lambda name, config, problem, quarantine: [])

    def plan(d, sq=4099, skv=4099, window=None, causal=True, mode="fwd"):
        p = AttentionProblem(batch=1, heads_q=8, heads_kv=2, seqlen_q=sq, seqlen_kv=skv, head_dim=d, head_dim_v=d,
                             dtype="bfloat16", device_type="cuda", causal=causal, window=window, mode=mode)
        got = policy.heuristic_plan(p, None, set())
        return got.impl.name, got.runner_up

    for d in (72, 96, 128):
        assert plan(d, window=(1023, 0)) == ("gluon_flash", "triton_local")
        assert plan(d, sq=512, skv=4096) == ("gluon_flash", "triton_flash")  # chunked prefill: bottom-right causal
    assert plan(64, window=(1023, 0)) == ("triton_local", "triton_flash")
    assert plan(64, sq=512, skv=4096)[0] == "triton_flash"
    assert plan(128, window=(1023, 0), mode="fwd_bwd")[0] == "triton_local"
    assert plan(128)[0] == "sdpa_default"  # causal Sq == Skv: SDPA's own mask
    # off Hopper (or with ATTNTUNE_GLUON=0) the variant is not usable, and the next one in the rule serves
    monkeypatch.setattr(policy, "usable", lambda name, config, problem, quarantine:
                        ["not sm_90"] if name == "gluon_flash" else [])
    assert plan(128, window=(1023, 0))[0] == "triton_local"
    assert plan(128, sq=512, skv=4096)[0] == "triton_flash"
