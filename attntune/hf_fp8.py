"""An FP8 KV cache for Hugging Face ``generate``: :class:`FP8StaticCache`.

    import attntune.hf
    from attntune.hf_fp8 import FP8StaticCache
    attntune.hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attntune")
    cache = FP8StaticCache(config=model.config, max_cache_len=prompt_len + new_tokens)
    model.generate(ids, past_key_values=cache, ...)   # transformers >= 5.24 also takes ``cache=``

transformers' :class:`~transformers.StaticCache` whose full-attention layers (:class:`FP8StaticLayer`) hold
float8 codes — half a bf16 cache's memory, and half the bytes every decode step reads. Semantics
(:mod:`attntune.fp8`): ``real = code * scale`` with one float32 scale per kv head (``[Hkv]``), fixed by the
layer's first update (the prompt: amax over batch, positions and head dim, times ``margin``, default 2, for
the tokens still to come); a later value beyond ``scale * 448`` (e4m3fn) saturates. Sliding-window layers
stay in the model's dtype (they hold W tokens, little to save).

The codes a layer returns carry their scales (a tensor attribute, ``_attntune_scale``): the attntune
attention function (:func:`attntune.hf.attention_forward`) hands them to ``attntune.attention(...,
k_scale=, v_scale=)`` — the decode steps read the codes in ``triton_decode`` on sm_89+ GPUs; prefill and
the CPU widen them first (``fp8_dequant``) — and widens them itself for HF's own SDPA path (padding, custom
masks) and for float32 models. With another attention implementation the codes would be read as numbers:
use this cache with ``attn_implementation="attntune"`` only.

Not for beam search (``reorder_cache`` of codes is untested) nor offloading.
"""

from __future__ import annotations

import math

import torch
from transformers.cache_utils import StaticCache, StaticLayer

from attntune import fp8
from attntune.fp8 import SCALE_ATTR


class FP8StaticLayer(StaticLayer):
    """A :class:`~transformers.cache_utils.StaticLayer` of float8 codes ``[B, Hkv, max_cache_len, D]`` with
    per-kv-head float32 scales ``k_scale``/``v_scale`` ``[Hkv]`` (module docstring)."""

    def __init__(self, max_cache_len: int, *, margin: float = 2.0, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                 v_layout: str = "d", **kwargs):
        super().__init__(max_cache_len=max_cache_len, **kwargs)
        if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 1.0):
            raise ValueError(f"margin: expected a finite number >= 1, got {margin!r}")
        if v_layout not in fp8.V_LAYOUTS:
            raise ValueError(f"v_layout: expected one of {list(fp8.V_LAYOUTS)}, got {v_layout!r}")
        fp8._check_format(fp8_dtype)
        self.margin, self.fp8_dtype, self.v_layout = float(margin), fp8_dtype, v_layout
        self.scaled = False  # the scales are fixed by the first update that holds tokens
        #: the append path: None — the Triton kernel where it runs (:meth:`_kernel_append`), True — the kernel
        #: (on the CPU only under TRITON_INTERPRET=1: tests), False — torch ops; the codes are the same bit for bit
        self.append_kernel = None
        self._auto_kernel = {}
        self._appender = None  # the append kernel's plan for this layer's buffers (made on first use)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        shape = (self.batch_size, self.num_heads, self.max_cache_len)
        self.keys = torch.zeros(shape + (self.k_head_dim,), dtype=self.fp8_dtype, device=self.device)
        if self.v_layout == "keys":  # [B, Hkv, Dv, L] storage seen as [B, Hkv, L, Dv] (fp8.V_LAYOUTS)
            self.values = torch.zeros(shape[:2] + (self.v_head_dim, self.max_cache_len), dtype=self.fp8_dtype,
                                      device=self.device).transpose(-1, -2)
        else:
            self.values = torch.zeros(shape + (self.v_head_dim,), dtype=self.fp8_dtype, device=self.device)
        self.k_scale = torch.ones(self.num_heads, dtype=torch.float32, device=self.device)
        self.v_scale = torch.ones(self.num_heads, dtype=torch.float32, device=self.device)
        setattr(self.keys, SCALE_ATTR, self.k_scale)
        setattr(self.values, SCALE_ATTR, self.v_scale)
        self.cumulative_length = self.cumulative_length.to(self.device)
        self._appender = None  # new buffers
        if not torch.compiler.is_compiling():  # as StaticLayer: fixed addresses for CUDA graphs
            for t in (self.keys, self.values, self.k_scale, self.v_scale, self.cumulative_length):
                torch._dynamo.mark_static_address(t)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Quantise the new states ``[B, Hkv, n, D]`` with the layer's scales into the next ``n`` slots and
        return the whole code buffers (their scales attached). Past ``max_cache_len`` (which ``generate``
        refuses before it starts) the torch path raises or asserts on the device; the kernel drops those
        tokens and never writes out of bounds."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if not self.scaled and key_states.shape[-2] > 0:
            # in place: the scale tensors keep their (static) addresses and stay attached to the codes
            self.k_scale.copy_(fp8.scales(key_states, dtype=self.fp8_dtype, margin=self.margin))
            self.v_scale.copy_(fp8.scales(value_states, dtype=self.fp8_dtype, margin=self.margin))
            self.scaled = True
        n = key_states.shape[-2]
        if self._kernel_append(key_states, value_states):
            # one launch for K and V (kernels/fp8_cache): eager generate runs this per layer and decode step on the
            # host's time (H100 VM: ~8.5 µs a torch op), where the torch path below launches 8 ops; the appender
            # is planned once for the layer's (static) buffers
            if self._appender is None:
                from attntune.kernels.fp8_cache.launch import KVAppender

                self._appender = KVAppender(self.keys, self.values, self.k_scale, self.v_scale)
            self._appender(key_states, value_states, self.cumulative_length)
        else:
            # 8 ops (fp8.quantize takes three); one new token's slot is the current length itself (a view, no op);
            # the length grows after the copies read it
            pos = self.cumulative_length.view(1) if n == 1 else torch.arange(n, device=self.device) + \
                self.cumulative_length
            # written as bytes: index_copy_ has no float8 kernel on the CPU (the bits are the same)
            kc = fp8.quantize(key_states, self.k_scale, self.fp8_dtype)
            vc = fp8.quantize(value_states, self.v_scale, self.fp8_dtype)
            self.keys.view(torch.uint8).index_copy_(2, pos, kc.view(torch.uint8))
            self.values.view(torch.uint8).index_copy_(2, pos, vc.view(torch.uint8))
        self.cumulative_length.add_(n)
        return self.keys, self.values

    def _kernel_append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """Whether this update takes the append kernel: :attr:`append_kernel` when set, else on a CUDA/ROCm
        device with Triton, for e4m3fn/e5m2 codes of float16/bfloat16/float32 states — never inside a
        ``torch.compile`` trace (Inductor fuses the torch path there itself)."""
        if torch.compiler.is_compiling():
            return False
        if self.append_kernel is not None:
            return self.append_kernel
        auto = self._auto_kernel.get((key_states.dtype, value_states.dtype, key_states.device.type))
        if auto is None:  # once per dtype pair and device: the decode steps are host-bound
            from attntune.kernels.fp8_cache.launch import FORMAT_BITS, INPUT_DTYPES
            from attntune.kernels.triton_common import HAS_TRITON

            auto = (key_states.device.type == "cuda" and HAS_TRITON and self.fp8_dtype in FORMAT_BITS
                    and key_states.dtype in INPUT_DTYPES and value_states.dtype in INPUT_DTYPES)
            self._auto_kernel[(key_states.dtype, value_states.dtype, key_states.device.type)] = auto
        return auto

    def reset(self) -> None:
        """Empty the layer for a new generation: the next prompt sets new scales."""
        super().reset()
        self.scaled = False


class FP8StaticCache(StaticCache):
    """transformers' ``StaticCache`` with :class:`FP8StaticLayer` for every full-attention layer (sliding
    layers as transformers makes them). ``margin`` (>= 1), ``fp8_dtype`` (``torch.float8_e4m3fn`` or
    ``torch.float8_e5m2``) and ``v_layout`` (``"d"`` or ``"keys"``: the values' storage order,
    :data:`attntune.fp8.V_LAYOUTS`) go to each FP8 layer; other arguments as ``StaticCache``'s."""

    def __init__(self, config, max_cache_len: int, *, margin: float = 2.0,
                 fp8_dtype: torch.dtype = torch.float8_e4m3fn, v_layout: str = "d", **kwargs):
        impl = getattr(config, "_attn_implementation", None)
        if impl not in (None, "attntune"):
            # another backend gets the FP8 codes as numbers and fails deep inside transformers
            raise ValueError(f"config: attn_implementation is {impl!r}; an FP8StaticCache needs "
                             "attn_implementation='attntune' (after attntune.hf.register())")
        super().__init__(config=config, max_cache_len=max_cache_len, **kwargs)
        self.layers = [FP8StaticLayer(layer.max_cache_len, margin=margin, fp8_dtype=fp8_dtype, v_layout=v_layout)
                       if type(layer) is StaticLayer else layer for layer in self.layers]


__all__ = ["FP8StaticCache", "FP8StaticLayer", "SCALE_ATTR"]
