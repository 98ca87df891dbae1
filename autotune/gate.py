"""The correctness gate: every (variant, config) must reproduce the reference before it is timed.

Called by the sweep once per trial, after :func:`prepare` built the key's inputs and reference once per
key. Inputs are random normal (never zeros, so a kernel that writes nothing or reads the wrong tile
cannot pass by accident) from a seed fixed per key, so a rerun gates on the same data.

Checks, in order:

* the call itself (any exception becomes a failed trial with the exception as the reason);
* output shape ``[B, Hq, Sq, Dv]`` and dtype (q's);
* finiteness: no NaN/inf. Outputs are *poisoned* first: a variant whose ``run`` takes ``out=`` gets a
  NaN-filled buffer; otherwise, on CUDA, a NaN-filled block of the output's size is freed right before
  the call so the caching allocator hands it to the variant's output — any element the kernel forgets
  to write stays NaN;
* padding must not leak: with ``kv_lens``, keys/values past each sequence's length hold a large
  constant, which changes the result visibly if a kernel reads them unmasked;
* closeness to :func:`attntune.kernels.reference.reference_attention` (float64 on the CPU; on GPUs
  float64 for small problems, float32 for big ones) at the tolerances of :mod:`attntune.tolerances`
  (TF32 tolerance for float32 inputs when TF32 is allowed); for ``fwd_bwd`` also dq, dk, dv at the
  backward tolerances;
* approximate variants (``variant.exact`` False) are not held to the tolerance: their relative error
  ``||out - ref|| / ||ref||`` is recorded instead (NaN/inf still fail).

An FP8 K/V key (``kv_dtype``): K and V are drawn in float32, quantised per kv head
(:func:`attntune.fp8.quantize_kv`, padding included) and the variants get the codes and the scales. The
tolerance check compares with the reference on the *dequantised* cache (what the codes mean exactly);
the recorded relative error is against the reference on the float32 cache — the error FP8 costs, stored
with the winner.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

import torch

from attntune.kernels.base import Config, Variant
from attntune.kernels.reference import masked_softmax_attention
from attntune.problem import AttentionProblem
from attntune.tolerances import FP8_FWD, bwd_tol, fwd_tol, tf32_active, tf32_allowed

# Keys/values past kv_lens hold this value: finite (0·x stays 0 for kernels that load and mask), but far
# outside N(0, 1), so an unmasked read moves the output well past any tolerance.
PAD_VALUE = 30.0
# Reference problems above this many FLOPs use float32 on GPUs (float64 is slow and twice the memory).
GPU_FP64_MAX_FLOPS = 5e10
# Peak bytes of one reference chunk (scores and softmax temporaries): bounds the gate's memory.
REF_CHUNK_BYTES = {"cuda": 4 << 30, "cpu": 512 << 20}


@dataclass
class GateInputs:
    """One key's inputs and reference, built once by :func:`prepare` and shared by all its trials.

    q ``[B, Hq, Sq, D]``, k ``[B, Hkv, Skv, D]``, v ``[B, Hkv, Skv, Dv]`` in the problem's dtype;
    ``kv_lens`` ``[B]`` int32 or None; ``dout`` ``[B, Hq, Sq, Dv]`` (fwd_bwd only); ``ref_out`` and
    ``ref_grads`` (dq, dk, dv) in ``ref_dtype``.
    """

    problem: AttentionProblem
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv_lens: Optional[torch.Tensor]
    dout: Optional[torch.Tensor]
    ref_dtype: torch.dtype
    ref_out: torch.Tensor
    ref_grads: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
    tf32: bool = False
    #: the lengths every *timed* call uses (:func:`timing_kv_lens`): the gate's ``kv_lens`` are drawn per
    #: seed, and a split-K kernel's time follows its longest sequence, so timing them would rank configs
    #: by the draw (one draw of B=4, KV 2048 ranked a 64-split config first that re-timed 1.36x slower
    #: on another draw: ``regret_h200.json``, session 8)
    timing_kv_lens: Optional[torch.Tensor] = None
    #: FP8 keys: ``(k_scale, v_scale)`` float32 ``[Hkv]``, passed after ``kv_lens`` to every call; () else
    scales: Tuple[torch.Tensor, ...] = ()
    #: FP8 keys: the reference output on the float32 K/V before quantisation (``ref_dtype``)
    float_ref_out: Optional[torch.Tensor] = None

    @property
    def device(self) -> torch.device:
        return self.q.device

    def leaves(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fresh q, k, v sharing storage with the inputs; leaves that require grad for fwd_bwd."""
        bwd = self.problem.mode == "fwd_bwd"
        return tuple(t.detach().requires_grad_(bwd) for t in (self.q, self.k, self.v))  # type: ignore


@dataclass
class GateResult:
    """``status``: ok | wrong | failed. ``max_error``: max |x - ref| over the output (and the gradients
    for fwd_bwd). ``rel_error``: ||out - ref|| / ||ref|| of the output."""

    status: str
    reason: Optional[str] = None
    max_error: Optional[float] = None
    rel_error: Optional[float] = None
    details: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ---- inputs and reference --------------------------------------------------------------------------


def _kv_lens(problem: AttentionProblem, g: torch.Generator, device) -> torch.Tensor:
    b, skv = problem.batch, problem.seqlen_kv
    lens = torch.randint(1, max(skv, 1) + 1, (b,), generator=g, device=device, dtype=torch.int64)
    if b >= 2:
        lens[0] = skv  # the full length is always among the tested lengths
    elif skv > 1:
        # One sequence: a full length would not exercise the length mask at all, so test a partial one.
        lens[0] = torch.randint(1, skv, (1,), generator=g, device=device)[0]
    return lens.to(torch.int32)


def timing_kv_lens(problem: AttentionProblem, device) -> torch.Tensor:
    """The ``[B]`` int32 lengths every timed call of a ``kv_lens`` key uses, whatever the seed
    (:meth:`AttentionProblem.timed_kv_lens`: the full length first, the rest spread evenly down to just above
    half of it, as a serving batch's sequences are)."""
    return torch.tensor(problem.timed_kv_lens(), device=device, dtype=torch.int32)


@contextmanager
def key_numerics(problem: AttentionProblem) -> Iterator[None]:
    """While a float32 CUDA key is measured, torch's ``float32_matmul_precision`` is what the key says
    (``problem.tf32``: "high", else "highest"), so that its rows are measured under the numerics they
    serve; restored after. Already right (e.g. online tuning of the caller's own precision, in the
    caller's process) or any other key: untouched — the setting is process-wide."""
    if torch.version.hip or tf32_active(problem.dtype, problem.device_type) == problem.tf32:
        yield
        return
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if problem.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def prepare(problem: AttentionProblem, device: torch.device, seed: int) -> GateInputs:
    """Random inputs for ``problem`` on ``device`` (seeded) and the reference output (and gradients).
    Called once per key, before its first trial."""
    g = torch.Generator(device=device).manual_seed(seed)
    dt = problem.torch_dtype

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dt)

    b, hq, hkv = problem.batch, problem.heads_q, problem.heads_kv
    q = randn(b, hq, problem.seqlen_q, problem.head_dim)
    kv_dt = torch.float32 if problem.kv_dtype is not None else dt  # FP8: quantised below
    k = torch.randn(b, hkv, problem.seqlen_kv, problem.head_dim, generator=g, device=device, dtype=kv_dt)
    v = torch.randn(b, hkv, problem.seqlen_kv, problem.head_dim_v, generator=g, device=device, dtype=kv_dt)
    kv_lens = None
    if problem.kv_lens:
        kv_lens = _kv_lens(problem, g, device)
        pad = torch.arange(problem.seqlen_kv, device=device)[None, :] >= kv_lens[:, None].long()  # [B, Skv]
        k.masked_fill_(pad[:, None, :, None], PAD_VALUE)
        v.masked_fill_(pad[:, None, :, None], PAD_VALUE)
    dout = randn(b, hq, problem.seqlen_q, problem.head_dim_v) if problem.mode == "fwd_bwd" else None
    if device.type == "cpu" or problem.flops() <= GPU_FP64_MAX_FLOPS:
        ref_dtype = torch.float64
    else:
        ref_dtype = torch.float32
    scales, float_ref = (), None
    if problem.kv_dtype is not None:
        from attntune.fp8 import dequantize, quantize_kv
        from attntune.problem import KV_DTYPES

        float_ref, _ = chunked_reference(q, k, v, problem, kv_lens, ref_dtype)
        k, v, ks, vs = quantize_kv(k, v, per="head", dtype=KV_DTYPES[problem.kv_dtype])
        scales = (ks, vs)
        ref_out, ref_grads = chunked_reference(q, dequantize(k, ks), dequantize(v, vs), problem, kv_lens,
                                               ref_dtype, dout)
    else:
        ref_out, ref_grads = chunked_reference(q, k, v, problem, kv_lens, ref_dtype, dout)
    tf32 = problem.dtype == "float32" and tf32_allowed()
    timed = timing_kv_lens(problem, device) if problem.kv_lens else None
    return GateInputs(problem, q, k, v, kv_lens, dout, ref_dtype, ref_out, ref_grads, tf32, timed, scales,
                      float_ref)


@contextmanager
def exact_matmul() -> Iterator[None]:
    """The reference must not use TF32 even when the user allowed it for the kernels."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def reference_chunks(problem: AttentionProblem, ref_dtype: torch.dtype, bwd: bool, budget: int):
    """The chunking of :func:`chunked_reference`: (batch elements, kv heads, query heads of one kv head)
    per chunk. Whole kv-head groups and then batch elements are packed while the materialised scores of
    a chunk (Sq·Skv per query head, plus softmax temporaries) stay under ``budget`` bytes; a single
    huge head is split over its query heads."""
    grp = problem.group
    per_q = max(problem.seqlen_q, 1) * max(problem.seqlen_kv, 1) * ref_dtype.itemsize * (6 if bwd else 4)
    if per_q * grp * problem.heads_kv <= budget:
        return max(1, min(problem.batch, budget // (per_q * grp * problem.heads_kv))), problem.heads_kv, grp
    if per_q * grp <= budget:
        return 1, budget // (per_q * grp), grp
    return 1, 1, max(1, budget // per_q)


def chunked_reference(
    q, k, v, problem: AttentionProblem, kv_lens, ref_dtype: torch.dtype, dout: Optional[torch.Tensor] = None
):
    """Reference output ``[B, Hq, Sq, Dv]`` (and dq, dk, dv when ``dout`` is given) in ``ref_dtype``,
    computed chunk by chunk (:func:`reference_chunks`) so the memory of the materialised scores stays
    bounded by ``REF_CHUNK_BYTES`` (one 32k x 32k fp32 score matrix alone is 4 GiB)."""
    b_all, hkv_all, grp = problem.batch, problem.heads_kv, problem.group
    bwd = dout is not None
    budget = REF_CHUNK_BYTES.get(q.device.type, REF_CHUNK_BYTES["cpu"])
    bc, hc, qc = reference_chunks(problem, ref_dtype, bwd, budget)
    out = torch.empty(
        b_all, problem.heads_q, problem.seqlen_q, problem.head_dim_v, device=q.device, dtype=ref_dtype
    )
    # dk/dv sum over the query heads of their group, which may span several chunks: accumulate.
    grads = tuple(torch.zeros(t.shape, device=q.device, dtype=ref_dtype) for t in (q, k, v)) if bwd else None
    with exact_matmul(), torch.enable_grad() if bwd else torch.no_grad():
        for b0 in range(0, b_all, bc):
            b1 = min(b0 + bc, b_all)
            for h0 in range(0, hkv_all, hc):
                h1 = min(h0 + hc, hkv_all)
                for j0 in range(0, grp, qc):
                    j1 = min(j0 + qc, grp)
                    if qc == grp:  # whole groups of kv heads h0..h1
                        qh = slice(h0 * grp, h1 * grp)
                        sub = dict(batch=b1 - b0, heads_q=(h1 - h0) * grp, heads_kv=h1 - h0)
                    else:  # part of the query heads of kv head h0 (hc == 1)
                        qh = slice(h0 * grp + j0, h0 * grp + j1)
                        sub = dict(batch=b1 - b0, heads_q=j1 - j0, heads_kv=1)
                    sub_problem = problem.model_copy(update=sub)
                    qs = q[b0:b1, qh].to(ref_dtype).requires_grad_(bwd)
                    ks = k[b0:b1, h0:h1].to(ref_dtype).requires_grad_(bwd)
                    vs = v[b0:b1, h0:h1].to(ref_dtype).requires_grad_(bwd)
                    kl = kv_lens[b0:b1] if kv_lens is not None else None
                    o = masked_softmax_attention(qs, ks, vs, sub_problem, kl, compute_dtype=ref_dtype)
                    out[b0:b1, qh] = o.detach()
                    if bwd:
                        gq, gk, gv = torch.autograd.grad(o, (qs, ks, vs), dout[b0:b1, qh].to(ref_dtype))
                        grads[0][b0:b1, qh] = gq
                        grads[1][b0:b1, h0:h1] += gk
                        grads[2][b0:b1, h0:h1] += gv
                    del o, qs, ks, vs
    return out, grads


# ---- running a variant -----------------------------------------------------------------------------


def _takes_out(variant: Variant) -> bool:
    try:
        return "out" in inspect.signature(variant.run).parameters
    except (TypeError, ValueError):
        return False


def _poison_allocator(nbytes: int, device: torch.device) -> None:
    """Leave a freed, NaN-filled block (0xFF bytes are NaN in fp16/bf16/fp32) of ``nbytes`` in the
    CUDA caching allocator, which hands it to the next allocation of that size: the kernel's output."""
    if device.type != "cuda" or nbytes <= 0:
        return
    t = torch.empty(nbytes, dtype=torch.uint8, device=device)
    t.fill_(0xFF)
    del t


def run_variant(variant: Variant, config: Config, inp: GateInputs, q, k, v) -> torch.Tensor:
    """One call as the runtime makes it (kv_lens only when the problem has them), with output
    poisoning. Used by the gate; timing calls ``variant.run`` directly."""
    p = inp.problem
    kv_lens = inp.kv_lens if p.kv_lens else None
    if _takes_out(variant):
        out = torch.full(
            (p.batch, p.heads_q, p.seqlen_q, p.head_dim_v), float("nan"), device=q.device, dtype=q.dtype
        )
        return variant.run(q, k, v, p, config, kv_lens, *inp.scales, out=out)
    _poison_allocator(p.batch * p.heads_q * p.seqlen_q * p.head_dim_v * q.element_size(), q.device)
    return variant.run(q, k, v, p, config, kv_lens, *inp.scales)


def _compare(
    name: str, x: torch.Tensor, ref: torch.Tensor, tol: Tuple[float, float]
) -> Tuple[float, Optional[str]]:
    """Max abs error of ``x`` vs ``ref`` and, when some element is outside ``atol + rtol·|ref|``, why."""
    atol, rtol = tol
    err = (x.to(ref.dtype) - ref).abs_()
    max_err = float(err.max()) if err.numel() else 0.0
    bad = err > (atol + rtol * ref.abs())
    n_bad = int(bad.sum())
    if not n_bad:
        return max_err, None
    idx = tuple(int(i) for i in torch.nonzero(bad)[0])
    return max_err, (
        f"{name}: {n_bad} of {bad.numel()} elements outside atol={atol:g} rtol={rtol:g} "
        f"(max abs error {max_err:.3g}; first at {list(idx)}: got {float(x[idx]):.4g}, "
        f"expected {float(ref[idx]):.4g})"
    )


def _finite(name: str, x: torch.Tensor) -> Optional[str]:
    fin = torch.isfinite(x)
    if bool(fin.all()):
        return None
    n_nan = int(torch.isnan(x).sum())
    n_inf = int((~fin).sum()) - n_nan
    return f"{name}: {n_nan} NaN and {n_inf} inf values (unwritten or overflowed elements)"


def check(variant: Variant, config: Config, inp: GateInputs) -> GateResult:
    """Run ``variant`` once on the key's inputs and judge the result (see module docstring).
    Exceptions propagate: the sweep turns them into failed trials with their reason."""
    p = inp.problem
    bwd = p.mode == "fwd_bwd"
    q, k, v = inp.leaves()
    with torch.enable_grad() if bwd else torch.no_grad():
        out = run_variant(variant, config, inp, q, k, v)
    expected = (p.batch, p.heads_q, p.seqlen_q, p.head_dim_v)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return GateResult("wrong", f"wrong result: output shape {got}, expected {expected}")
    if out.dtype != q.dtype:
        return GateResult("wrong", f"wrong result: output dtype {out.dtype}, expected {q.dtype}")
    bad = _finite("output", out.detach())
    if bad:
        return GateResult("wrong", f"wrong result: {bad}")
    if bwd:
        out.backward(inp.dout)
    out = out.detach()
    # a variant computing in FP8 (q and P quantised for FP8 dots) is held to the format's tolerance
    fp8_dots = p.kv_dtype is not None and variant.fp8_dots
    outs = [("output", out, inp.ref_out, FP8_FWD[p.kv_dtype] if fp8_dots else fwd_tol(p.dtype, inp.tf32))]
    if bwd:
        for name, leaf, ref in zip(("dq", "dk", "dv"), (q, k, v), inp.ref_grads):
            if leaf.grad is None:
                return GateResult("wrong", f"wrong result: {name} is None (no gradient flowed)")
            bad = _finite(name, leaf.grad)
            if bad:
                return GateResult("wrong", f"wrong result: {bad}")
            outs.append((name, leaf.grad, ref, bwd_tol(p.dtype, inp.tf32)))
    ref_norm = float(inp.ref_out.norm())
    rel = float((out.to(inp.ref_dtype) - inp.ref_out).norm()) / ref_norm if ref_norm > 0 else 0.0
    max_err = 0.0
    problems = []
    for name, x, ref, tol in outs:
        e, why = _compare(name, x, ref, tol)
        max_err = max(max_err, e)
        if why:
            problems.append(why)
    if not variant.exact:
        # Approximations are chosen knowingly (the call allowed them): record how far off, do not fail.
        return GateResult("ok", f"approximate: relative error {rel:.3g}", max_err, rel)
    if problems:
        return GateResult("wrong", "wrong result: " + "; ".join(problems), max_err, rel, problems)
    if inp.float_ref_out is not None:  # FP8 K/V: what the quantisation costs, against the float32 cache
        f_norm = float(inp.float_ref_out.norm())
        rel = float((out.to(inp.ref_dtype) - inp.float_ref_out).norm()) / f_norm if f_norm > 0 else 0.0
        return GateResult("ok", f"{p.kv_dtype} K/V: relative error {rel:.3g} against the float32 cache",
                          max_err, rel)
    return GateResult("ok", None, max_err, rel)


def classify_exception(e: BaseException) -> str:
    """A one-line reason for a failed trial: out of memory / out of resources / compile error / the
    exception itself."""
    name = type(e).__name__
    msg = (str(e).strip().splitlines() or [""])[0][:300]
    low = (name + " " + msg).lower()
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in low:
        kind = "out of memory"
    elif "outofresources" in low or "out of resource" in low:
        kind = "out of resources"
    elif "compil" in low:
        kind = "compile error"
    else:
        kind = "exception"
    return f"{kind}: {name}: {msg}" if msg else f"{kind}: {name}"


def cuda_context_lost(e: BaseException) -> bool:
    """True when the error leaves the CUDA context unusable (every later launch would fail too)."""
    msg = str(e).lower()
    return any(
        s in msg
        for s in (
            "illegal memory access",
            "unspecified launch failure",
            "device-side assert",
            "illegal instruction",
            "misaligned address",
        )
    )
