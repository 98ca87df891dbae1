"""PyTorch SDPA as variants: torch's own choice (``sdpa_default``) and each backend forced alone.

Masks that ``is_causal`` cannot express (bottom-right causal with Sq != Skv, windows, kv_lens) go in
as a materialised boolean ``attn_mask`` — the cost a user pays today without attntune. GQA goes in as
``enable_gqa`` where the backend takes it, else K/V are expanded (also a real cost, measured as such).

Per-shape setup cost counts. cuDNN builds an execution graph for every new shape: on the H200 (torch
2.11, cuDNN 9.19) the first q_len-1 call at a never-seen KV length took 35–54 ms (median; up to 0.7 s),
against ~0.06 ms for the flash backend (``benchmarks/results/probe_host_h200.json``) — and a decode loop
sees a new KV length at every step. So for decode-like problems (``Sq <= DECODE_MAX_SQ``) on GPUs,
``sdpa_cudnn`` declines and ``sdpa_default`` runs torch's choice among the other backends. Backends are
selected by setting torch's global SDPA flags around the call and restoring them (sub-µs), not with
``torch.nn.attention.sdpa_kernel`` (13 µs of host time per call measured on a CPU).
"""

from __future__ import annotations

import threading
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attntune.kernels import sdpa_saved
from attntune.kernels.base import Config, Variant
from attntune.kernels.masks import build_mask, needs_mask
from attntune.kernels.reference import expand_kv
from attntune.kernels.sdpa_probe import torch_gpu_reasons
from attntune.problem import DECODE_MAX_SQ, AttentionProblem

_GPU_DTYPES_16 = ("float16", "bfloat16")

#: (backend, getter, setter) of torch's global SDPA backend flags; None where this torch lacks one
_FLAGS = tuple(
    (be, getattr(torch._C, get, None), getattr(torch._C, set_, None))
    for be, get, set_ in (
        (SDPBackend.FLASH_ATTENTION, "_get_flash_sdp_enabled", "_set_sdp_use_flash"),
        (SDPBackend.EFFICIENT_ATTENTION, "_get_mem_efficient_sdp_enabled", "_set_sdp_use_mem_efficient"),
        (SDPBackend.MATH, "_get_math_sdp_enabled", "_set_sdp_use_math"),
        (SDPBackend.CUDNN_ATTENTION, "_get_cudnn_sdp_enabled", "_set_sdp_use_cudnn"),
    )
)
_RAW_FLAGS = all(get is not None and set_ is not None for _, get, set_ in _FLAGS)
_CUDNN_SETUP_WHY = ("cuDNN builds an execution graph per new shape (35-54 ms at every new KV length on the "
                    "H200): not for decode, whose KV length changes every step")


#: Serialises the save / set / call / restore of torch's process-wide backend flags: without it two threads
#: interleave, and the later restore writes the other thread's temporary state back for good (audit: a
#: process left with only the math or only the flash backend, so plain torch SDPA raised "No available
#: kernel"). Re-entrant: torch function modes may route a call back here. Held for the call's host time only
#: (GPU launches are asynchronous). Another thread calling torch SDPA meanwhile still sees the switched
#: flags — they are torch's, process-wide; torch's own ``sdpa_kernel`` has the same property.
_FLAGS_LOCK = threading.RLock()


def _sdpa_with(enabled: frozenset, q, k, v, kwargs):
    """torch SDPA with only the backends in ``enabled`` allowed (global flags set, then restored) — and of
    those only what the process allows now: a backend the user switched off (``torch.backends.cuda.enable_*``
    or a ``sdpa_kernel`` block) is never switched back on. None left: RuntimeError (the caller's fallback
    decides)."""
    with _FLAGS_LOCK:
        if not _RAW_FLAGS:
            with sdpa_kernel(list(enabled)):
                return _torch_sdpa(q, k, v, **kwargs)
        saved = [get() for _, get, _ in _FLAGS]
        allowed = {be for (be, _, _), on in zip(_FLAGS, saved) if on and be in enabled}
        if not allowed:
            names = ", ".join(sorted(be.name for be in enabled))
            raise RuntimeError(f"torch SDPA backend {names} is switched off in this process "
                               "(torch.backends.cuda.enable_*_sdp or a sdpa_kernel block)")
        try:
            for be, _, set_ in _FLAGS:
                set_(be in allowed)
            return _torch_sdpa(q, k, v, **kwargs)
        finally:
            for (_, _, set_), was in zip(_FLAGS, saved):
                set_(was)


# torch's own SDPA, bound at import: while ``attntune.dispatch()`` patches
# ``F.scaled_dot_product_attention``, these variants must still call torch's, not re-enter attntune.
_torch_sdpa = F.scaled_dot_product_attention


class SdpaVariant(Variant):
    """``torch.nn.functional.scaled_dot_product_attention`` with one backend forced (or none)."""

    family = "sdpa"
    space_depends_on_lengths = False  # no tunables
    source_modules = ("attntune.kernels.sdpa", "attntune.kernels.masks")

    def __init__(self, name: str, backend: Optional[SDPBackend], description: str,
                 gpu_only: bool, gpu_dtypes: tuple, native_gqa: bool):
        self.name = name
        self.backend = backend
        self.description = description
        self.gpu_only = gpu_only
        self.gpu_dtypes = gpu_dtypes
        self.native_gqa = native_gqa

    # ---- supports ---------------------------------------------------------------------------
    def supports(self, problem: AttentionProblem) -> List[str]:
        reasons = []
        gpu = problem.device_type == "cuda"
        if self.gpu_only and not gpu:
            reasons.append("needs a CUDA/ROCm device")
        if gpu and problem.dtype not in self.gpu_dtypes:
            reasons.append(f"{problem.dtype} not supported by this backend on GPU")
        if problem.seqlen_q == 0 or problem.seqlen_kv == 0:
            reasons.append("empty sequence")
        if gpu and self.backend == SDPBackend.CUDNN_ATTENTION and problem.seqlen_q <= DECODE_MAX_SQ:
            reasons.append(_CUDNN_SETUP_WHY)
        if reasons or not gpu or self.backend is None or self.backend == SDPBackend.MATH:
            return reasons
        return torch_gpu_reasons(self.backend, problem)

    # ---- run --------------------------------------------------------------------------------
    def run(self, q, k, v, problem: AttentionProblem, config: Config,
            kv_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
        mask = build_mask(problem, q.device, kv_lens) if needs_mask(problem) else None
        is_causal = problem.causal and mask is None
        gqa = problem.group > 1
        if gqa and not self.native_gqa:
            k, v = expand_kv(k, v, problem.group)
            gqa = False
        kwargs = dict(attn_mask=mask, is_causal=is_causal, scale=problem.scale)
        if gqa:
            kwargs["enable_gqa"] = True
        if self.backend is not None:
            return _sdpa_with(frozenset((self.backend,)), q, k, v, kwargs)
        if problem.seqlen_q <= DECODE_MAX_SQ and q.is_cuda:
            return _sdpa_with(_NOT_CUDNN, q, k, v, kwargs)  # torch's choice, minus cuDNN's per-shape graphs
        return _torch_sdpa(q, k, v, **kwargs)

    # ---- the compiled training op: forward and backward split (attntune.kernels.sdpa_saved) -----------
    def _split_backend(self, q) -> Tuple[bool, Optional[SDPBackend]]:
        """(whether the call may split, the backend to split it on: the forced one, None for torch's
        choice). A forced backend the process switched off splits nothing: run() refuses such a call."""
        if self.backend == SDPBackend.MATH:
            return False, None
        if self.backend is not None and q.is_cuda and not _flag_on(self.backend):
            return False, None
        return True, self.backend

    def forward_saving(self, q, k, v, problem: AttentionProblem, config: Config,
                       kv_lens: Optional[torch.Tensor] = None):
        ok, backend = self._split_backend(q)
        return sdpa_saved.forward_saving(backend, self.native_gqa, q, k, v, problem) if ok else None

    def backward_saved(self, grad_out, q, k, v, out, lse, problem: AttentionProblem, config: Config,
                       kv_lens: Optional[torch.Tensor] = None):
        ok, backend = self._split_backend(q)
        return sdpa_saved.backward_saved(backend, self.native_gqa, grad_out, q, k, v, out, lse, problem) if ok else None


def _flag_on(backend: SDPBackend) -> bool:
    """Whether torch's global flag allows ``backend`` now (True where this torch has no such flag)."""
    for be, get, _ in _FLAGS:
        if be == backend:
            return get is None or bool(get())
    return True


_NOT_CUDNN = frozenset((SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH))

VARIANTS = [
    SdpaVariant("sdpa_default", None, "torch SDPA, torch's own backend choice (on GPUs without cuDNN for "
                f"decode, Sq <= {DECODE_MAX_SQ}: per-shape graph builds)", False,
                ("float16", "bfloat16", "float32", "float64"), True),
    SdpaVariant("sdpa_flash", SDPBackend.FLASH_ATTENTION, "torch SDPA, FlashAttention-2 backend "
                "(CPU: torch's flash CPU kernel)", False, _GPU_DTYPES_16, True),
    SdpaVariant("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION, "torch SDPA, memory-efficient "
                "(xFormers/CUTLASS) backend", True, ("float16", "bfloat16", "float32"), False),
    SdpaVariant("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION, "torch SDPA, cuDNN backend", True,
                _GPU_DTYPES_16, False),
    SdpaVariant("sdpa_math", SDPBackend.MATH, "torch SDPA, math backend (composite ops)", False,
                ("float16", "bfloat16", "float32", "float64"), True),
]
