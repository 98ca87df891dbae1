"""A Hugging Face transformers attention backend: ``attn_implementation="attntune"``.

    import attntune.hf
    attntune.hf.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attntune")

:func:`register` adds two entries under the name ``"attntune"``: the attention function
(:func:`attention_forward`, in ``AttentionInterface``) and a mask function (:func:`attention_mask`, in
``AttentionMaskInterface``) so that transformers builds masks for it exactly as for ``"sdpa"``, except
that a sliding-window causal mask without padding is *not* materialised when our kernels can express it.

What a layer gets, with HF's mask semantics mapped exactly onto attntune's:

* **No mask** (HF found the plain causal pattern, no padding): a causal call. HF's sliding window
  ``kv_idx > q_idx - sliding_window`` (with ``kv_idx <= q_idx``) is attntune's ``window=(W - 1, 0)``
  aligned bottom-right. The window comes from the ``sliding_window`` kwarg the model passes, else
  ``module.sliding_window``. When ``Sq > 1`` and ``Skv > Sq`` with no mask, HF means torch's *top-left*
  causal (a static cache's empty tail; HF's own SDPA path slices the keys to ``Sq`` for the same reason),
  so the keys are sliced likewise. Non-causal modules (encoders) get plain attention.
* **A materialised mask** (padding, packed sequences, image tokens, static caches): HF's own SDPA path
  with that mask (``transformers.integrations.sdpa_attention.sdpa_attention_forward``) — the same
  function ``attn_implementation="sdpa"`` uses, so results are identical.
* **Dropout in training, softcapping, attention sinks, position bias, output_attentions**: HF's SDPA
  path as well (it raises where SDPA cannot do something, as ``"sdpa"`` would).

GQA needs nothing: key/value arrive with ``Hkv`` heads and attntune takes them as they are.
Returns ``(attn_output [B, Sq, Hq, Dv], None)`` as every transformers attention function.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

NAME = "attntune"

_REGISTERED = False


def _hf_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                      sliding_window: Optional[int] = None, **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query ``[B, Hq, Sq, D]``, key/value ``[B, Hkv, Skv, D]``
    → ``([B, Sq, Hq, Dv], None)``. See the module docstring for which calls attntune serves."""
    from attntune.policies.dispatch import attention

    unsupported = (dropout != 0.0 or kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None
                   or kwargs.get("position_bias") is not None or kwargs.get("output_attentions", False)
                   or query.dim() != 4 or key.dim() != 4)
    if attention_mask is not None or unsupported:
        return _hf_sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                          sliding_window=sliding_window, **kwargs)
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    q_len, kv_len = query.shape[2], key.shape[2]
    window = None
    if is_causal:
        if q_len > 1 and kv_len > q_len:
            # No mask with Skv > Sq > 1: HF's convention is torch's top-left causal (the keys past Sq
            # are a static cache's unwritten slots); slicing makes it bottom-right-equivalent.
            key, value = key[:, :, :q_len], value[:, :, :q_len]
        sw = sliding_window if sliding_window is not None else getattr(module, "sliding_window", None)
        if sw is not None and sw > 0:
            window = (int(sw) - 1, 0)
    out = attention(query, key, value, causal=bool(is_causal), window=window, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                   mask_function=None, attention_mask: Optional[torch.Tensor] = None,
                   local_size: Optional[int] = None, allow_is_causal_skip: bool = True, **kwargs):
    """transformers' SDPA mask builder (``sdpa_mask``), plus one more case it may skip: a sliding-window
    causal mask (``local_size`` set, which HF passes only for that pattern) with no padding, whose last
    query is the last key — the queries are the last ``q_length`` positions of the keys, i.e. the
    bottom-right alignment :func:`attention_forward` then applies with ``window=(W - 1, 0)``. Only
    when ``q_length == 1`` (decode) or ``q_length == kv_length`` (prefill): for ``1 < q_length <
    kv_length`` a missing mask means top-left to HF, so it stays materialised."""
    from transformers.masking_utils import prepare_padding_mask, sdpa_mask

    if (allow_is_causal_skip and local_size is not None and mask_function is not None
            and isinstance(q_offset, int) and isinstance(kv_offset, int)
            and (q_length == 1 or q_length == kv_length)
            and q_offset + q_length == kv_offset + kv_length
            and not _tracing(attention_mask)):
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is None or bool(padding.all()):
            return None
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def _tracing(t: Optional[torch.Tensor]) -> bool:
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


__all__ = ["NAME", "register", "attention_forward", "attention_mask"]
