"""Boolean attention masks with attntune's exact semantics (see :mod:`attntune.problem`).

Used by the reference, the eager variant and SDPA backends that take ``attn_mask``.
"""

from __future__ import annotations

from typing import Optional

import torch

from attntune.problem import AttentionProblem


def needs_mask(problem: AttentionProblem) -> bool:
    """True when the mask is not expressible as plain ``is_causal`` (top-left) or nothing at all."""
    if problem.window is not None or problem.kv_lens:
        return True
    if problem.causal:
        return problem.offset != 0  # bottom-right with Sq != Skv
    return False


def has_empty_rows(problem: AttentionProblem) -> bool:
    """True when some query row admits no key at all (its output is defined as zeros)."""
    left, right = problem.window_bounds
    if problem.seqlen_kv == 0:
        return problem.seqlen_q > 0
    if right is not None and right + problem.offset < 0:  # row 0 reaches no key on the right side
        return True
    if left is not None and (problem.seqlen_q - 1) + problem.offset - left > problem.seqlen_kv - 1:
        return True
    return False


def build_mask(problem: AttentionProblem, device: torch.device | str,
               kv_lens: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """``True`` = may attend. Shape ``[Sq, Skv]``, or ``[B, 1, Sq, Skv]`` with ``kv_lens``; None if no
    mask is needed at all.

    With ``kv_lens`` and bottom-right alignment the causal/window diagonal sits at
    ``off_b = kv_lens[b] - Sq`` for each sequence (see :mod:`attntune.problem`). ``kv_lens`` values are
    clamped to ``[0, Skv]`` first, and the clamped length places the diagonal too (as the decode kernel)."""
    sq, skv = problem.seqlen_q, problem.seqlen_kv
    left, right = problem.window_bounds
    mask = None
    lens = None if kv_lens is None else kv_lens.to(device=device, dtype=torch.int64).clamp(0, skv)
    if left is not None or right is not None:
        j = torch.arange(skv, device=device).unsqueeze(0)  # [1, Skv]
        i = torch.arange(sq, device=device).unsqueeze(1)  # [Sq, 1]
        if lens is not None and problem.causal_align == "bottom_right":
            i = i.unsqueeze(0) + (lens - sq)[:, None, None]  # [B, Sq, 1]: per-sequence diagonal
        else:
            i = i + problem.offset
        mask = torch.ones(i.shape[:-1] + (skv,), dtype=torch.bool, device=device)
        if right is not None:
            mask &= j <= i + right
        if left is not None:
            mask &= j >= i - left
    if lens is not None:
        valid = torch.arange(skv, device=device).unsqueeze(0) < lens.unsqueeze(1)  # [B, Skv]
        valid = valid[:, None, None, :]
        if mask is None:
            mask = valid
        elif mask.dim() == 3:  # [B, Sq, Skv]
            mask = mask.unsqueeze(1) & valid
        else:  # [Sq, Skv]
            mask = mask[None, None] & valid
    return mask
