"""Whether torch's SDPA backends take a problem on a GPU, asked of torch itself (``can_use_*``).

Kept apart from :mod:`attntune.kernels.sdpa` on purpose: the SDPA variants' source hash covers that module
(their run path: what a tuned row measured), and a change here — which backends are *offered* a problem —
cannot move a stored row's output or time, so it must not stale every SDPA row of every cache.

Two traps of torch's probes, both met on the H200/H100 (torch 2.11):

* GPU backends require a mask whose last dimension has stride 1 (``check_last_dim_stride_equals_1_dense``).
  A fully broadcast probe mask (stride 0 everywhere, to allocate nothing) therefore made the efficient and
  cuDNN backends look unable to take *any* masked problem (windows, ``kv_lens``, chunked prefill): they were
  never tuned there, and ``explain`` gave a generic reason. The probe mask is one real row of ``Skv`` bytes
  broadcast over the query rows (strides ``(0, 1)``), as a materialised mask is laid out.
* ``torch.backends.cuda.can_use_*`` are bound without torch's Python warning handler: with ``debug=True``
  their reasons (``TORCH_WARN``) go straight to the process's stderr, not to :mod:`warnings` — into the
  tuner's progress bar and ``attntune explain``'s output on every GPU machine, while the reasons list stayed
  empty. The probe asks with ``debug=False`` first (silent) and only for a refusal asks again with fd 2
  captured, parsing torch's ``Warning: <reason> (function <check>)`` lines; anything else written to
  stderr meanwhile is passed through.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import tempfile
import warnings
from typing import Callable, List, Optional, Tuple

import torch
from torch.nn.attention import SDPBackend

from attntune.kernels.masks import needs_mask
from attntune.problem import AttentionProblem

_CHECKS = {
    SDPBackend.FLASH_ATTENTION: "can_use_flash_attention",
    SDPBackend.EFFICIENT_ATTENTION: "can_use_efficient_attention",
    SDPBackend.CUDNN_ATTENTION: "can_use_cudnn_attention",
}
# c10's default warning line: "[W1205 18:27:24.1357 sdp_utils_cpp.h:262] Warning: <msg> (function <fn>)"
_CPP_WARNING = re.compile(r"Warning: (.*?)(?: \(function [\w:<>~]+\))?\s*$")


def probe_tensors(backend: SDPBackend, problem: AttentionProblem, device: str = "cuda"):
    """q, k, v and mask as the SDPA variant would pass them, as views that allocate almost nothing: q/k/v
    broadcast from one ``[1, 1, 1, D]`` row (last-dim stride 1, as real inputs), K/V expanded to Hq heads
    where the backend takes no GQA (all but flash), and the mask — where the problem needs one — one row of
    ``Skv`` booleans broadcast over ``Sq`` (strides ``(0, 1)``: GPU backends refuse a mask whose last
    dimension is not contiguous)."""
    dt = problem.torch_dtype

    def view(b, h, s, d):
        return torch.empty((1, 1, 1, d), device=device, dtype=dt).expand(b, h, s, d)

    q = view(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
    expand = problem.group > 1 and backend != SDPBackend.FLASH_ATTENTION
    hk = problem.heads_q if expand else problem.heads_kv
    k = view(problem.batch, hk, problem.seqlen_kv, problem.head_dim)
    v = view(problem.batch, hk, problem.seqlen_kv, problem.head_dim_v)
    mask = None
    if needs_mask(problem):
        mask = torch.empty((1, problem.seqlen_kv), device=device, dtype=torch.bool).expand(
            problem.seqlen_q, problem.seqlen_kv)
    return q, k, v, mask, expand


def captured_warnings(fn: Callable, *args) -> Tuple[object, List[str]]:
    """``fn(*args)`` and the warnings it raised: Python ones, and C++ ones written to fd 2 (parsed from
    c10's format; other output written to fd 2 meanwhile is written back). Without a usable fd 2 the call
    runs uncaptured."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):
            return fn(*args), [str(w.message) for w in caught]
        text = ""
        try:
            with tempfile.TemporaryFile() as tmp:
                os.dup2(tmp.fileno(), 2)
                try:
                    out = fn(*args)
                finally:
                    os.dup2(saved, 2)
                tmp.seek(0)
                text = tmp.read().decode("utf-8", "replace")
        finally:
            os.close(saved)
    msgs = [str(w.message) for w in caught]
    passthrough = []
    for line in text.splitlines():
        m = _CPP_WARNING.search(line)
        if m:
            msgs.append(m.group(1).strip())
        elif line.strip():
            passthrough.append(line)
    if passthrough:
        os.write(2, ("\n".join(passthrough) + "\n").encode())
    return out, msgs


@functools.lru_cache(maxsize=4096)
def torch_gpu_reasons(backend: SDPBackend, problem: AttentionProblem, device: str = "cuda") -> List[str]:
    """Why torch's ``backend`` cannot run ``problem`` (empty = it can), in torch's own words. Backends
    without a probe in this torch (the math backend, cuDNN before torch 2.5): empty (the tuner's trial
    decides)."""
    check: Optional[Callable] = getattr(torch.backends.cuda, _CHECKS.get(backend, ""), None)
    if check is None:
        return []
    try:
        q, k, v, mask, expand = probe_tensors(backend, problem, device)
        params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, problem.causal and mask is None,
                                                problem.group > 1 and not expand)
        if check(params, False):
            return []
        _, msgs = captured_warnings(check, params, True)
    except Exception as e:  # API drift across torch versions: let the tuner's trial decide
        return [] if not isinstance(e, RuntimeError) else [f"torch rejected the probe: {e}"]
    reasons = [m.strip().splitlines()[0] for m in msgs if m.strip()]
    return reasons or [f"torch reports {backend.name} cannot run this problem"]


__all__ = ["torch_gpu_reasons", "probe_tensors", "captured_warnings"]
