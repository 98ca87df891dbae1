"""Nyström approximate attention (Xiong et al. 2021, "Nyströmformer"), the ``nystrom`` variant.

Softmax attention ``softmax(Q K^T s) V`` is approximated through ``m`` landmarks — segment means
``Q~`` of the queries and ``K~`` of the keys — as

    F = softmax(Q K~^T s)        [Sq, m]
    A = softmax(Q~ K~^T s)       [mq, m]
    Bm = softmax(Q~ K^T s)       [mq, Skv]
    out = F · A⁺ · (Bm · V)      [Sq, Dv]

with ``A⁺`` the Moore–Penrose pseudo-inverse by the iterative method the paper uses (Razavi et al.
2014): ``Z0 = A^T / (||A||_1 ||A||_inf)``, ``Z <- Z/4 (13 I - AZ (15 I - AZ (7 I - AZ)))``. Cost is
``O((Sq + Skv) · m · D)`` instead of ``O(Sq · Skv · D)``.

Semantics and limits:

* Non-causal only, no window, no ``kv_lens``: a landmark averages over positions a mask would hide.
* ``landmarks >= Skv``: the exact path (plain softmax attention in float32) — every key is its own
  landmark, so nothing is gained by approximating; the result is exact attention.
* Query landmarks are ``mq = min(landmarks, Sq)``; when ``Sq`` (or ``Skv``) is not a multiple of the
  landmark count the segments have ``floor`` or ``ceil`` of ``S/m`` positions, each mean over its own
  segment (no zero padding enters a mean).
* GQA: query head ``h`` uses kv head ``h // (Hq // Hkv)``; key landmarks are shared by the group.
* Computed in float32 whatever the input dtype (the pseudo-inverse iteration is unstable in 16-bit),
  returned in the input dtype. Differentiable (plain torch ops).

The error against exact attention depends on the data: small when attention rows are smooth along the
sequence (neighbouring keys alike), large for sharp, content-addressed attention. The tuner therefore
stores :func:`attntune.kernels.error.relative_error` with every approximate winner.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from attntune.kernels.base import Config, Param, Space, Variant
from attntune.kernels.error import relative_error  # noqa: F401  (re-exported for the tuner)
from attntune.problem import AttentionProblem

LANDMARKS = (16, 32, 64, 128, 256)
PINV_ITERS = (6, 12)


def segment_means(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x [..., S, D]`` -> ``[..., m, D]``: mean of each of ``m`` contiguous segments, ``1 <= m <= S``.

    Segment ``t`` covers positions ``p`` with ``floor(p*m/S) == t`` (sizes ``floor(S/m)`` or
    ``ceil(S/m)``, never empty).
    """
    S = x.shape[-2]
    if not 1 <= m <= S:
        raise ValueError(f"segment_means: need 1 <= m <= S, got m={m}, S={S}")
    if S % m == 0:
        return x.unflatten(-2, (m, S // m)).mean(-2)
    seg = torch.arange(S, device=x.device) * m // S
    counts = torch.bincount(seg, minlength=m).to(x.dtype)
    sums = x.new_zeros(x.shape[:-2] + (m, x.shape[-1])).index_add(x.dim() - 2, seg, x)
    return sums / counts[:, None]


def iterative_pinv(a: torch.Tensor, iters: int = 6) -> torch.Tensor:
    """Pseudo-inverse of ``a [..., m, n]`` -> ``[..., n, m]`` by Razavi et al.'s iteration (per matrix
    norms, so one badly scaled head does not slow the others' convergence)."""
    at = a.transpose(-1, -2)
    norm_1 = a.abs().sum(-2).amax(-1)  # max column sum
    norm_inf = a.abs().sum(-1).amax(-1)  # max row sum (1 for a row-stochastic softmax matrix)
    z = at / (norm_1 * norm_inf)[..., None, None]
    eye = torch.eye(a.shape[-2], device=a.device, dtype=a.dtype)
    for _ in range(iters):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def nystrom_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, landmarks: int = 64,
                      pinv_iters: int = 6, scale: Optional[float] = None, causal: bool = False,
                      kv_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Approximate ``softmax(q k^T scale) v`` (non-causal).

    q ``[B, Hq, Sq, D]``, k ``[B, Hkv, Skv, D]``, v ``[B, Hkv, Skv, Dv]`` -> ``[B, Hq, Sq, Dv]`` in q's
    dtype. ``landmarks >= Skv`` computes exact attention. Raises ``ValueError`` for ``causal`` or
    ``kv_lens`` (not expressible through landmarks) and for malformed inputs.
    """
    if causal:
        raise ValueError("nystrom: causal masking is not supported (a landmark averages over future keys)")
    if kv_lens is not None:
        raise ValueError("nystrom: kv_lens is not supported (landmarks would average padding)")
    if landmarks < 1 or pinv_iters < 0:
        raise ValueError(f"nystrom: landmarks must be >= 1 and pinv_iters >= 0, got {landmarks}, {pinv_iters}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"nystrom: {name} must be 4-D [B, H, S, D], got {tuple(t.shape)}")
    B, Hq, Sq, D = q.shape
    Hkv, Skv, Dv = k.shape[1], k.shape[2], v.shape[3]
    if Hq % Hkv or k.shape[0] != B or tuple(v.shape[:3]) != tuple(k.shape[:3]) or k.shape[3] != D:
        raise ValueError(f"nystrom: incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    s = float(scale) if scale is not None else D ** -0.5
    g = Hq // Hkv
    # [B, Hkv, G, Sq, D] for queries, [B, Hkv, 1, Skv, D] for keys/values: the group shares K/V.
    qf = q.float().view(B, Hkv, g, Sq, D) * s
    kf = k.float().unsqueeze(2)
    vf = v.float().unsqueeze(2)
    if landmarks >= Skv or Sq == 0:
        out = torch.softmax(qf @ kf.transpose(-1, -2), dim=-1) @ vf
        return out.reshape(B, Hq, Sq, Dv).to(q.dtype)
    k_l = segment_means(kf, landmarks)  # [B, Hkv, 1, m, D]
    q_l = segment_means(qf, min(landmarks, Sq))  # [B, Hkv, G, mq, D]
    f = torch.softmax(qf @ k_l.transpose(-1, -2), dim=-1)  # [.., Sq, m]
    a = torch.softmax(q_l @ k_l.transpose(-1, -2), dim=-1)  # [.., mq, m]
    bm = torch.softmax(q_l @ kf.transpose(-1, -2), dim=-1)  # [.., mq, Skv]
    z = iterative_pinv(a, pinv_iters)  # [.., m, mq]
    out = f @ (z @ (bm @ vf))  # cheapest order: the [Sq, Skv] product never forms
    return out.reshape(B, Hq, Sq, Dv).to(q.dtype)


class NystromVariant(Variant):
    name = "nystrom"
    exact = False
    family = "torch"
    description = "Nyström approximate attention (segment-mean landmarks, iterative pinv), non-causal"
    source_modules = ("attntune.kernels.nystrom", "attntune.kernels.error")

    def supports(self, problem: AttentionProblem) -> List[str]:
        reasons = []
        if problem.causal:
            reasons.append("causal masking not supported (landmarks average over future keys)")
        if problem.window is not None:
            reasons.append("sliding window not supported")
        if problem.kv_lens:
            reasons.append("kv_lens not supported (landmarks would average padding)")
        return reasons

    def space(self, problem: AttentionProblem) -> Space:
        return Space(
            params=(Param("landmarks", LANDMARKS), Param("pinv_iters", PINV_ITERS)),
            default={"landmarks": 64, "pinv_iters": 6},
        )

    def run(self, q, k, v, problem: AttentionProblem, config: Config,
            kv_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
        return nystrom_attention(q, k, v, landmarks=config["landmarks"], pinv_iters=config["pinv_iters"],
                                 scale=problem.scale, causal=problem.causal, kv_lens=kv_lens)


VARIANTS = [NystromVariant()]
