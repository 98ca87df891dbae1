"""A small GPT-style decoder (random weights, no downloads) whose attention implementation is switchable.

Shapes: tokens [B, S] -> logits [B, S, vocab]. Attention per layer: q/k/v [B, H, S, D] (GQA when
``n_kv_heads < n_heads``), causal, optionally a sliding window of ``window`` keys to the left
(Mistral-style: query i attends keys i-window .. i).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab: int = 8192
    d_model: int = 1024
    n_heads: int = 16
    n_kv_heads: int = 16
    n_layers: int = 2
    window: Optional[int] = None  # keys to the left (inclusive of the diagonal: i-window .. i)


def eager_attention(q, k, v, window: Optional[int]):
    """Textbook attention: materialised scores and mask (what a model without fused attention does)."""
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    i = torch.arange(s, device=q.device)
    mask = i[None, :] > i[:, None]
    if window is not None:
        mask |= i[None, :] < i[:, None] - window
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


def sdpa_attention(q, k, v, window: Optional[int]):
    """torch SDPA default: is_causal when possible, a boolean mask for windows."""
    gqa = q.shape[1] != k.shape[1]
    if window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    s = q.shape[2]
    i = torch.arange(s, device=q.device)
    allowed = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=gqa)


def attntune_attention(q, k, v, window: Optional[int]):
    import attntune

    return attntune.attention(q, k, v, causal=True, window=None if window is None else (window, 0))


IMPLS = {"eager": eager_attention, "sdpa": sdpa_attention, "attntune": attntune_attention}


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, impl: str):
        super().__init__()
        self.cfg, self.attn_fn = cfg, IMPLS[impl]
        d, h, hkv = cfg.d_model, cfg.n_heads, cfg.n_kv_heads
        self.hd = d // h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, (h + 2 * hkv) * self.hd, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))

    def forward(self, x):
        b, s, _ = x.shape
        h, hkv, hd = self.cfg.n_heads, self.cfg.n_kv_heads, self.hd
        q, k, v = self.qkv(self.ln1(x)).split([h * hd, hkv * hd, hkv * hd], dim=-1)
        q = q.view(b, s, h, hd).transpose(1, 2)
        k = k.view(b, s, hkv, hd).transpose(1, 2)
        v = v.view(b, s, hkv, hd).transpose(1, 2)
        a = self.attn_fn(q, k, v, self.cfg.window)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h * hd))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, impl: str):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, impl) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))
