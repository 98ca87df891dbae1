"""The Hugging Face backend (attn_implementation="attntune") on tiny randomly initialised models:
logits and greedy generations equal transformers' own "sdpa"/"eager" backends, with GQA, a sliding
window shorter than the sequence, padding (materialised masks) and KV-cache decode."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attntune  # noqa: E402
import attntune.hf  # noqa: E402

SEQ = 13
WINDOW = 4  # < SEQ, so the window changes the result (checked below)


pytestmark = pytest.mark.usefixtures("hf_registered")


def _config(kind: str, sliding_window=WINDOW):
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    return transformers.MistralConfig(sliding_window=sliding_window, **common)


def _models(kind: str, impls, **cfg_kw):
    """The same random weights under several attention implementations."""
    cls = transformers.LlamaForCausalLM if kind == "llama" else transformers.MistralForCausalLM
    cfg = _config(kind, **cfg_kw)
    torch.manual_seed(0)
    base = cls._from_config(copy.deepcopy(cfg), attn_implementation=impls[0]).eval()
    out = [base]
    for impl in impls[1:]:
        m = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl).eval()
        m.load_state_dict(base.state_dict())
        out.append(m)
    for m, impl in zip(out, impls):
        assert m.config._attn_implementation == impl
    return out


def _ids(batch=2, seq=SEQ, seed=1):
    return torch.randint(2, 96, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_logits_equal_sdpa_and_eager(kind):
    ours, sdpa, eager = _models(kind, ["attntune", "sdpa", "eager"])
    ids = _ids()
    with torch.no_grad():
        a, s, e = (m(ids).logits for m in (ours, sdpa, eager))
    torch.testing.assert_close(a, s, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
    plans = attntune.stats()["plans"]
    assert plans, "the attntune backend was not called"
    # canonical problems: causal ∩ window is the one window (W - 1, 0)
    want = f"B2 H4/2 S{SEQ}x{SEQ} D16 float32 " + (f"win({WINDOW - 1}, 0)" if kind == "mistral" else "causal")
    assert plans[0]["problem"].startswith(want)
    assert plans[0]["calls"] == 2  # one per layer, no mask materialised


def test_sliding_window_matters_at_this_length():
    """Guards the test above: without the window the logits differ, so ignoring it would be caught."""
    (with_w,) = _models("mistral", ["sdpa"])
    (no_w,) = _models("mistral", ["sdpa"], sliding_window=None)
    no_w.load_state_dict(with_w.state_dict())
    ids = _ids()
    with torch.no_grad():
        assert (with_w(ids).logits - no_w(ids).logits).abs().max() > 1e-3


def test_independent_kernel_matches(monkeypatch):
    """With the eager variant forced, attntune computes the window itself (no SDPA involved)."""
    monkeypatch.setenv("ATTNTUNE_POLICY", "fixed:eager")
    attntune.reset()
    ours, eager = _models("mistral", ["attntune", "eager"])
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, eager(ids).logits, atol=1e-4, rtol=1e-4)
    assert {p["variant"] for p in attntune.stats()["plans"]} == {"eager"}


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_padding_mask_goes_to_sdpa_with_the_mask(kind):
    ours, sdpa = _models(kind, ["attntune", "sdpa"])
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-5)
    assert attntune.stats()["plans"] == []  # the materialised mask went to HF's SDPA path


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_generate_with_kv_cache(kind):
    ours, sdpa = _models(kind, ["attntune", "sdpa"])
    ids = _ids(batch=2, seq=9)
    kw = dict(max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        a = ours.generate(ids, **kw)
        s = sdpa.generate(ids, **kw)
    assert torch.equal(a, s)
    problems = [p["problem"] for p in attntune.stats()["plans"]]
    # Decode steps were served by attntune (one query row over the cache), not materialised masks.
    assert any(p.startswith("B2 H4/2 S1x") for p in problems), problems
    if kind == "mistral":
        # prefill: the window; decode: HF's sliding cache keeps the last W keys, which the window covers,
        # so the canonical decode problem has no mask at all
        assert f"B2 H4/2 S9x9 D16 float32 win({WINDOW - 1}, 0) fwd" in problems
        assert f"B2 H4/2 S1x{WINDOW} D16 float32 fwd" in problems


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_generate_with_static_cache_uses_kv_lens(kind):
    """A static cache: HF's SDPA path gets a materialised mask over the whole buffer; attntune gets the
    valid lengths (no mask) and must generate exactly the same tokens with the same logits."""
    ours, sdpa = _models(kind, ["attntune", "sdpa"])
    ids = _ids(batch=2, seq=9)
    kw = dict(max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids), cache_implementation="static",
              disable_compile=True, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        a = ours.generate(ids, **kw)
        s = sdpa.generate(ids, **kw)
    assert torch.equal(a.sequences, s.sequences)
    for la, ls in zip(a.logits, s.logits):
        torch.testing.assert_close(la, ls, atol=1e-5, rtol=1e-5)
    problems = [p["problem"] for p in attntune.stats()["plans"]]
    decode = [p for p in problems if " S1x" in p]
    if kind == "llama":  # a buffer longer than the tokens: the valid lengths travel as kv_lens, on the
        # step that fills the buffer too (the same inputs every step: no recompile of a compiled step)
        assert decode and all(p.endswith("kv_lens fwd") for p in decode), problems
    else:  # HF's static sliding layer holds exactly the last W keys: nothing to mask
        assert decode == [f"B2 H4/2 S1x{WINDOW} D16 float32 fwd"], problems


def test_static_cache_with_padding_keeps_hf_masks():
    ours, sdpa = _models("llama", ["attntune", "sdpa"])
    ids = _ids(batch=2, seq=9)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    kw = dict(max_new_tokens=6, do_sample=False, attention_mask=mask, cache_implementation="static",
              disable_compile=True)
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kw), sdpa.generate(ids, **kw))
    assert attntune.stats()["plans"] == []  # every call went to HF's SDPA path with its mask


def test_mask_pattern_recognises_only_plain_causal_patterns():
    from transformers import masking_utils as mu

    assert attntune.hf.mask_pattern(mu.causal_mask_function) == ("causal", None)
    assert attntune.hf.mask_pattern(mu.sliding_window_causal_mask_function(7)) == ("sliding", 7)
    others = [mu.chunked_causal_mask_function(4, torch.zeros(2, dtype=torch.long)),
              mu.bidirectional_mask_function,
              mu.and_masks(mu.causal_mask_function, mu.sliding_window_overlay(3)),  # other order: not claimed
              mu.or_masks(mu.causal_mask_function, mu.bidirectional_mask_function),
              mu.and_masks(mu.sliding_window_overlay(3), mu.causal_mask_function, mu.bidirectional_mask_function),
              lambda b, h, q, kv: kv <= q]
    assert [attntune.hf.mask_pattern(f) for f in others] == [None] * len(others)


def test_mask_function_gives_kv_lens_for_a_static_cache_decode():
    from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function

    # a static buffer of 20 slots holding 11 tokens; the 12th is being decoded (q_offset 11 as a tensor)
    common = dict(batch_size=3, q_length=1, kv_length=20, kv_offset=0, attention_mask=torch.ones(3, 12,
                                                                                                 dtype=torch.bool))
    for fn in (causal_mask_function, sliding_window_causal_mask_function(5)):
        carrier = attntune.hf.attention_mask(q_offset=torch.tensor(11), mask_function=fn, **common)
        assert carrier.dtype == torch.int32 and carrier.shape == (3, 1, 1, 1)
        lens = attntune.hf._lens_of(carrier)
        assert lens.tolist() == [12, 12, 12] and lens.is_contiguous()
        ref = sdpa_mask(q_offset=torch.tensor(11), mask_function=fn, allow_is_causal_skip=False, **common)
        window = (4, 0) if fn is not causal_mask_function else None
        assert torch.equal(attntune.hf._mask_from_lens(lens, 1, 20, window), ref)
    # padding: exactly transformers' mask
    pad = torch.ones(3, 12, dtype=torch.bool)
    pad[1, 0] = False
    ours = attntune.hf.attention_mask(q_offset=torch.tensor(11), mask_function=causal_mask_function,
                                      **{**common, "attention_mask": pad})
    ref = sdpa_mask(q_offset=torch.tensor(11), mask_function=causal_mask_function, **{**common, "attention_mask": pad})
    assert ours.dim() == 4 and torch.equal(ours, ref)


def test_static_cache_step_that_fills_the_buffer_keeps_kv_lens():
    """The decode step that fills a static buffer (valid == Skv) still gets the kv_lens carrier (a compiled
    step must see one input set); a dynamic cache's full step (an int position) gets no mask at all."""
    from transformers.masking_utils import causal_mask_function

    common = dict(batch_size=2, q_length=1, kv_length=12, kv_offset=0, mask_function=causal_mask_function,
                  attention_mask=torch.ones(2, 12, dtype=torch.bool))
    carrier = attntune.hf.attention_mask(q_offset=torch.tensor(11), **common)
    assert attntune.hf._lens_of(carrier).tolist() == [12, 12]
    assert attntune.hf.attention_mask(q_offset=11, **common) is None


def test_traced_mask_pattern_claims_only_transformers_sliding_call():
    """Under tracing the closure of a mask function cannot be read: the sliding pattern is claimed from the
    call's declaration (local_size == config.sliding_window, no vmap, not bidirectional, not chunked), and the
    mask function compiles into the decode step without a graph break, with the position kept symbolic."""
    from transformers import masking_utils as mu

    cfg = _config("mistral", sliding_window=6)
    ok = dict(config=cfg, use_vmap=False)
    slide = mu.sliding_window_causal_mask_function(6)
    tp = attntune.hf._traced_pattern
    assert tp(mu.causal_mask_function, None, ok) == ("causal", None)
    assert tp(slide, 6, ok) == ("sliding", 6)
    assert tp(slide, 5, ok) is None  # not the model's window
    assert tp(slide, 6, {**ok, "use_vmap": True}) is None  # an extra and/or mask function
    assert tp(slide, 6, {"config": cfg}) is None  # no use_vmap declared: unknown caller
    assert tp(slide, 6, {**ok, "allow_is_bidirectional_skip": False}) is None
    assert tp(slide, 6, {**ok, "config": None}) is None
    chunked = copy.deepcopy(cfg)
    chunked.attention_chunk_size = 6
    assert tp(mu.chunked_causal_mask_function(6, torch.zeros(2, dtype=torch.long)), 6,
              {**ok, "config": chunked}) is None
    assert tp(mu.or_masks(mu.causal_mask_function, mu.bidirectional_mask_function), 6, ok) is None

    def step(pos: torch.Tensor, q_offset: int):
        carrier = attntune.hf.attention_mask(batch_size=2, q_length=1, kv_length=6, q_offset=q_offset,
                                             kv_offset=max(q_offset - 5, 0),
                                             mask_function=mu.sliding_window_causal_mask_function(6),
                                             local_size=6, **ok)
        return pos + 1, carrier

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="eager", dynamic=True)  # fullgraph: a break raises
    for q_offset in (9, 10, 11):  # a full sliding buffer: the 6 slots hold positions q_offset-5 .. q_offset
        _, carrier = compiled(torch.zeros(1), q_offset)
        assert attntune.hf._lens_of(carrier).tolist() == [6, 6]
    torch._dynamo.reset()


@pytest.mark.parametrize("kind,prompt", [("llama", 9), ("mistral", 9), ("mistral", 2)])
def test_compiled_static_generate_compiles_the_decode_step_once(kind, prompt):
    """transformers' automatic compilation of the static-cache decode step (forced on the CPU, eager
    backend: dynamo's tracing and guards without code generation) compiles as many graphs for attntune as
    for HF's SDPA path (Llama: one; Mistral: two — transformers' sliding static layer keeps a python
    position that its own cache code guards on), without a graph break, with no tensor computed from that
    symbolic position (inductor records a CUDA graph per value of a symbolic int its kernels take: one per
    step), and generates the same tokens. A prompt shorter than the window (2 < 4) decodes first into a
    filling sliding buffer, then into a full one: the carrier comes from the eager mask function while
    the buffer fills and is rebuilt inside the step once it is full (at most one graph more than SDPA's).
    The sliding-window model's mask function is made inside the traced step: reading its closure broke
    the graph (7 graphs, and 0.17x SDPA's tokens/s on an H100), and an int() of the sliding layer's
    position recompiled the step at every position."""
    from helpers import compiled_generate

    ours, sdpa = _models(kind, ["attntune", "sdpa"])
    ids = _ids(batch=2, seq=prompt)
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, attention_mask=torch.ones_like(ids),
              cache_implementation="static")
    graphs, breaks, outs, symbolic = {}, {}, {}, {}

    def backend(gm, example_inputs):
        # which tensors a symbolic int (the sliding layer's position) reaches: a compiled step's CUDA graphs
        # are keyed on the symbolic ints its kernels take — a new graph recorded for every position
        todo = [n for n, x in zip(gm.graph.find_nodes(op="placeholder"), example_inputs)
                if isinstance(x, torch.SymInt)]
        seen = set()
        while todo:
            n = todo.pop()
            for u in n.users:
                if u not in seen:
                    seen.add(u)
                    todo.append(u)
        symbolic[name] += [str(u.target) for u in seen if isinstance(u.meta.get("example_value"), torch.Tensor)]
        return gm.forward

    served = []
    for name, m in (("sdpa", sdpa), ("attntune", ours)):
        symbolic[name] = []
        graphs[name], breaks[name], outs[name], used = compiled_generate(m, ids, kw, backend=backend)
        served += used if name == "attntune" else []
    assert graphs["sdpa"] >= 1, "transformers did not compile the decode step: the test proves nothing"
    if kind == "llama":
        assert graphs == {"sdpa": 1, "attntune": 1}, graphs
    else:  # (the counts are transformers' sliding layer's: 2 full from the start, 3 with a filling phase)
        assert graphs["sdpa"] <= graphs["attntune"] <= graphs["sdpa"] + (prompt < WINDOW), graphs
    assert breaks["attntune"] == breaks["sdpa"] == 0, breaks
    assert symbolic == {"sdpa": [], "attntune": []}, symbolic
    assert any("S1x" in p["problem"] and "kv_lens" in p["problem"] for p in served), served  # decode: ours
    for a, s in zip(outs["attntune"], outs["sdpa"]):
        assert torch.equal(a, s)
    torch._dynamo.reset()


def test_dropout_in_training_goes_to_sdpa():
    cfg = _config("llama")
    cfg.attention_dropout = 0.5
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="attntune").train()
    ids = _ids()
    m(ids).logits.sum().backward()
    assert attntune.stats()["plans"] == []


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_output_attentions_keeps_the_sliding_window(cache):
    """output_attentions goes to HF's SDPA path, which applies a window only through a mask: a call our
    mask function described as "no mask" must reach it with the causal + window mask (it ran plain causal,
    the window lost: logits off by 0.3 and other tokens)."""
    ours, sdpa = _models("mistral", ["attntune", "sdpa"])
    ids = _ids()
    with torch.no_grad():
        a, s = (m(ids, output_attentions=True).logits for m in (ours, sdpa))
    torch.testing.assert_close(a, s, atol=1e-5, rtol=1e-5)
    kw = dict(max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(ids), output_attentions=True,
              return_dict_in_generate=True, output_logits=True, cache_implementation=cache, disable_compile=True)
    with torch.no_grad():
        ga, gs = ours.generate(ids, **kw), sdpa.generate(ids, **kw)
    assert torch.equal(ga.sequences, gs.sequences)
    for la, ls in zip(ga.logits, gs.logits):
        torch.testing.assert_close(la, ls, atol=1e-5, rtol=1e-5)


def test_dropout_in_training_keeps_the_sliding_window():
    """Training with attention dropout goes to HF's SDPA path: with the same RNG state its logits equal
    the "sdpa" model's, window included."""
    cfg = _config("mistral")
    cfg.attention_dropout = 0.25
    torch.manual_seed(0)
    ours = transformers.MistralForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="attntune").train()
    sdpa = transformers.MistralForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa").train()
    sdpa.load_state_dict(ours.state_dict())
    ids = _ids()
    torch.manual_seed(7)
    a = ours(ids).logits
    torch.manual_seed(7)
    s = sdpa(ids).logits
    torch.testing.assert_close(a, s, atol=1e-5, rtol=1e-5)


def test_mask_function_skips_only_aligned_unpadded_sliding_masks():
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    fn = sliding_window_causal_mask_function(WINDOW)
    common = dict(batch_size=2, mask_function=fn, local_size=WINDOW)
    # prefill without padding, decode at the end of the keys: expressible, not materialised
    assert attntune.hf.attention_mask(q_length=10, kv_length=10, **common) is None
    assert attntune.hf.attention_mask(q_length=1, kv_length=6, q_offset=9, kv_offset=4, **common) is None
    # a few rows at the end of the keys (speculative decoding): described by kv_lens, exactly
    carrier = attntune.hf.attention_mask(q_length=3, kv_length=8, q_offset=5, **common)
    lens = attntune.hf._lens_of(carrier)
    assert lens.tolist() == [8, 8]
    ref = sdpa_mask(q_length=3, kv_length=8, q_offset=5, allow_is_causal_skip=False, **common)
    assert torch.equal(attntune.hf._mask_from_lens(lens, 3, 8, (WINDOW - 1, 0)).expand_as(ref), ref)
    # padding, or a long chunk in the middle of the keys: exactly transformers' mask
    pad = torch.ones(2, 10, dtype=torch.bool)
    pad[0, 0] = False
    for kw in (dict(q_length=10, kv_length=10, attention_mask=pad), dict(q_length=20, kv_length=40, q_offset=5)):
        ours = attntune.hf.attention_mask(**common, **kw)
        ref = sdpa_mask(**common, **kw)
        assert ours is not None and torch.equal(ours, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_gpu_generate_bf16_served_by_decode_kernel(cache):
    """On a GPU the decode steps go to the Triton decode kernel (kv_lens for the static cache); logits
    stay as close to a float32 reference as HF's own SDPA path's are."""
    cfg = _config("llama")
    cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads = 256, 4, 2  # head_dim 64
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa").cuda().eval()
    models = {}
    for impl in ("attntune", "sdpa"):
        m = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=impl)
        m.load_state_dict(ref.state_dict())
        models[impl] = m.to(device="cuda", dtype=torch.bfloat16).eval()
    ids = _ids(batch=3, seq=21).cuda()
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(ids),
              output_logits=True, return_dict_in_generate=True, disable_compile=True)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        ours = models["attntune"].generate(ids, **kw)
        # the float32 reference scores attntune's own tokens (teacher forcing), so the logits compare
        full = ref(ours.sequences).logits[:, ids.shape[1] - 1:-1].float()
        theirs = models["sdpa"](ours.sequences).logits[:, ids.shape[1] - 1:-1].float()
    got = torch.stack(ours.logits, 1).float()
    err_ours = (got - full).abs().max().item()
    err_sdpa = (theirs - full).abs().max().item()
    assert err_ours <= 2 * err_sdpa + 1e-2, (err_ours, err_sdpa)
    plans = attntune.stats()["plans"]
    decode = [p for p in plans if " S1x" in p["problem"]]
    assert decode and all(p["variant"] == "triton_decode" for p in decode), plans
    if cache == "static":
        assert any(p["problem"].endswith("kv_lens fwd") for p in decode)


def test_module_attr_reads_instance_class_and_property_and_defaults_on_a_miss():
    from attntune.hf import _MISSING, _module_attr, _window_of

    class Attn(torch.nn.Module):
        is_causal = False  # class attribute

        def __init__(self):
            super().__init__()
            self.sliding_window = 4096  # instance attribute

        @property
        def scaling(self):
            return 0.5

    m = Attn()
    assert _module_attr(m, "sliding_window", None) == 4096
    assert _module_attr(m, "is_causal", True) is False
    assert _module_attr(m, "scaling", None) == 0.5
    assert _module_attr(m, "absent", "dflt") == "dflt"
    assert _window_of(m, _MISSING) == (4095, 0)  # no keyword passed: the layer's attribute
    assert _window_of(torch.nn.Linear(2, 2), _MISSING) is None  # a module without the attribute: no window
    assert _window_of(m, 8) == (7, 0)  # transformers' argument wins over the module's attribute
    assert _window_of(m, None) is None  # ... None included (a hybrid model's full-attention layer)


def test_compiled_training_step_matches_sdpa_and_splits_the_backward(monkeypatch):
    """A compiled Llama training step with ``attn_implementation="attntune"`` (inductor): loss and
    gradients equal transformers' SDPA model's, and attention's backward runs from the kept LSE (the
    plan is sdpa_default on the CPU: no recompute through run(), one aten forward and backward per layer).
    24 tokens: a traced call of at most 16 queries is described by a ``kv_lens`` carrier (decode-sized),
    which SDPA could only run with a mask."""
    from attntune.kernels import sdpa

    ours, ref = _models("llama", ["attntune", "sdpa"])
    runs = []
    real = sdpa.SdpaVariant.run
    monkeypatch.setattr(sdpa.SdpaVariant, "run", lambda self, *a, **kw: runs.append(1) or real(self, *a, **kw))
    torch._dynamo.reset()
    ids = _ids(seq=24)
    losses = []
    for m in (ours, ref):
        m.train()
        step = torch.compile(lambda ids, m=m: m(ids, labels=ids).loss)
        loss = step(ids)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=lambda s, n=name: f"{n}: {s}")
    assert runs == [] and {p["variant"] for p in attntune.stats()["plans"]} == {"sdpa_default"}
    torch._dynamo.reset()


def test_compiled_mistral_training_step_is_served_with_its_window():
    """Under torch.compile a training forward (no cache, no padding mask) of a sliding-window model is
    described, not masked: attntune serves it with the layer's window (before, transformers' materialised
    window mask sent it to HF's SDPA path), and loss and gradients equal the SDPA model's."""
    ours, ref = _models("mistral", ["attntune", "sdpa"])
    torch._dynamo.reset()
    ids = _ids(seq=24)  # > WINDOW and > 16 queries (not decode-sized)
    losses = []
    for m in (ours, ref):
        m.train()
        loss = torch.compile(lambda ids, m=m: m(ids, labels=ids).loss, backend="aot_eager")(ids)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    for (name, a), b in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=lambda s, n=name: f"{n}: {s}")
    problems = [p["problem"] for p in attntune.stats()["plans"]]
    assert problems and all(f"win({WINDOW - 1}, 0)" in p for p in problems), problems
    torch._dynamo.reset()
