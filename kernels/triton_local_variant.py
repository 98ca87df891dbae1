"""``triton_local``: the same Triton flash kernels, offered only for local attention (a finite left
window, ``problem.is_local``), where visiting only the key blocks inside the window makes the cost
grow with S*W instead of S^2. A separate registry entry so that tuning, reports and the heuristic
policy can tell "local attention" apart from dense attention that merely has a window flag."""

from __future__ import annotations

from attntune.kernels.triton_flash.variant import SOURCE_MODULES, FlashVariantBase, flash_reasons

from attntune.problem import AttentionProblem


class TritonLocalVariant(FlashVariantBase):
    name = "triton_local"
    description = "Triton flash attention for sliding-window (local) problems, cost ~ S*W"
    source_modules = SOURCE_MODULES + ("attntune.kernels.triton_local_variant",)
    local = True

    def supports(self, problem: AttentionProblem) -> list[str]:
        out = flash_reasons(problem)
        if not problem.is_local:
            out.append("no finite left window: not local attention (triton_flash covers it)")
        return out


VARIANTS = [TritonLocalVariant()]
