"""Launching compiled Triton kernels at close to the driver's cost.

``kernel[grid](*args)`` runs Triton's generic launch path on every call: bind the arguments, compute
their specialization, build the cache key (``str(options)`` included), look the compiled kernel up,
build launch metadata. On the H200 host (Triton 3.6) that is 33.5 µs of host time for a 43-argument
kernel, against 8.7 µs for calling the cached ``CompiledKernel``'s launcher directly
(``benchmarks/results/probe_host_h200.json``). Decode is host-bound, so that difference is the speed.

:class:`FastKernel` wraps a ``@triton.jit`` function. Its caller passes every argument positionally in
the kernel's parameter order (constexprs included, as values) together with a *specialization key*
that captures everything Triton specializes on for those arguments (:func:`int_class`,
:func:`ptr_class` — integer arguments equal to 1 or divisible by 16, their 32/64-bit type, pointer
alignment; the caller knows which of its arguments Triton specializes, and which are constant for its
plan). The first launch of a key goes through Triton's own path, which compiles and returns the
``CompiledKernel``; later launches of that key call ``CompiledKernel.run`` directly with the current
raw stream. A Triton without that interface (older or newer internals), the interpreter, an active
launch hook (a profiler), or a trace by ``torch.compile`` keep Triton's own path — always correct, only
slower. Users: the decode op (two kernels) and the flash op (forward and three backward kernels).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

_INT32_MAX = 2**31 - 1
_INT32_MIN = -(2**31)


def int_class(x: int) -> int:
    """Triton's specialization of an integer argument, as a small int: 1 (equal to 1: a constant),
    16 (divisible by 16), 0 (neither); plus 100 when it needs 64 bits.

    >>> [int_class(x) for x in (1, 0, 16, 4096, 7, 2**33)]
    [1, 16, 16, 16, 0, 116]
    """
    c = 1 if x == 1 else (16 if x % 16 == 0 else 0)
    return c if _INT32_MIN <= x <= _INT32_MAX else c + 100


def int_classes(*xs: int) -> tuple:
    """:func:`int_class` of several integers at once, cheaper: the class of each (1, 16 or 0), plus a
    trailing 64 when any of them needs 64 bits (the caller's key then changes with the width).

    >>> int_classes(1, 32, 7), int_classes(2**33, 1)
    ((1, 16, 0), (16, 1, 64))
    """
    out = _CLASSES.get(xs)
    if out is None:
        out = tuple([1 if x == 1 else (16 if x % 16 == 0 else 0) for x in xs])
        out = out if _INT32_MIN <= min(xs) and max(xs) <= _INT32_MAX else out + (64,)
        if len(_CLASSES) < _CLASSES_MAX:  # a model repeats a few shapes: a lookup instead of ~30 tests
            _CLASSES[xs] = out
    return out


_CLASSES: Dict[Tuple[int, ...], tuple] = {}
_CLASSES_MAX = 4096


def aligned(*ts) -> tuple:
    """:func:`ptr_class` of each tensor argument; None (an argument Triton takes as a constant) stays None."""
    return tuple([None if t is None else t.data_ptr() % 16 == 0 for t in ts])


def ptr_class(t: torch.Tensor) -> bool:
    """Triton's specialization of a pointer argument: 16-byte aligned or not."""
    return t.data_ptr() % 16 == 0


def _hook_holder():
    """Where this Triton keeps its launch hooks (``knobs.runtime`` from 3.4, ``CompiledKernel`` before)."""
    try:
        from triton import knobs

        return knobs.runtime
    except ImportError:
        from triton.compiler import CompiledKernel

        return CompiledKernel


def _hooks_active(holder) -> bool:
    """True when a launch hook is installed (a profiler such as proton): launches must then go through
    Triton's own path, which calls the hooks. Hooks are None or (Triton >= 3.5) a chain of calls."""
    for name in ("launch_enter_hook", "launch_exit_hook"):
        h = getattr(holder, name, None)
        if h is not None and (not hasattr(h, "calls") or h.calls):
            return True
    return False


class FastKernel:
    """A ``@triton.jit`` function launched through its cached ``CompiledKernel`` (module docstring)."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self._compiled: Dict[Tuple, Any] = {}
        # the interpreter has no compiled kernels: always Triton's own path there
        self.direct = os.environ.get("TRITON_INTERPRET") != "1"
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._hooks = _hook_holder() if self.direct else None

    def __call__(self, key: Tuple, grid: Tuple[int, int, int], args: Sequence[Any], num_warps: int,
                 num_stages: Optional[int], device_index: int, opts: Optional[Dict[str, Any]] = None) -> None:
        """Launch ``fn[grid](*args, num_warps=..., num_stages=...)`` on the current stream of
        ``device_index``; ``opts``, when given, are all of the launch options instead (e.g. ROCm's
        ``waves_per_eu``). ``key`` must determine Triton's specialization of ``args`` and the launch
        options: two calls with equal keys must compile to the same kernel."""
        # under a torch.compile trace Dynamo must see Triton's own launch (it records a kernel side table); the
        # flash op never gets here traced (it graph-breaks first: triton_flash/op.py), a direct decode call may
        direct = self.direct and not torch.compiler.is_compiling()
        ck = self._compiled.get((device_index, key)) if direct else None
        if ck is not None and not _hooks_active(self._hooks):
            ck.run(grid[0], grid[1], grid[2], self._raw_stream(device_index), ck.function, ck.packed_metadata,
                   None, None, None, *args)
            return
        if opts is None:
            opts = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps,
                                                                        "num_stages": num_stages}
        kernel = self.fn[grid](*args, **opts)
        if direct and ck is None and self._usable(kernel):
            self._compiled[(device_index, key)] = kernel

    def _usable(self, kernel) -> bool:
        ok = (self._raw_stream is not None and all(hasattr(kernel, a) for a in ("run", "function",
                                                                                 "packed_metadata")))
        if not ok:
            self.direct = False  # this Triton's CompiledKernel differs: keep its own launch path
        return ok

    def clear(self) -> None:
        self._compiled.clear()


__all__ = ["FastKernel", "aligned", "int_class", "int_classes", "ptr_class"]
