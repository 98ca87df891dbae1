"""``triton_flash``: the project's Triton flash attention (forward + backward), any mask attntune knows
except kv_lens: dense, causal (either alignment), sliding windows, GQA/MQA, fp16/bf16/fp32."""

from __future__ import annotations

from attntune.kernels.triton_flash.variant import SOURCE_MODULES, FlashVariantBase


class TritonFlashVariant(FlashVariantBase):
    name = "triton_flash"
    description = "Triton flash attention fwd+bwd (causal/window/GQA, block skipping, no atomics)"
    source_modules = SOURCE_MODULES + ("attntune.kernels.triton_flash_variant",)
    local = False


VARIANTS = [TritonFlashVariant()]
