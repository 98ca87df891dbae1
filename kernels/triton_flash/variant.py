"""What the two flash variants share: supports() reasons and run() (config split, op call)."""

from __future__ import annotations

import importlib.util
import os

import torch
from attntune.kernels.base import Config, Variant
from attntune.kernels.triton_flash.space import flash_space

from attntune.problem import AttentionProblem

MAX_HEAD_DIM = 256
FWD_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
BWD_KEYS = ("BWD_BLOCK_M", "BWD_BLOCK_N", "BWD_WARPS", "BWD_STAGES")
HIP_KEYS = ("waves_per_eu", "matrix_instr_nonkdim")
HAS_TRITON = importlib.util.find_spec("triton") is not None
# hashed into the tuned rows' fingerprint; the Triton-importing modules only where Triton exists
# (hashing imports them), so that supports() can still say "triton is not installed"
SOURCE_MODULES = (
    (
        "attntune.kernels.triton_flash.jit_fwd",
        "attntune.kernels.triton_flash.jit_bwd",
        "attntune.kernels.triton_flash.launch",
        "attntune.kernels.triton_flash.op",
    )
    if HAS_TRITON
    else ()
) + ("attntune.kernels.triton_flash.space", "attntune.kernels.triton_flash.variant")


def flash_reasons(problem: AttentionProblem) -> list[str]:
    """Reasons the flash kernels cannot take ``problem`` here (empty = they can)."""
    out = []
    if problem.device_type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            out.append("needs a CUDA/ROCm device (or TRITON_INTERPRET=1 on the CPU)")
    elif problem.device_type != "cuda":
        out.append(f"needs a CUDA/ROCm device, got {problem.device_type}")
    if not HAS_TRITON:
        out.append("triton is not installed")
    if problem.dtype not in ("float16", "bfloat16", "float32"):
        out.append(f"{problem.dtype} not supported (float16, bfloat16, float32)")
    if problem.head_dim > MAX_HEAD_DIM:
        out.append(f"head_dim {problem.head_dim} > {MAX_HEAD_DIM}")
    if problem.head_dim_v != problem.head_dim:
        out.append("head_dim_v != head_dim")
    if problem.kv_lens:
        out.append("kv_lens (per-sequence KV lengths) not supported; the decode variant takes them")
    return out


class FlashVariantBase(Variant):
    """A variant running :func:`attntune.kernels.triton_flash.op.flash_attention`."""

    family = "triton"
    local = False
    space_depends_on_lengths = False  # flash_space reads dtype, head dim, device and mode only

    def supports(self, problem: AttentionProblem) -> list[str]:
        return flash_reasons(problem)

    def space(self, problem: AttentionProblem):
        return flash_space(problem, local=self.local)

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        problem: AttentionProblem,
        config: Config,
        kv_lens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from attntune.kernels.triton_flash.op import flash_attention  # imports triton: only when run

        hip = {key: config[key] for key in HIP_KEYS if key in config}
        fwd = {key: config[key] for key in FWD_KEYS}
        fwd.update(hip)
        bwd = None  # forward-only configs carry no backward keys: the op's default then serves
        if "BWD_BLOCK_M" in config:
            bwd = {key: config[key] for key in BWD_KEYS}
            bwd.update(hip)
        return flash_attention(
            q,
            k,
            v,
            causal=problem.causal,
            causal_align=problem.causal_align,
            window=problem.window,
            scale=problem.scale,
            config=fwd,
            bwd_config=bwd,
        )
