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
    # Rows written before forward_saving/backward_saved were added (base.Variant.equivalent_sources): two
    # methods that only the compiled op's backward calls (kernels/triton_flash/saved.py); run(), the
    # kernels and their launches — what a row timed — are unchanged (triton_flash, triton_local)
    equivalent_sources = {h: "forward_saving/backward_saved added (compiled backward only)"
                          for h in ("c5e7f5b6c556eeba", "b4741aae0dd8c689")}
    # and before the D<=64 16-bit default backward config changed (config.default_bwd_config): the default
    # serves untuned calls only — a row's stored config parses and runs as before
    equivalent_sources.update({h: "default backward config for D<=64 changed (untuned calls only)"
                               for h in ("afeda8c13b233cbf", "b2d8ac1b6e2aa73d")})
    # and before the kernels launched through FastKernel (kernels/triton_launch.py, now hashed too): the same
    # kernels with the same arguments, launched by the compiled kernel's launcher after the first call
    equivalent_sources.update({h: "launched through FastKernel (same kernels and arguments)"
                               for h in ("42c622b524deff6f", "7bfe9d1bb30e31e8")})
    # and before two host-side trims of the launch (an integer ceil for triton.cdiv, memoised integer classes):
    # the rows the H200 re-tuned on 2026-12-06 were timed with the same kernels and arguments
    equivalent_sources.update({h: "launch host path trimmed (same kernels and arguments)"
                               for h in ("e79dd8b43c056ecd", "52bc71fd4da7c522")})

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
