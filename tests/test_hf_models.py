"""The Hugging Face backend across model families beyond Llama/Mistral, each a tiny random float32 model on
the CPU, attntune against transformers' own backend for it ("sdpa", or "eager" where transformers has no
SDPA support): logits (all-ones and left-padded masks), greedy generation, and what went wrong before.

A sweep of ~50 model types (transformers 5.25) found, before these fixes:
* EXAONE 4 (hybrid sliding/full layers): every full-attention layer got a sliding window — the layer keeps
  ``self.sliding_window`` while passing ``sliding_window=None`` (logits off by 0.6, other tokens);
* Gemma 2 (logit softcapping): every forward raised "`sdpa` attention does not support `softcap`";
* gpt-oss (attention sinks): the sinks were dropped without a word (logits off by 0.3, other tokens);
* Bloom and MPT (attention computed in their own layers): the causal mask came back as None — Bloom
  attended to future tokens (logits off by 0.02 in this tiny model), MPT crashed.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attntune  # noqa: E402
import attntune.hf  # noqa: E402

SEQ = 11
WINDOW = 5  # < SEQ: a window changes the result
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             vocab_size=97, head_dim=16, n_embd=64, n_layer=2, n_head=4, max_position_embeddings=64, n_positions=64,
             pad_token_id=0, bos_token_id=1, eos_token_id=2, sliding_window=WINDOW, num_local_experts=2,
             num_experts_per_tok=1, d_model=64, n_heads=4, n_layers=2, max_seq_len=64)


pytestmark = pytest.mark.usefixtures("hf_registered")


def _config(model_type: str, **extra):
    try:
        cfg = transformers.AutoConfig.for_model(model_type)
    except (KeyError, ValueError):
        pytest.skip(f"transformers {transformers.__version__} has no {model_type} models")
    for k, v in {**SMALL, **extra}.items():
        if hasattr(cfg, k):
            setattr(cfg, k, v)
    if getattr(cfg, "layer_types", None) is not None:  # alternate sliding and full layers
        cfg.layer_types = ["sliding_attention", "full_attention"][: cfg.num_hidden_layers]
    return cfg


def _pair(model_type: str, reference: str, **extra):
    """(attntune model, reference model) with the same random weights."""
    cfg = _config(model_type, **extra)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=reference).eval()
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="attntune").eval()
    ours.load_state_dict(ref.state_dict())
    return ours, ref


def _ids(batch=2, seq=SEQ):
    return torch.randint(3, 90, (batch, seq), generator=torch.Generator().manual_seed(1))


def _same(ours, ref):
    ids = _ids()
    ones = torch.ones_like(ids)
    left = ones.clone()
    left[1, :3] = 0
    with torch.no_grad():
        for mask in (ones, left):
            a, r = ours(ids, attention_mask=mask).logits, ref(ids, attention_mask=mask).logits
            keep = mask.bool()
            torch.testing.assert_close(a[keep], r[keep], atol=1e-5, rtol=1e-5)
        kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
        for mask in (ones, left):
            assert torch.equal(ours.generate(ids, attention_mask=mask, **kw), ref.generate(ids, attention_mask=mask, **kw))


def test_a_hybrid_models_full_layers_get_no_window():
    """EXAONE 4 keeps ``self.sliding_window`` on its full-attention layers and passes ``sliding_window=None``
    there: None is the layer's answer (transformers' contract with windowed backends)."""
    ours, ref = _pair("exaone4", "sdpa")
    layers = ours.model.layers
    assert layers[1].self_attn.sliding_window == WINDOW and not layers[1].self_attn.is_sliding  # the trap
    _same(ours, ref)


def test_softcapping_goes_to_the_models_eager_attention():
    ours, ref = _pair("gemma2", "eager", attn_logit_softcapping=5.0)  # small cap: it changes the result
    _same(ours, ref)


def test_attention_sinks_are_kept():
    ours, ref = _pair("gpt_oss", "eager")
    with torch.no_grad():
        ours.model.layers[0].self_attn.sinks.fill_(2.0)  # large sinks: dropping them shows
        ref.model.layers[0].self_attn.sinks.fill_(2.0)
    _same(ours, ref)


@pytest.mark.parametrize("model_type", ["bloom", "mpt"])
def test_models_with_their_own_attention_get_eager_masks_and_one_warning(model_type):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours, ref = _pair(model_type, "eager")
        _same(ours, ref)
    said = [w for w in caught if "compute attention in their own layers" in str(w.message)]
    assert len(said) <= 1 and (said or model_type in attntune.hf._OWN), [str(w.message) for w in caught]
    assert attntune.hf._OWN[model_type] is True
    assert attntune.hf._OWN.get("llama") in (None, False)


def test_output_attentions_returns_the_eager_weights():
    """HF's SDPA path returns no attention weights; a call that asks for them gets the model's eager
    attention (with the sliding window as a mask), weights included."""
    ours, ref = _pair("mistral", "eager")
    ids = _ids()
    with torch.no_grad():
        a, r = ours(ids, output_attentions=True), ref(ids, output_attentions=True)
    assert all(w is not None for w in a.attentions)
    for wa, wr in zip(a.attentions, r.attentions):
        torch.testing.assert_close(wa, wr, atol=1e-6, rtol=1e-5)
    assert float(a.attentions[0][0, 0, -1, : SEQ - WINDOW].abs().max()) == 0.0  # outside the window
    torch.testing.assert_close(a.logits, r.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("model_type,reference", [("exaone4", "sdpa"), ("gemma2", "eager"), ("gpt_oss", "eager")])
def test_gpu_bf16_logits_as_close_to_float32_as_the_models_own_backend(model_type, reference):
    """On a GPU in bf16 (head dim 64, a window of 5 over 21 tokens, so attntune's own kernels serve the
    hybrid model's layers): each model's logits through attntune are as close to a float32 run of its own
    backend as that backend's bf16 logits are."""
    cfg = _config(model_type, hidden_size=256, head_dim=64, attn_logit_softcapping=5.0)
    torch.manual_seed(0)
    full = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=reference)
    full = full.cuda().eval()
    models = {}
    for impl in ("attntune", reference):
        m = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl)
        m.load_state_dict(full.state_dict())
        models[impl] = m.to(device="cuda", dtype=torch.bfloat16).eval()
    ids = _ids(batch=3, seq=21).cuda()
    with torch.no_grad():
        ref = full(ids).logits.float()
        ours = models["attntune"](ids).logits.float()
        theirs = models[reference](ids).logits.float()
    err_ours, err_theirs = (ours - ref).abs().max().item(), (theirs - ref).abs().max().item()
    assert err_ours <= 2 * err_theirs + 1e-2, (err_ours, err_theirs)


@pytest.mark.parametrize("model_type", ["qwen2", "gemma3_text", "mixtral", "exaone4"])
def test_compiled_static_generation_matches_the_models_sdpa_graph_for_graph(model_type):
    """transformers' automatic compilation of the static-cache decode step (forced on the CPU, dynamo's eager
    backend) for families beyond Llama/Mistral — sliding windows on every layer (Mixtral), hybrid sliding and
    full layers (Gemma 3, EXAONE 4), a full model whose config names a window it does not use (Qwen2): as many
    graphs as HF's SDPA path, no graph break, the same tokens, and the decode served by attntune with
    ``kv_lens`` (tests/test_hf.py has the Llama/Mistral version with the symbolic-position check)."""
    from helpers import compiled_generate

    ours, ref = _pair(model_type, "sdpa")
    ids = _ids(seq=9)
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, attention_mask=torch.ones_like(ids),
              cache_implementation="static")
    got = {name: compiled_generate(m, ids, kw) for name, m in (("sdpa", ref), ("attntune", ours))}
    torch._dynamo.reset()
    assert got["sdpa"][0] >= 1, "transformers did not compile the decode step: the test proves nothing"
    assert got["attntune"][:2] == got["sdpa"][:2] and got["attntune"][1] == 0, (got["attntune"][:2], got["sdpa"][:2])
    for a, r in zip(got["attntune"][2], got["sdpa"][2]):
        assert torch.equal(a, r)
    assert any("S1x" in p["problem"] and "kv_lens" in p["problem"] for p in got["attntune"][3]), got["attntune"][3]
