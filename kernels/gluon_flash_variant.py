"""``gluon_flash``: a Hopper (sm_90) flash-attention forward in Gluon whose softmax overlaps the tensor cores
(FlashAttention-3's intra-warpgroup pipelining, :mod:`attntune.kernels.gluon_flash.jit`, and with ``WS=1`` its
warp-specialized ping-pong, :mod:`attntune.kernels.gluon_flash.jit_ws`) — dense, causal (either alignment), sliding
windows, GQA/MQA, odd lengths, float16/bfloat16, head dims that are multiples of 8 up to 128. Prefill only
(``Sq > DECODE_MAX_SQ``: decode keys are split-K decoding's). Training (``fwd_bwd`` keys) runs this forward and
``triton_flash``'s backward kernels on its output and LSE (:mod:`attntune.kernels.gluon_flash.train`), the two
launches tuned together (:class:`~attntune.kernels.gluon_flash.config.GluonTrainConfig`).

On by default where it can run; ``ATTNTUNE_GLUON=0`` takes it out of tuning and dispatch (e.g. to compare against
the Triton kernels). Its GPU tests and odd-shape grid passed on an H100 (2026-12-07,
``benchmarks/results/probe_gluon_fwd_ws_h100_2026-12-07j.json``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import List

import torch

from attntune.kernels.base import Config, Space, Variant
from attntune.kernels.gluon_flash import train
from attntune.kernels.gluon_flash.config import (HEAD_DIM_MULTIPLE, MAX_HEAD_DIM, GluonFwdConfig, GluonTrainConfig,
                                                 constraint_reasons, default_config, default_train_config)
from attntune.kernels.gluon_flash.launch import MAX_GRID_Y, forward
from attntune.kernels.launch_config import cached_parser
from attntune.kernels.triton_flash.space import (BWD_REG_LIMIT, bwd_regs_per_thread, bwd_smem_bytes, device_arch,
                                                 smem_limit)
from attntune.kernels.triton_common import block_d
from attntune.problem import DECODE_MAX_SQ, AttentionProblem

#: the environment switch: ``0`` takes the variant out (unset or ``1``: in; anything else warns once and means 0)
ENV = "ATTNTUNE_GLUON"


@functools.cache
def _has_gluon_hopper() -> bool:
    try:
        return importlib.util.find_spec("triton.experimental.gluon.language.nvidia.hopper") is not None
    except (ImportError, ValueError):  # triton (or its experimental package) missing
        return False


def gluon_reasons(problem: AttentionProblem) -> List[str]:
    """Why the Gluon forward cannot take ``problem`` here (empty = it can)."""
    out = []
    if os.environ.get(ENV, "1").strip() not in ("", "1"):
        out.append(f"{ENV}={os.environ[ENV].strip()!r}: switched off (unset it or set 1 to use it)")
    if problem.device_type != "cuda":
        out.append("needs an NVIDIA Hopper GPU (sm_90: wgmma, TMA)")
    elif not torch.cuda.is_available():  # device_arch's CPU stand-in is for Triton's interpreter; Gluon has none
        out.append("needs an NVIDIA Hopper GPU (sm_90: wgmma, TMA); CUDA is not available")
    elif device_arch("cuda") != "sm_90":
        out.append(f"needs an NVIDIA Hopper GPU (sm_90: wgmma, TMA), this GPU is {device_arch('cuda')}")
    if not _has_gluon_hopper():
        out.append("triton.experimental.gluon (Hopper) is not installed")
    if problem.dtype not in ("float16", "bfloat16"):
        out.append(f"{problem.dtype} not supported (float16, bfloat16)")
    if problem.kv_lens:
        out.append("kv_lens (per-sequence KV lengths) not supported; the decode variant takes them")
    elif problem.seqlen_q <= DECODE_MAX_SQ:
        # a program holds 128 query rows: at Sq <= 16 it would use at most 1/8 of its tensor-core rows and read all
        # of K/V per query head (split-K decoding reads them once per GQA group); not worth the tuner's time
        out.append(f"decode (Sq <= {DECODE_MAX_SQ}): 128 query rows a program; the split-K decode variant's job")
    if problem.kv_dtype is not None:
        out.append("FP8 K/V not supported yet")
    if problem.head_dim_v != problem.head_dim:
        out.append("head_dim_v != head_dim")
    if problem.head_dim % HEAD_DIM_MULTIPLE or problem.head_dim > MAX_HEAD_DIM:
        out.append(f"head_dim {problem.head_dim}: a multiple of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM} only")
    if problem.batch * problem.heads_q > MAX_GRID_Y:
        out.append(f"batch * heads_q = {problem.batch * problem.heads_q} > {MAX_GRID_Y} (the grid's second axis)")
    return out


def train_reasons(cfg: GluonTrainConfig, problem: AttentionProblem) -> List[str]:
    """Why a training config does not fit ``problem``'s head dim and dtype: the forward's constraints, then the
    backward's shared-memory and register model — ``triton_flash``'s (:mod:`attntune.kernels.triton_flash.space`),
    whose kernels it launches."""
    d, dtype = problem.head_dim, problem.torch_dtype
    out = constraint_reasons(cfg.forward, d)
    b, limit = cfg.backward, smem_limit(device_arch(problem.device_type))
    smem = bwd_smem_bytes(b.BWD_BLOCK_M, b.BWD_BLOCK_N, block_d(d), dtype.itemsize, b.BWD_STAGES)
    if smem > limit:
        out.append(f"backward shared memory ~{smem} B > {limit} B")
    regs = bwd_regs_per_thread(b.BWD_BLOCK_M, b.BWD_BLOCK_N, block_d(d), b.BWD_WARPS)
    if regs > BWD_REG_LIMIT:
        out.append(f"backward holds ~{regs:.0f} fp32 values per thread (> {BWD_REG_LIMIT}: spills)")
    return out


class GluonFlashVariant(Variant):
    name = "gluon_flash"
    description = "Gluon Hopper flash forward: softmax overlapped with the wgmma, warp-specialized ping-pong (sm_90)"
    family = "triton"  # ATTNTUNE_TRITON=0 switches it off with the Triton kernels
    # training also runs triton_flash's backward: its modules are hashed too (an edit there stales these rows)
    source_modules = ("attntune.kernels.gluon_flash.config", "attntune.kernels.gluon_flash.launch",
                      "attntune.kernels.gluon_flash.jit", "attntune.kernels.gluon_flash.jit_ws",
                      "attntune.kernels.gluon_flash.train", "attntune.kernels.triton_flash.launch",
                      "attntune.kernels.triton_flash.jit_bwd",
                      "attntune.kernels.gluon_flash_variant")
    space_depends_on_lengths = False  # the space reads the head dim only
    # the compiled op (attntune::attention) runs eager code inside; nothing here needs tracing
    runs_in_compiled_op = True

    def __init__(self) -> None:
        self._parse = {"fwd": cached_parser(GluonFwdConfig), "fwd_bwd": cached_parser(GluonTrainConfig)}

    def supports(self, problem: AttentionProblem) -> List[str]:
        return gluon_reasons(problem)

    def space(self, problem: AttentionProblem) -> Space:
        d = problem.head_dim
        if problem.mode == "fwd_bwd":
            return GluonTrainConfig.space(default_train_config(d, problem.torch_dtype),
                                          lambda cfg: train_reasons(cfg, problem))
        return GluonFwdConfig.space(default_config(d), lambda cfg: constraint_reasons(cfg, d))

    def _mask(self, problem: AttentionProblem) -> dict:
        return dict(causal=problem.causal, causal_align=problem.causal_align, window=problem.window,
                    scale=problem.scale)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: AttentionProblem, config: Config,
            kv_lens=None) -> torch.Tensor:
        # the per-call path: keyword arguments straight from the problem (no dict built per call)
        cfg = self._parse[problem.mode](config)
        if problem.mode == "fwd_bwd":
            return train.attention(q, k, v, cfg, causal=problem.causal, causal_align=problem.causal_align,
                                   window=problem.window, scale=problem.scale)
        o, _ = forward(q, k, v, cfg, causal=problem.causal, causal_align=problem.causal_align, window=problem.window,
                       scale=problem.scale)
        return o

    def forward_saving(self, q, k, v, problem: AttentionProblem, config: Config, kv_lens=None):
        return train.forward_saving(q, k, v, self._parse["fwd_bwd"](config), **self._mask(problem))

    def backward_saved(self, grad_out, q, k, v, out, lse, problem: AttentionProblem, config: Config, kv_lens=None):
        return train.backward_saved(grad_out, q, k, v, out, lse, self._parse["fwd_bwd"](config),
                                    **self._mask(problem))


VARIANTS = [GluonFlashVariant()]
