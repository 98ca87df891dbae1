"""Compile what an attntune Triton call launches — for a GPU this machine does not have — and count the PTX
instructions that say where its operands go. No GPU needed: a CPU machine with Triton installed compiles for
sm_90 (ptxas ships with Triton).

    python benchmarks/ptx_of.py decode --b 32 --hq 32 --hkv 8 --s 8192 --d 128 --fp8 --config '{"BLOCK_N": 128,
        "num_splits": 1, "num_warps": 4, "num_stages": 2}' [--v-layout keys] [--dump DIR]
    python benchmarks/ptx_of.py flash --b 1 --hq 16 --hkv 16 --s 1024 --d 96 --dtype float16 --causal \\
        --config '{"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}'

How: a child process runs the op under the Triton interpreter on CPU tensors of the given shapes with every
kernel launch intercepted (:class:`attntune.kernels.triton_launch.FastKernel`: the arguments are recorded and
nothing runs, so full serving shapes cost nothing); this process then compiles each recorded launch with
``triton.compile`` for ``--arch``, specialising its arguments as Triton's launcher would on a GPU (integers equal
to 1 become constants and multiples of 16 are marked divisible, except ``do_not_specialize`` ones; tensors are
16-byte aligned pointers when their data is). Give the config explicitly: on a CPU the plan's automatic
choices (splits, stages) see no GPU.

Counts are static (instructions in the PTX, not executed ones): ``ld.shared.b8`` (byte-wise shared-memory
loads), ``ldmatrix``, ``cp.async`` by width (``.cg`` 16 bytes, ``.ca`` 4-8), ``wgmma`` against ``mma.sync``,
``ld.global`` by width, conversions. What they found (2026-12-07): FP8 decode reads V's e4m3 PV operand from
shared memory a byte at a time (``benchmarks/NOTES_decode.md``).
"""
from __future__ import annotations

import argparse

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

PATTERNS = ("ld.global.b8", "ld.global.b16", "ld.global.v4", "ld.shared.b8", "ld.shared.b16", "ld.shared.v2",
            "ld.shared.v4", "st.shared", "ldmatrix", "stmatrix", "cp.async.cg", "cp.async.ca",
            "cp.async.bulk.tensor", "wgmma.mma_async", "mma.sync", "cvt.rn.f16x2.e4m3x2", "ex2.approx", "shfl.sync",
            "fma.rn.f32", "cvt.rmi.f32.f32")
TRITON_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
                "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "float8_e4m3fnuz": "fp8e4b8", "int32": "i32",
                "int64": "i64", "uint8": "u8", "int8": "i8", "bool": "i1"}


def count(ptx: str) -> dict:
    """Occurrences of each of :data:`PATTERNS` in ``ptx`` (a pattern counts every instruction it prefixes).

    >>> count("ld.shared.b8 %r1; ld.shared.b8 %r2; mma.sync.aligned.m16n8k16 ...")["ld.shared.b8"]
    2
    """
    return {p: len(re.findall(re.escape(p), ptx)) for p in PATTERNS}


def resources(ptx: str) -> dict:
    """Registers per thread and spill bytes of ``ptx``'s kernel, as ``ptxas -v`` reports them (Triton's own ptxas,
    for the ``.target`` the PTX names: what the GPU would load; static, no GPU needed)."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    target = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1).rstrip(",")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        ptxas = get_ptxas(int(re.search(r"\d+", target).group()))
        exe = getattr(ptxas, "path", ptxas)  # a NvidiaTool (Triton 3.6+), or its path
        out = subprocess.run([exe, "-v", f"--gpu-name={target}", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True)
    log = out.stdout + out.stderr

    def num(pattern):
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0

    return {"registers": num(r"Used (\d+) registers"), "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads")}


def _describe(a):
    import torch

    if isinstance(a, torch.Tensor):
        return {"tensor": str(a.dtype).removeprefix("torch."), "aligned": a.data_ptr() % 16 == 0}
    if isinstance(a, (bool, int, float, str)) or a is None:
        return {"value": a}
    if hasattr(a, "block_shape") and isinstance(getattr(a, "base", None), torch.Tensor):  # a host TensorDescriptor
        return {"desc": str(a.base.dtype).removeprefix("torch."), "block": list(a.block_shape)}
    return {"value": repr(a)}


def record(args) -> list:
    """In the child (TRITON_INTERPRET=1): run the op with launches intercepted; the recorded launches."""
    import torch

    from attntune.kernels import triton_launch

    launches = []

    def intercept(self, key, grid, a, num_warps, num_stages, device_index, opts=None):
        fn = getattr(self.fn, "fn", self.fn)
        launches.append({"module": fn.__module__, "name": fn.__name__, "args": [_describe(x) for x in a],
                         "num_warps": num_warps, "num_stages": num_stages, "opts": opts})

    triton_launch.FastKernel.__call__ = intercept
    from attntune import fp8

    dt = getattr(torch, args.dtype)
    cfg = json.loads(args.config) if args.config else None
    g = torch.Generator().manual_seed(0)
    q = torch.randn(args.b, args.hq, args.sq if args.op == "decode" else args.s, args.d, generator=g).to(dt)
    k = torch.randn(args.b, args.hkv, args.s, args.d, generator=g)
    v = torch.randn(args.b, args.hkv, args.s, args.d, generator=g)
    kw = {}
    if args.fp8:  # e4m3 K/V with per-head scales: the FP8-KV decode, or the FP8 prefill forward (#15)
        k, v, ks, vs = fp8.quantize_kv(k, v)
        kw = {"k_scale": ks, "v_scale": vs}
    else:
        k, v = k.to(dt), v.to(dt)
    if args.op == "decode":
        from attntune.kernels.triton_decode.op import decode_attention

        if args.v_layout == "keys":  # [B, Hkv, D, S] storage seen as [B, Hkv, S, D]
            v = fp8.keys_contiguous(v)
        lens = torch.full((args.b,), args.s, dtype=torch.int32)
        decode_attention(q, k, v, kv_lens=lens, causal=args.causal, config=cfg, **kw)
    else:
        from attntune.kernels.triton_flash.op import flash_attention

        window = tuple(args.window) if args.window else None
        if args.train:  # forward and backward launches: a training key's config (BWD_* knobs)
            from attntune.kernels.triton_flash.config import FlashTrainConfig

            cfg = FlashTrainConfig.from_dict(cfg) if cfg else None
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            out = flash_attention(q, k, v, causal=args.causal, window=window, config=cfg, **kw)
            # a contiguous dO, as a loss over the output gives a model (out.sum() would pass an expanded, stride-0
            # dO: scalar loads of one element, a kernel no training step runs — what the 2026-12-07 counts compiled)
            out.backward(torch.empty_like(out))
        else:
            with torch.no_grad():
                flash_attention(q, k, v, causal=args.causal, window=window, config=cfg, **kw)
    return launches


def compile_launch(launch: dict, arch: int):
    """``triton.compile`` of one recorded launch for ``sm_{arch}``, specialised as Triton's launcher would."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jit = getattr(importlib.import_module(launch["module"]), launch["name"])
    sig, constexprs, attrs = {}, {}, {}
    for i, (p, a) in enumerate(zip(jit.params, launch["args"])):
        v = a.get("value")
        if p.is_constexpr:
            sig[p.name], constexprs[p.name] = "constexpr", v
        elif "desc" in a:  # a TMA descriptor: Triton's specialisation names its dtype and block shape
            sig[p.name] = f"tensordesc<{TRITON_TYPES[a['desc']]}[{', '.join(map(str, a['block']))}]>"
        elif "tensor" in a:
            sig[p.name] = "*" + TRITON_TYPES[a["tensor"]]
            if a["aligned"]:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            if v == 1 and not p.do_not_specialize:
                sig[p.name], constexprs[p.name] = "constexpr", 1
            else:
                sig[p.name] = "i32" if -2**31 <= v < 2**31 else "i64"
                if v % 16 == 0 and not p.do_not_specialize:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            sig[p.name], constexprs[p.name] = "constexpr", v
    opts = launch["opts"] or {"num_warps": launch["num_warps"], **({"num_stages": launch["num_stages"]}
                                                                  if launch["num_stages"] is not None else {})}
    return triton.compile(ASTSource(fn=jit, signature=sig, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options=opts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("op", choices=("decode", "flash"))
    for name, default in (("b", 1), ("hq", 32), ("hkv", 8), ("sq", 1), ("s", 4096), ("d", 128)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--fp8", action="store_true", help="e4m3 K/V with per-head scales (fp8.quantize_kv)")
    ap.add_argument("--v-layout", choices=("d", "keys"), default="d", help="decode: V storage order")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", type=int, nargs=2, metavar=("LEFT", "RIGHT"), help="flash: a sliding window")
    ap.add_argument("--train", action="store_true", help="flash: forward and backward (a training config)")
    ap.add_argument("--config", help="the launch config, JSON (give it: a CPU plans for no GPU)")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--dump", help="write each launch's PTX and TTGIR here")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        print(json.dumps(record(args)))
        return
    argv = list(argv if argv is not None else sys.argv[1:])
    if os.environ.get("TRITON_INTERPRET") == "1":
        # this process's kernels are the interpreter's (no compiler behind them): compile in a clean one
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        out = subprocess.run([sys.executable, __file__, *argv], env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"compiling failed:\n{out.stderr[-3000:]}")
        print(out.stdout, end="")
        return
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, __file__, *argv, "--_child"],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"recording the launches failed:\n{out.stderr[-3000:]}")
    launches = json.loads(out.stdout.strip().splitlines()[-1])
    import triton

    print(f"triton {triton.__version__}, sm_{args.arch}: {len(launches)} launch(es)")
    for n, launch in enumerate(launches):
        k = compile_launch(launch, args.arch)
        c = {p: n_ for p, n_ in count(k.asm["ptx"]).items() if n_}
        r = resources(k.asm["ptx"])
        print(f"{launch['name']} warps={launch['num_warps']} stages={launch['num_stages']} "
              f"shared={k.metadata.shared} B regs={r['registers']} spills={r['spill_stores']}/{r['spill_loads']} B: "
              f"{json.dumps(c)}")
        if args.dump:
            d = Path(args.dump)
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{n}_{launch['name']}.ptx").write_text(k.asm["ptx"])
            (d / f"{n}_{launch['name']}.ttgir").write_text(k.asm["ttgir"])



if __name__ == "__main__":
    main()
