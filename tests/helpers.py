"""Shared test helpers: random inputs, poisoning, tolerance checks."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


import torch

from attntune.tolerances import bwd_tol, fwd_tol


def rand_qkv(b, hq, hkv, sq, skv, d, dtype=torch.float32, device="cpu", dv=None, requires_grad=False, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    dv = dv or d

    def r(*shape):
        t = torch.randn(*shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
        return t.requires_grad_(requires_grad)

    return r(b, hq, sq, d), r(b, hkv, skv, d), r(b, hkv, skv, dv)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: str, backward: bool = False, tf32: bool = False,
                 what: str = "output"):
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    atol, rtol = (bwd_tol if backward else fwd_tol)(dtype, tf32)
    torch.testing.assert_close(out.to(ref.dtype), ref, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def bottom_right_mask(sq, skv, left=None):
    """Independent of attntune's mask code: row i (shifted by Skv - Sq) sees keys up to its diagonal (and,
    with ``left``, none more than ``left`` before it). Boolean ``[sq, skv]``."""
    i = torch.arange(sq)[:, None] + (skv - sq)
    j = torch.arange(skv)[None, :]
    m = j <= i
    if left is not None:
        m &= j >= i - left
    return m


def poison_like(t: torch.Tensor, value: float = float("nan")) -> torch.Tensor:
    return torch.full_like(t, value)


def bench_module(name: str):
    """A script of ``benchmarks/`` imported as a module (they import each other by bare name, as run)."""
    path = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, path)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(path)


def doctest_results(fn) -> list:
    """``(examples, failed)`` for each doctest in ``fn``'s docstring, run with ``fn`` in its globals (a
    benchmark's doctests run only through a test: ``benchmarks/`` is outside pytest's ``testpaths``)."""
    import doctest

    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    return [(len(t.examples), runner.run(t).failed) for t in finder.find(fn, fn.__name__, globs={fn.__name__: fn})]


def compiled_generate(model, ids, kw: dict, backend="eager", runs: int = 2):
    """transformers' automatic compilation of the static-cache decode step, forced on the CPU (it compiles on
    CUDA/XPU only unless told), with dynamo ``backend`` (a callable backend takes no mode): ``runs`` generates
    (two: a recompile would show) → (unique graphs, graph breaks, outputs, attntune plans that served calls)."""
    import attntune
    from torch._dynamo.utils import counters
    from transformers.generation.configuration_utils import CompileConfig

    cc = CompileConfig(backend=backend, fullgraph=False, mode=None if callable(backend) else "reduce-overhead")
    cc._compile_all_devices = True
    model.generation_config.compile_config = cc
    torch._dynamo.reset()
    counters.clear()
    plans0 = {p["key_id"]: p["calls"] for p in attntune.stats()["plans"]}
    with torch.no_grad():
        outs = [model.generate(ids, **kw) for _ in range(runs)]
    served = [p for p in attntune.stats()["plans"] if p["calls"] > plans0.get(p["key_id"], 0)]
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()), outs, served
