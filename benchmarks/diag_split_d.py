"""Diagnosis of the split-head-dim series on a GPU (docs/wip/flash-split-d-vdesc.patch), one process per config.

The series passed every interpreter test, then failed on an H100 (eighth session): wrong outputs for three
D=96 forward configs at one stage (BLOCK_M 64), and "illegal memory access" in most others — but an
illegal access poisons the CUDA context of the pytest-xdist worker that hit it, so every later test of that
worker failed too and the log cannot say which configs are really broken. Here each config runs in a fresh
process with ``CUDA_LAUNCH_BLOCKING=1``, so a status belongs to its config:

* ``ok`` / ``wrong`` (max abs error against a float32 reference, and the padded tile's error on the same
  inputs as the control) / ``crash`` (the exception, e.g. an illegal address) / ``timeout``;
* ``compute-sanitizer --tool memcheck`` on the first crashing config, when the tool is on the machine;
* a minimal kernel for the suspected compiler hazard (Triton issue #9433, open: "RAW hazard with pipelined
  wgmma and LHS in register" — with two or more register-A wgmma dots in a loop, the wait Triton inserts only
  covers the first, so the next iteration may overwrite the second dot's A registers before it ran). The split
  forward has two such dots (``p @ v`` and ``p @ v2``); the padded kernel has one. The probe runs the loop
  with one and with two register-A dots at the failing tile shapes: if two fail where one passes, the hazard
  is the compiler's, and the fix is structural (one register-A dot per iteration), not in our index math.

Usage (GPU; apply the patch first: ``git apply docs/wip/flash-split-d-vdesc.patch``)::

    CUDA_LAUNCH_BLOCKING=1 python benchmarks/diag_split_d.py --out $OUT/split_d.json --jobs 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPE = (1, 4, 2, 1025, 1100)  # B, Hq, Hkv, Sq, Skv: the GPU test's odd lengths with GQA
# --smoke (no GPU: TRITON_INTERPRET=1 on the CPU, a check of this script's machinery, not of the kernels —
# the interpreter's bf16 dot is wrong, so every case runs in float16 there)
SMOKE_SHAPE = (1, 2, 1, 37, 45)
DEV = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
TOL = {"bfloat16": 2e-2, "float16": 4e-3}  # max abs error vs float32 on N(0, 1) inputs (tests' scale)


def cases() -> list[dict]:
    """Every SPLIT_D=1 forward config of the declared space at D=96 (bf16) and D=80 (fp16), and every split
    backward config of a D=96 training key (as tests/test_triton_flash.py::test_gpu_split_head_dim_configs)."""
    import torch
    from attntune.kernels.triton_flash.space import flash_space
    from attntune.problem import problem_from_tensors

    def meta(d, dt, sq=64, skv=64):
        return [torch.empty(1, h, s, d, dtype=dt, device="meta") for h, s in ((4, sq), (2, skv), (2, skv))]

    out = []
    for d, dt in ((96, torch.bfloat16), (80, torch.float16)):
        prob = problem_from_tensors(*meta(d, dt), causal=True)
        for cfg in flash_space(prob).grid():
            if cfg.get("SPLIT_D"):
                out.append({"d": d, "dtype": str(dt)[6:], "fwd": dict(cfg), "bwd": None})
    train = problem_from_tensors(*meta(96, torch.bfloat16), causal=True, mode="fwd_bwd")
    seen = set()
    for cfg in flash_space(train).grid():
        b = tuple((n, cfg[n]) for n in cfg if n.startswith("BWD"))
        if cfg.get("SPLIT_D") and b not in seen:
            seen.add(b)
            out.append({"d": 96, "dtype": "bfloat16", "fwd": {"SPLIT_D": 1}, "bwd": dict(b, BWD_SPLIT_D=1)})
    return out


def _case_id(c: dict) -> str:
    cfg = c["bwd"] if c["bwd"] else c["fwd"]
    return f"d{c['d']}-{'bwd' if c['bwd'] else 'fwd'}-" + "-".join(str(v) for v in cfg.values())


def run_one(c: dict) -> dict:
    """In the child: the config against a float32 reference, and the padded tile (SPLIT_D=0) as control."""
    import torch
    from attntune.kernels.reference import masked_softmax_attention
    from attntune.kernels.triton_flash.op import flash_attention
    from attntune.problem import problem_from_tensors

    B, Hq, Hkv, Sq, Skv = SHAPE if DEV == "cuda" else SMOKE_SHAPE
    dt = getattr(torch, c["dtype"]) if DEV == "cuda" else torch.float16  # (interpreter: no bf16 dot)
    g = torch.Generator().manual_seed(0)
    shapes = ((Hq, Sq), (Hkv, Skv), (Hkv, Skv))
    q, k, v = (torch.randn(B, h, s, c["d"], generator=g).to(DEV, dt) for h, s in shapes)
    grad = c["bwd"] is not None
    prob = problem_from_tensors(q, k, v, causal=True)
    rq, rk, rv = (t.detach().float().requires_grad_(grad) for t in (q, k, v))
    ref = masked_softmax_attention(rq, rk, rv, prob, compute_dtype=torch.float32)
    do = torch.randn(q.shape, generator=g).to(DEV, dt)
    if grad:
        ref.backward(do.float())
    res = {}
    for name, split in (("split", 1), ("padded", 0)):
        fwd = dict(c["fwd"], SPLIT_D=split)
        bwd = dict(c["bwd"], BWD_SPLIT_D=split) if grad else None
        qs, ks, vs = (t.detach().clone().requires_grad_(grad) for t in (q, k, v))
        out = flash_attention(qs, ks, vs, causal=True, config=fwd, bwd_config=bwd)
        errs = {"out": (out.float() - ref.detach()).abs().max().item()}
        if grad:
            out.backward(do)
            for n, got, want in (("dq", qs.grad, rq.grad), ("dk", ks.grad, rk.grad), ("dv", vs.grad, rv.grad)):
                errs[n] = (got.float() - want).abs().max().item()
        if DEV == "cuda":
            torch.cuda.synchronize()
        res[name] = errs
    return res


# ---- the hazard probe ---------------------------------------------------------------------------------
def probe_one(p: dict) -> dict:
    """In the child: a flash-like loop with one or two register-A dots (``p @ v`` [+ ``p @ v2``])."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def loop(Q, K, V, V2, O, O2, n_keys, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
             BD2: tl.constexpr, TWO: tl.constexpr):
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        d = tl.arange(0, BD)
        d2 = tl.arange(0, BD2)
        q = tl.load(Q + rows[:, None] * BD + d[None, :])
        acc = tl.zeros([BM, BD], tl.float32)
        acc2 = tl.zeros([BM, BD2], tl.float32)
        for s in range(0, n_keys, BN):
            n = s + tl.arange(0, BN)
            kt = tl.load(K + n[None, :] * BD + d[:, None])
            sc = tl.dot(q, kt) * 0.05
            pb = tl.exp(sc - tl.max(sc, 1)[:, None]).to(Q.dtype.element_ty)  # register A of the next dots
            acc = tl.dot(pb, tl.load(V + n[:, None] * BD + d[None, :]), acc)
            if TWO:
                acc2 = tl.dot(pb, tl.load(V2 + n[:, None] * BD2 + d2[None, :]), acc2)
        tl.store(O + rows[:, None] * BD + d[None, :], acc)
        tl.store(O2 + rows[:, None] * BD2 + d2[None, :], acc2)

    g = torch.Generator().manual_seed(1)
    M, N, BD, BD2 = (512, 1024, 64, p["bd2"]) if DEV == "cuda" else (p["bm"], 2 * p["bn"], 64, p["bd2"])
    dt = torch.bfloat16 if DEV == "cuda" else torch.float32  # (the interpreter's bf16 dot is wrong)
    q, k, v = (torch.randn(s, BD, generator=g).to(DEV, dt) for s in (M, N, N))
    v2 = torch.randn(N, BD2, generator=g).to(DEV, dt)
    o = torch.empty(M, BD, device=DEV)
    o2 = torch.zeros(M, BD2, device=DEV)
    loop[(M // p["bm"],)](q, k, v, v2, o, o2, N, BM=p["bm"], BN=p["bn"], BD=BD, BD2=BD2, TWO=p["two"],
                          num_warps=p["warps"], num_stages=p["stages"])
    if DEV == "cuda":
        torch.cuda.synchronize()
    # reference: per key block, the same block-local max (the kernel does not rescale: a probe, not attention)
    ref, ref2 = torch.zeros(M, BD, device=DEV), torch.zeros(M, BD2, device=DEV)
    for s in range(0, N, p["bn"]):
        sc = (q.float() @ k[s:s + p["bn"]].float().T) * 0.05
        pb = torch.exp(sc - sc.amax(1, keepdim=True)).to(dt).float()
        ref += pb @ v[s:s + p["bn"]].float()
        ref2 += pb @ v2[s:s + p["bn"]].float()
    scale = ref.abs().max().item()
    out = {"err": (o - ref).abs().max().item() / scale}
    if p["two"]:
        out["err2"] = (o2 - ref2).abs().max().item() / scale
    return out


def probes() -> list[dict]:
    return [{"bm": bm, "bn": bn, "warps": w, "stages": s, "bd2": 32, "two": two}
            for bm, bn, w in ((64, 64, 4), (64, 32, 8), (64, 128, 4), (128, 64, 8))
            for s in (1, 2, 3) for two in (0, 1)]


# ---- the parent -----------------------------------------------------------------------------------------
def _child(kind: str, payload: dict, timeout: float) -> dict:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, __file__, f"--_{kind}", json.dumps(payload)], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "s": timeout}
    s = round(time.perf_counter() - t0, 1)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode == 0 and lines:
        return dict(json.loads(lines[-1]), status="ran", s=s)
    tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
    return {"status": "crash", "rc": r.returncode, "error": " | ".join(tail)[-400:], "s": s}


def _judge(c: dict, r: dict) -> dict:
    if r.get("status") != "ran":
        return r
    tol = TOL[c["dtype"]] * (4 if c["bwd"] else 1)  # gradients: a looser bound, as the tests' backward=True
    worst = max(r["split"].values())
    r["status"] = "ok" if worst <= tol else "wrong"
    r["tol"] = tol
    return r


def sanitize(c: dict, timeout: float) -> str:
    tool = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None)
    if tool is None:
        return "compute-sanitizer: not on this machine"
    try:
        r = subprocess.run([tool, "--tool", "memcheck", "--print-limit", "8", sys.executable, __file__,
                            "--_case", json.dumps(c)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"compute-sanitizer: timed out after {timeout} s"
    return "\n".join((r.stdout + r.stderr).splitlines()[:80])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="split_d.json")
    ap.add_argument("--jobs", type=int, default=8, help="processes at once (compiles are CPU-bound)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per config process")
    ap.add_argument("--only", help="comma-separated case ids (default: all)")
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument("--limit", type=int, help="the first N cases and probes only (a smoke run)")
    ap.add_argument("--sanitizer-timeout", type=float, default=240.0)
    ap.add_argument("--_case", help=argparse.SUPPRESS)
    ap.add_argument("--_probe", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._case:
        print(json.dumps(run_one(json.loads(args._case))))
        return 0
    if args._probe:
        print(json.dumps(probe_one(json.loads(args._probe))))
        return 0

    sys.path.insert(0, str(HERE))
    from env import environment

    all_cases = cases()
    if args.only:
        want = set(args.only.split(","))
        all_cases = [c for c in all_cases if _case_id(c) in want]
    all_probes = [] if args.no_probe else probes()
    if args.limit:
        all_cases, all_probes = all_cases[:args.limit], all_probes[:args.limit]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda c: _judge(c, _child("case", c, args.timeout)), all_cases))
        probe_res = list(pool.map(lambda p: dict(p, **_child("probe", p, args.timeout)), all_probes))
    rows = [dict(id=_case_id(c), **c, **r) for c, r in zip(all_cases, results)]
    first_crash = next((c for c, r in zip(all_cases, results) if r["status"] in ("crash", "timeout")), None)
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    doc = {
        "benchmark": "diag_split_d",
        "environment": environment(),
        "summary": {"counts": counts,
                    "not_ok": [r["id"] for r in rows if r["status"] != "ok"],
                    "probe_failures": [p for p in probe_res if p.get("status") != "ran"
                                       or max(p.get("err", 1), p.get("err2", 0)) > 2e-2],
                    "elapsed_s": round(time.perf_counter() - t0, 1)},
        "rows": rows,
        "probe": probe_res,
    }
    if first_crash is not None:
        doc["sanitizer"] = {"case": _case_id(first_crash), "log": sanitize(first_crash, args.sanitizer_timeout)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["summary"], indent=1))
    for r in rows:
        if r["status"] != "ok":
            print(r["id"], r["status"], r.get("split") or r.get("error"), "padded:", r.get("padded"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
