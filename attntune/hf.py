"""A Hugging Face transformers attention backend: ``attn_implementation="attntune"``.

    import attntune.hf
    attntune.hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attntune")

:func:`register` adds two entries under the name ``"attntune"``: the attention function
(:func:`attention_forward`, in ``AttentionInterface``) and a mask function (:func:`attention_mask`, in
``AttentionMaskInterface``). The mask function recognises transformers' two plain patterns — causal
(``kv_idx <= q_idx``) and sliding-window causal (``q_idx - W < kv_idx <= q_idx``), identified from the
mask function itself (under ``torch.compile``, where its closure cannot be read without breaking the
graph, from the call's declaration of the window, as transformers' own ``sdpa_mask`` reads it:
:func:`_traced_pattern`) — and, when no position is padded, hands the attention function a
description instead of a materialised ``[B, 1, Sq, Skv]`` mask:

* **None** where the keys end at the last query (prefill from position 0, a dynamic cache's decode step):
  bottom-right causal, plus ``window=(W - 1, 0)`` for a sliding layer. With ``Skv > Sq > 1`` and no mask,
  transformers means torch's top-left causal (a static cache's unwritten tail in prefill; HF's own SDPA
  path slices the keys to ``Sq`` for the same reason), so the keys are sliced likewise.
* **kv_lens** for decode (``Sq <= 16``) over a cache whose buffer is longer than what it holds —
  transformers' static cache, whose mask would otherwise hide the unwritten slots (and on the step that
  fills that buffer, so that a compiled decode step sees one input set every step):
  ``kv_lens = q_offset + Sq - kv_offset`` keys are valid, and the last ``Sq`` of them are the queries
  (attntune's bottom-right ``kv_lens`` semantics, exactly transformers' mask). It travels where the mask
  would, as an int32 tensor of shape ``[B, 1, 1, 1]`` (transformers' masks are bool or float, and
  ``generate`` passes a 4-D mask it built ahead through the model untouched). It is computed with tensor
  operations only (no host read of the cache position), so it works under CUDA graphs and
  ``torch.compile``.

Everything else gets transformers' own mask and HF's own SDPA path
(``transformers.integrations.sdpa_attention.sdpa_attention_forward``, what ``"sdpa"`` runs): padded
batches, packed sequences, chunked or custom masks, dropout in training, position bias (a call that needs
no mask on attntune's side still gets one there when its layer has a sliding window: that path applies
windows only through masks). What that path cannot do — logit softcapping (Gemma 2: it raises), attention
sinks (gpt-oss: it would drop them without a word), ``output_attentions`` (it returns no weights) — goes
to the model's own eager attention (``eager_attention_forward`` of its modeling module, what
``"eager"`` runs), with the causal/window mask made explicit and additive, as eager takes it. Models that
compute attention in their own layers rather than through transformers' attention interface (Bloom, MPT,
GPT-Neo, XGLM, …: their modeling module never reads ``ALL_ATTENTION_FUNCTIONS``) cannot be served: they
get transformers' eager masks from :func:`attention_mask` (a described ``None`` would have left them
without any causal mask) and one warning. Reading whether a 2-D padding mask is all ones needs its values: in eager mode
that is one read per forward (HF's own SDPA path does the same); under tracing (``torch.compile``) the
mask is kept unless no padding mask was given at all (then a forward without a cache — a compiled training
step — is described as None, a decode-sized one over a cache by ``kv_lens``).

GQA needs nothing: key/value arrive with ``Hkv`` heads and attntune takes them as they are. Float8 key/value
codes from :class:`attntune.hf_fp8.FP8StaticCache` carry their scales and go to ``attntune.attention(...,
k_scale=, v_scale=)``; HF's SDPA path and float32 models get them widened to numbers.
Returns ``(attn_output [B, Sq, Hq, Dv], None)`` as every transformers attention function.
"""

from __future__ import annotations

import sys
import warnings
from typing import Dict, Optional, Tuple

import torch

from attntune.fp8 import SCALE_ATTR, dequantize
from attntune.problem import DECODE_MAX_SQ

NAME = "attntune"

_REGISTERED = False
_MISSING = object()
_API_ATTENTION = None  # attntune.api.attention, imported on the first call (an import statement per call costs ~1 µs)


def _hf_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def _module_attr(module, name: str, default):
    """``getattr(module, name, default)`` without ``nn.Module.__getattr__``'s miss path: a name the module
    lacks makes that path raise and catch an AttributeError (~2 µs a call, per layer per decode step).
    An instance attribute is read from ``__dict__``; a class attribute (a property included) through
    ``getattr``; a name neither has is one ``nn.Module.__getattr__`` would only find among parameters,
    buffers or submodules, which an attention flag never is."""
    d = getattr(module, "__dict__", None)
    if d is not None and name in d:
        return d[name]
    if getattr(type(module), name, _MISSING) is _MISSING:
        return default
    return getattr(module, name, default)


def _window_of(module: torch.nn.Module, sliding_window) -> Optional[Tuple[int, int]]:
    """HF's sliding window ``kv_idx > q_idx - W`` (with causal) is attntune's ``window=(W - 1, 0)``.

    ``W`` is the call's ``sliding_window`` keyword whenever the layer passes one — None included: that is
    transformers' contract with backends that apply windows themselves (flash attention), and hybrid
    models keep ``self.sliding_window`` on their full-attention layers too while passing None there
    (EXAONE 4: ``sliding_window=self.sliding_window if self.is_sliding else None``; reading the
    attribute gave those layers a window). Only a layer that passes no keyword at all (``_MISSING``) is
    read from its ``sliding_window`` attribute."""
    sw = _module_attr(module, "sliding_window", None) if sliding_window is _MISSING else sliding_window
    return (int(sw) - 1, 0) if sw is not None and sw > 0 else None


def _lens_of(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The ``kv_lens`` ``[B]`` a mask argument carries (see the module docstring), or None."""
    if mask is None or mask.dtype != torch.int32 or mask.dim() != 4 or mask.shape[1:] != (1, 1, 1):
        return None
    return mask.reshape(mask.shape[0])


def _mask_from_lens(kv_lens: torch.Tensor, sq: int, skv: int,
                    window: Optional[Tuple[int, int]]) -> torch.Tensor:
    """The boolean ``[B, 1, Sq, Skv]`` mask a ``kv_lens`` description stands for (for HF's SDPA path):
    attntune's own causal + window + kv_lens mask (:func:`attntune.kernels.masks.build_mask`)."""
    from attntune.kernels.masks import build_mask
    from attntune.problem import AttentionProblem

    p = AttentionProblem(batch=kv_lens.shape[0], heads_q=1, heads_kv=1, seqlen_q=sq, seqlen_kv=skv,
                         head_dim=1, head_dim_v=1, dtype="float32", causal=True, window=window, kv_lens=True)
    return build_mask(p, kv_lens.device, kv_lens)


def _is_causal(module, kwargs: dict) -> bool:
    """The call's ``is_causal`` keyword, else the layer's flag (causal by default, as transformers')."""
    is_causal = kwargs.get("is_causal")
    return _module_attr(module, "is_causal", True) if is_causal is None else is_causal


def _window_mask(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 sliding_window, kwargs: dict, explicit: bool = False):
    """``(key, value, mask)`` for a call that goes to HF's SDPA path without a mask (our mask function
    described it as None). That path applies a sliding window only through a mask — with none it runs
    plain causal attention, the window lost — so a causal layer with a window gets attntune's own causal +
    window mask (bool ``[B, 1, Sq, Skv]``). With ``1 < Sq < Skv`` a missing mask means top-left causal to
    transformers (a static cache's unwritten tail): the keys are sliced to ``Sq`` first, as the
    attntune path does. Other calls are returned unchanged (mask None: HF's own ``is_causal``) — unless
    ``explicit`` (for eager attention, which knows no ``is_causal``): then a causal layer always gets its
    mask."""
    causal = _is_causal(module, kwargs)
    window = _window_of(module, sliding_window) if causal else None
    if not (window is not None or (explicit and causal)) or query.dim() != 4 or key.dim() != 4:
        return key, value, None
    sq, skv = query.shape[2], key.shape[2]
    if 1 < sq < skv:
        key, value, skv = key[:, :, :sq], value[:, :, :sq], sq
    lens = torch.full((query.shape[0],), skv, dtype=torch.int32, device=query.device)
    return key, value, _mask_from_lens(lens, sq, skv, window)


def _fp8_scales(key: torch.Tensor, value: torch.Tensor):
    """``(k_scale, v_scale)`` of FP8 cache codes (:class:`attntune.hf_fp8.FP8StaticLayer` attaches them), or
    None for float K/V. Raise ``ValueError`` naming key/value for codes that carry no scales."""
    if key.element_size() != 1 and value.element_size() != 1:
        return None
    ks, vs = getattr(key, SCALE_ATTR, None), getattr(value, SCALE_ATTR, None)
    if ks is None or vs is None:
        raise ValueError(f"key/value: {key.dtype}/{value.dtype} codes without scales; an FP8 KV cache for the "
                         f"attntune backend is attntune.hf_fp8.FP8StaticCache")
    return ks, vs


def _widened(key: torch.Tensor, value: torch.Tensor, scales, dtype: torch.dtype):
    """FP8 codes as ``dtype`` values (``code * scale``), for readers of numbers (HF's SDPA path, float32)."""
    if scales is None:
        return key, value
    return dequantize(key, scales[0]).to(dtype), dequantize(value, scales[1]).to(dtype)


_EAGER: Dict[type, object] = {}


def _eager_of(module: torch.nn.Module):
    """The layer's own eager attention function — ``eager_attention_forward`` of its modeling module,
    what ``attn_implementation="eager"`` runs (softcapping and sinks included) — or None."""
    cls = type(module)
    fn = _EAGER.get(cls, _MISSING)
    if fn is _MISSING:
        mod = sys.modules.get(cls.__module__)
        fn = getattr(mod, "eager_attention_forward", None) if mod is not None else None
        _EAGER[cls] = fn = fn if callable(fn) else None
    return fn


def _additive(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """A boolean mask (True = attend: SDPA's format, which our mask function and :func:`_mask_from_lens`
    give) as the additive float mask eager attention adds to its scores (0 or the dtype's minimum, as
    transformers' ``eager_mask``)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device))


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                      sliding_window=_MISSING, **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query ``[B, Hq, Sq, D]``, key/value ``[B, Hkv, Skv, D]``
    → ``([B, Sq, Hq, Dv], None)``. ``attention_mask`` is None, a ``kv_lens`` tensor ``[B]`` from
    :func:`attention_mask`, or a materialised mask (see the module docstring for which calls attntune
    serves). ``sliding_window``: the layer's window when it passes one (None: no window), else read from
    the layer (:func:`_window_of`)."""
    global _API_ATTENTION
    if _API_ATTENTION is None:
        from attntune.api import attention  # the API layer: it also hands the runtime its online tuner

        _API_ATTENTION = attention
    kv_lens = _lens_of(attention_mask)
    # FP8 cache codes (attntune.hf_fp8): their scales are read before any slicing; attntune's FP8 readers
    # take 16-bit queries, so a float32 model gets the values
    scales = _fp8_scales(key, value)
    if scales is not None and query.dtype not in (torch.float16, torch.bfloat16):
        key, value = _widened(key, value, scales, query.dtype)
        scales = None
    # what HF's SDPA path cannot run exactly: softcapping (it raises), sinks (it ignores them),
    # output_attentions (it returns no weights) — the model's eager attention can
    special = (kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None
               or bool(kwargs.get("output_attentions", False)))
    eager = _eager_of(module) if special else None
    unsupported = (special or dropout != 0.0 or kwargs.get("position_bias") is not None
                   or query.dim() != 4 or key.dim() != 4)
    if unsupported and kv_lens is not None:  # HF's paths take masks, not lengths
        attention_mask = _mask_from_lens(kv_lens, query.shape[2], key.shape[2],
                                         _window_of(module, sliding_window))
        kv_lens = None
    elif unsupported and attention_mask is None:
        key, value, attention_mask = _window_mask(module, query, key, value, sliding_window, kwargs,
                                                  explicit=eager is not None)
    if sliding_window is not _MISSING:  # HF's paths take it (and ignore it: windows come in masks)
        kwargs["sliding_window"] = sliding_window
    if (attention_mask is not None and kv_lens is None) or unsupported:
        key, value = _widened(key, value, scales, query.dtype)
        if eager is not None:
            return eager(module, query, key, value, _additive(attention_mask, query.dtype), dropout=dropout,
                         scaling=scaling, **kwargs)
        return _hf_sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                          **kwargs)
    is_causal = _is_causal(module, kwargs)
    window = None
    if is_causal:
        q_len, kv_len = query.shape[2], key.shape[2]
        if kv_lens is None and q_len > 1 and kv_len > q_len:
            # No mask with Skv > Sq > 1: HF's convention is torch's top-left causal (the keys past Sq
            # are a static cache's unwritten slots); slicing makes it bottom-right-equivalent.
            key, value = key[:, :, :q_len], value[:, :, :q_len]
        window = _window_of(module, sliding_window)
    elif kv_lens is not None:  # our mask function only describes causal patterns
        key, value = _widened(key, value, scales, query.dtype)
        return _hf_sdpa()(module, query, key, value,
                          _mask_from_lens(kv_lens, query.shape[2], key.shape[2], None), dropout=dropout,
                          scaling=scaling, **kwargs)
    k_scale, v_scale = scales if scales is not None else (None, None)
    out = _API_ATTENTION(query, key, value, causal=bool(is_causal), window=window, scale=scaling,
                         kv_lens=kv_lens, k_scale=k_scale, v_scale=v_scale)
    return out.transpose(1, 2).contiguous(), None


def _closure_vars(fn) -> dict:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    return {name: c.cell_contents for name, c in zip(code.co_freevars, cells)}


def mask_pattern(mask_function) -> Optional[Tuple[str, Optional[int]]]:
    """``("causal", None)`` for transformers' causal mask function, ``("sliding", W)`` for its
    sliding-window causal one (``and_masks(sliding_window_overlay(W), causal_mask_function)``), None for
    anything else (chunked, bidirectional, packed, custom or combined masks)."""
    from transformers.masking_utils import causal_mask_function

    if mask_function is causal_mask_function:
        return ("causal", None)
    if getattr(mask_function, "__name__", "") != "and_mask":
        return None
    parts = _closure_vars(mask_function).get("mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2 or parts[1] is not causal_mask_function:
        return None
    overlay = parts[0]
    if not getattr(overlay, "__qualname__", "").startswith("sliding_window_overlay."):
        return None
    w = _closure_vars(overlay).get("sliding_window")
    return ("sliding", int(w)) if isinstance(w, int) and w > 0 else None


_AND_MASK_QUALNAME = "and_masks.<locals>.and_mask"


def _traced_pattern(mask_function, local_size, kwargs: dict) -> Optional[Tuple[str, Optional[int]]]:
    """:func:`mask_pattern` for a call under tracing (``torch.compile`` of a decode step), where reading a mask
    function's closure is a graph break (dynamo cannot give ``__closure__`` of a function made in the traced
    region — transformers builds its mask functions per forward — and a break splits a compiled step, e.g.
    into several CUDA graphs with eager gaps between them).

    Causal is identified exactly (identity). The sliding pattern is identified from what dynamo can read,
    all of which must hold: the function is transformers' ``and_mask``; the call declares the window the way
    transformers' ``create_sliding_window_causal_mask`` does — ``local_size`` equal to the model's
    ``config.sliding_window`` (what transformers' own ``sdpa_mask`` trusts to skip the mask) and not its
    ``attention_chunk_size`` (chunked attention passes its chunk as ``local_size``); ``use_vmap=False``
    (an extra ``and_mask_function``/``or_mask_function`` sets it); no ``allow_is_bidirectional_skip``
    (the bidirectional sliding mask passes it). The remaining ``and_mask`` a model makes without vmap is
    transformers' packed-sequence mask, which it only builds without a cache — :func:`_described` describes
    traced calls only for decode, whose callers hold a cache. Anything else: None (transformers' mask)."""
    from transformers.masking_utils import causal_mask_function

    if mask_function is causal_mask_function:
        return ("causal", None)
    config = kwargs.get("config")
    if (getattr(mask_function, "__qualname__", None) != _AND_MASK_QUALNAME or config is None
            or kwargs.get("use_vmap", True) is not False or "allow_is_bidirectional_skip" in kwargs
            or not isinstance(local_size, int) or local_size <= 0
            or getattr(config, "sliding_window", None) != local_size
            or getattr(config, "attention_chunk_size", None) == local_size):
        return None
    return ("sliding", local_size)


def _no_padding(attention_mask: Optional[torch.Tensor], start: int, stop: int) -> bool:
    """True when the 2-D padding mask admits every key position in ``[start, stop)`` (reads its values:
    eager only). Positions past the mask's length count as padding, as transformers pads with False."""
    if attention_mask is None:
        return True
    if attention_mask.dim() != 2 or attention_mask.shape[-1] < stop:
        return False
    return bool(attention_mask[:, start:stop].all())


def _kv_lens(batch_size: int, q_length: int, q_offset, kv_offset: int, device,
             kv_length: Optional[int] = None) -> torch.Tensor:
    """``q_offset + Sq - kv_offset`` valid keys per sequence as a contiguous int32 ``[B, 1, 1, 1]`` tensor
    (the mask-shaped carrier :func:`_lens_of` reads), with tensor operations only when ``q_offset`` is a
    tensor (a static cache's position under tracing: no host read)."""
    if isinstance(q_offset, torch.Tensor):
        n = (q_offset.reshape(()).to(device=device, dtype=torch.int32) + (q_length - kv_offset))
        return n.expand(batch_size).contiguous().view(batch_size, 1, 1, 1)
    # No int(): under tracing an offset may be a SymInt (transformers' sliding static layer keeps its position
    # as a python int, which dynamo makes dynamic), and int() would specialise the compiled step on it — a
    # recompile every step. Nor should the position reach a kernel: a compiled step's CUDA graphs are keyed
    # on the symbolic ints its kernels take (inductor records a new graph for each value: one per step, 4.8x
    # slower than SDPA's step on an H100). Once the sliding buffer is full every slot is valid: that is a
    # guard on a relation (one graph for "full", one for "filling"), and the carrier holds a constant.
    # (dynamo reports a SymInt as an int to isinstance: the test is the comparison itself, a no-op in eager)
    n = q_offset + q_length - kv_offset
    if kv_length is not None and n == kv_length:
        n = kv_length
    return torch.full((batch_size, 1, 1, 1), n, dtype=torch.int32, device=device)


def _described(batch_size: int, q_length: int, kv_length: int, q_offset, kv_offset: int,
               attention_mask: Optional[torch.Tensor], device):
    """For a plain causal pattern: None (no mask needed), a ``kv_lens`` carrier, or ``...`` (Ellipsis:
    only a materialised mask says it). Buffer slot ``j`` holds position ``kv_offset + j``; query ``i`` is
    position ``q_offset + i``; so ``valid = q_offset + Sq - kv_offset`` slots are filled, and the queries
    are the last ``Sq`` of them."""
    if _tracing(attention_mask) or _tracing(q_offset):
        # no values can be read: only a call without any padding mask can be described
        if attention_mask is None and q_length <= DECODE_MAX_SQ:
            return _kv_lens(batch_size, q_length, q_offset, kv_offset, device, kv_length)
        if (attention_mask is None and not isinstance(q_offset, torch.Tensor) and q_offset == 0 and kv_offset == 0
                and q_length == kv_length):
            # a forward without cache or padding (a compiled training step): the keys end at the last query,
            # as in eager mode below — nothing to mask (a sliding layer's window comes from the layer). Before,
            # a compiled Mistral training step got transformers' materialised window mask and HF's SDPA path.
            return None
        return ...
    q_off = q_offset if isinstance(q_offset, int) else int(q_offset)  # one read of a static cache's position
    valid = q_off + q_length - kv_offset
    if not 0 < valid <= kv_length or not _no_padding(attention_mask, kv_offset, q_off + q_length):
        return ...
    if valid == kv_length and (q_length == 1 or q_length == kv_length):
        # the keys end at the last query: bottom-right = top-left here, nothing to mask (with 1 < Sq < Skv
        # a missing mask means top-left to transformers: described by kv_lens below) — except a static
        # cache's decode step (a tensor position) that fills its buffer: it keeps the kv_lens carrier of
        # every other step, so that a compiled decode step sees the same inputs each step (None here made
        # torch.compile recompile it on the last step of every generate that fills the cache)
        if not (q_length == 1 and isinstance(q_offset, torch.Tensor)):
            return None
    if q_off == 0 and kv_offset == 0 and q_length > 1:
        return None  # prefill into a longer buffer: causal over the first Sq keys (the forward slices)
    if q_length <= DECODE_MAX_SQ:
        return _kv_lens(batch_size, q_length, q_off, kv_offset, device)
    return ...


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                   mask_function=None, attention_mask: Optional[torch.Tensor] = None,
                   local_size: Optional[int] = None, allow_is_causal_skip: bool = True, **kwargs):
    """transformers' mask-interface signature (``sdpa_mask``'s): None or a ``kv_lens`` tensor where the
    mask is one of the plain causal patterns without padding (module docstring), else exactly
    ``sdpa_mask``'s mask."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    config = kwargs.get("config")
    if config is not None and _own_attention(config):
        return eager_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                          kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                          local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)
    if mask_function is None:
        pattern = None
    elif _tracing(attention_mask) or _tracing(q_offset):
        pattern = _traced_pattern(mask_function, local_size, kwargs)
    else:
        pattern = mask_pattern(mask_function)
    if pattern is not None and isinstance(kv_offset, int):  # (a SymInt passes: dynamo reports it as an int)
        out = _described(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask,
                         kwargs.get("device", "cpu"))
        if out is not ...:
            return out
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)


_OWN: Dict[str, bool] = {}


def _own_attention(config) -> bool:
    """Whether the model of ``config`` computes attention in its own layers, never through transformers'
    attention interface (its modeling module does not read ``ALL_ATTENTION_FUNCTIONS``: Bloom, MPT,
    GPT-Neo, XGLM, …): attntune cannot serve it, and it takes the masks it gets as they are. Warns once
    per model type. Unknown model types (custom code) count as served."""
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str):
        return False
    own = _OWN.get(model_type)
    if own is None:
        own = False
        try:
            import transformers
            from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

            name = MODEL_MAPPING_NAMES.get(model_type)
            cls = getattr(transformers, name, None) if isinstance(name, str) else None
            mod = sys.modules.get(cls.__module__) if cls is not None else None
            own = mod is not None and "ALL_ATTENTION_FUNCTIONS" not in vars(mod)
        except Exception:  # noqa: BLE001 — a transformers without these tables: assume served
            own = False
        _OWN[model_type] = own
        if own:
            warnings.warn(f"attntune: {model_type} models compute attention in their own layers, not through "
                          f"transformers' attention interface: attn_implementation='attntune' cannot serve them "
                          f"(they run their own eager attention, with eager masks)", stacklevel=3)
    return own


def _tracing(t) -> bool:
    # Reading mask values under torch.compile/export would break the graph: keep the mask there.
    if torch.compiler.is_compiling():
        return True
    return t is not None and isinstance(t, torch.fx.Proxy)


def register() -> None:
    """Register ``"attntune"`` with transformers (idempotent). Raises ImportError without transformers."""
    global _REGISTERED
    if _REGISTERED:
        return
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError("attntune.hf.register() needs transformers (pip install transformers)") from e
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, attention_mask)
    _REGISTERED = True


__all__ = ["NAME", "register", "attention_forward", "attention_mask", "mask_pattern"]
