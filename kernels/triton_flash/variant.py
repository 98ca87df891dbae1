"""What the two flash variants share: supports() reasons and run() (config split, op call)."""

from __future__ import annotations

import torch
from attntune.kernels.base import Config, Variant
from attntune.kernels.launch_config import cached_parser
from attntune.kernels.triton_common import HAS_TRITON, device_reasons
from attntune.kernels.triton_flash.config import FlashFwdConfig, FlashTrainConfig
from attntune.kernels.triton_flash.space import flash_space

from attntune.problem import KV_DTYPES, AttentionProblem

MAX_HEAD_DIM = 256
# hashed into the tuned rows' fingerprint; the Triton-importing modules only where Triton exists
# (hashing imports them), so that supports() can still say "triton is not installed"
SOURCE_MODULES = (
    (
        "attntune.kernels.triton_flash.jit_fwd",
        "attntune.kernels.triton_flash.jit_bwd",
        "attntune.kernels.triton_flash.launch",
        "attntune.kernels.triton_flash.op",
        "attntune.kernels.triton_launch",
    )
    if HAS_TRITON
    else ()
) + ("attntune.kernels.launch_config", "attntune.kernels.triton_common", "attntune.kernels.triton_flash.config",
     "attntune.kernels.triton_flash.space", "attntune.kernels.triton_flash.variant")


def flash_reasons(problem: AttentionProblem) -> list[str]:
    """Reasons the flash kernels cannot take ``problem`` here (empty = they can)."""
    out = device_reasons(problem)
    if problem.head_dim > MAX_HEAD_DIM:
        out.append(f"head_dim {problem.head_dim} > {MAX_HEAD_DIM}")
    if problem.head_dim_v != problem.head_dim:
        out.append("head_dim_v != head_dim")
    if problem.kv_lens:
        out.append("kv_lens (per-sequence KV lengths) not supported; the decode variant takes them")
    if problem.kv_dtype is not None:
        from attntune.fp8 import device_kv_reasons

        out.extend(device_kv_reasons(problem.kv_dtype, problem.device_type))
        if problem.mode != "fwd":
            out.append("FP8 K/V: inference (fwd) only")
        if problem.dtype not in ("float16", "bfloat16"):
            out.append(f"FP8 K/V: q must be float16 or bfloat16, not {problem.dtype}")
    return out


class FlashVariantBase(Variant):
    """A variant running :func:`attntune.kernels.triton_flash.op.flash_attention`."""

    family = "triton"
    local = False
    space_depends_on_lengths = False  # flash_space reads dtype, head dim, device and mode only
    # FP8 K/V (the forward only): both dots on FP8 tensor cores, q and P quantised in the kernel
    kv_dtypes = tuple(KV_DTYPES)
    fp8_dots = True

    def supports(self, problem: AttentionProblem) -> list[str]:
        return flash_reasons(problem)

    def __init__(self) -> None:
        # stored dicts -> typed configs, parsed once per distinct dict (the runtime's plans repeat them)
        self._parse = {"fwd": cached_parser(FlashFwdConfig), "fwd_bwd": cached_parser(FlashTrainConfig)}

    def space(self, problem: AttentionProblem):
        return flash_space(problem)

    def forward_saving(self, q, k, v, problem: AttentionProblem, config: Config, kv_lens=None):
        if problem.kv_dtype is not None:
            return None
        from attntune.kernels.triton_flash.saved import forward_saving

        return forward_saving(q, k, v, causal=problem.causal, causal_align=problem.causal_align,
                              window=problem.window, scale=problem.scale, config=self._parse[problem.mode](config))

    def backward_saved(self, grad_out, q, k, v, out, lse, problem: AttentionProblem, config: Config, kv_lens=None):
        if problem.kv_dtype is not None:
            return None
        from attntune.kernels.triton_flash.saved import backward_saved

        return backward_saved(grad_out, q, k, v, out, lse, causal=problem.causal, causal_align=problem.causal_align,
                              window=problem.window, scale=problem.scale, config=self._parse[problem.mode](config))

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        problem: AttentionProblem,
        config: Config,
        kv_lens: torch.Tensor | None = None,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from attntune.kernels.triton_flash.op import flash_attention  # imports triton: only when run

        # a fwd_bwd key's config is a FlashTrainConfig (both launches); a fwd key's a FlashFwdConfig, whose
        # calls that still need gradients take the default backward
        return flash_attention(
            q,
            k,
            v,
            causal=problem.causal,
            causal_align=problem.causal_align,
            window=problem.window,
            scale=problem.scale,
            config=self._parse[problem.mode](config),
            k_scale=k_scale,
            v_scale=v_scale,
        )
