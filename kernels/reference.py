"""Reference attention in float32/float64: the ground truth of tests and of the tuner's gate."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from attntune.kernels.masks import build_mask
from attntune.problem import AttentionProblem

# Masked scores are -inf, not a finite stand-in: with a large negative scale the admissible scores
# themselves fall below any finite floor (scale -1e30: every score about -8e30), and a masked key then
# outweighed them (audit: row 0 of a causal call attended to future keys). Rows without an admissible key
# (all -inf: softmax NaN) are replaced by zeros with ``where`` — the NaN reaches neither the output nor,
# through masked_fill's backward (zero at masked positions), any gradient.
_NEG = float("-inf")


def expand_kv(k: torch.Tensor, v: torch.Tensor, group: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """[B, Hkv, S, D] -> [B, Hkv*group, S, D] (query head h reads kv head h // group)."""
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def masked_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem,
                             kv_lens: Optional[torch.Tensor] = None, compute_dtype: Optional[torch.dtype] = None,
                             return_lse: bool = False):
    """Plain softmax(QK^T·scale + mask)·V in ``compute_dtype`` (default: the inputs' dtype, softmax in
    float32 at least). Rows without any admissible key give zeros (LSE -inf). Differentiable."""
    cd = compute_dtype or q.dtype
    sdt = torch.promote_types(cd, torch.float32)
    k, v = expand_kv(k, v, problem.group)
    s = torch.matmul(q.to(cd), k.to(cd).transpose(-2, -1)).to(sdt) * problem.softmax_scale
    mask = build_mask(problem, q.device, kv_lens)
    if mask is not None:
        s = s.masked_fill(~mask, _NEG)
        row_ok = mask.any(dim=-1, keepdim=True)
    p = torch.softmax(s, dim=-1)
    if mask is not None:
        p = torch.where(row_ok, p, p.new_zeros(()))
    out = torch.matmul(p.to(cd), v.to(cd))
    if not return_lse:
        return out
    lse = torch.logsumexp(s, dim=-1)
    if mask is not None:
        lse = lse.masked_fill(~row_ok.squeeze(-1), float("-inf"))
    return out, lse


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem,
                        kv_lens: Optional[torch.Tensor] = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Exact attention computed in ``dtype`` (float64 by default; float32 on big GPU problems)."""
    return masked_softmax_attention(q, k, v, problem, kv_lens, compute_dtype=dtype)
