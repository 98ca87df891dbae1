"""The FP8 KV cache for HF generate (attntune.hf_fp8.FP8StaticCache) on tiny random models: a generation
through it equals one over the dequantised cache (HF's own SDPA over a float cache holding exactly those
values), stays close to the float generation, leaves sliding layers alone, and refuses codes without
scales."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attntune  # noqa: E402
import attntune.hf  # noqa: E402
from attntune import fp8  # noqa: E402
from attntune.hf_fp8 import FP8StaticCache, FP8StaticLayer  # noqa: E402
from transformers.cache_utils import StaticCache, StaticLayer  # noqa: E402

# the tiny models of the HF backend tests, and their set-up (register the backend, reset the runtime)
from test_hf import WINDOW, _config  # noqa: E402,F401

pytestmark = pytest.mark.usefixtures("hf_registered")


def _models(kind: str, impls, dtype=torch.float32, device="cpu"):
    cls = transformers.LlamaForCausalLM if kind == "llama" else transformers.MistralForCausalLM
    cfg = _config(kind)
    torch.manual_seed(0)
    base = cls._from_config(copy.deepcopy(cfg), attn_implementation=impls[0])
    out = [base]
    for impl in impls[1:]:
        m = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl)
        m.load_state_dict(base.state_dict())
        out.append(m)
    return [m.to(device=device, dtype=dtype).eval() for m in out]


def _ids(batch=2, seq=9, seed=1, device="cpu"):
    return torch.randint(2, 96, (batch, seq), generator=torch.Generator().manual_seed(seed)).to(device)


class _DequantLayer(StaticLayer):
    """The reference: a float static layer holding exactly the values an FP8 layer's codes stand for (the
    same scales from the first update, each token quantised then dequantised)."""

    def __init__(self, max_cache_len: int, margin: float):
        super().__init__(max_cache_len=max_cache_len)
        self.margin, self.scales = margin, None

    def update(self, key_states, value_states, *args, **kwargs):
        if self.scales is None:
            self.scales = [fp8.scales(t, margin=self.margin) for t in (key_states, value_states)]
        k, v = (fp8.dequantize(fp8.quantize(t, s), s).to(t.dtype) for t, s in zip((key_states, value_states),
                                                                                   self.scales))
        return super().update(k, v, *args, **kwargs)


def _dequant_cache(config, max_cache_len: int, margin: float) -> StaticCache:
    c = StaticCache(config=config, max_cache_len=max_cache_len)
    c.layers = [_DequantLayer(layer.max_cache_len, margin) if type(layer) is StaticLayer else layer
                for layer in c.layers]
    return c


def _steps(model, ids, cache, steps: int, feed=None):
    """Greedy decoding by hand (prefill, then ``steps`` single-token steps): the logits of every step [B, V].
    ``feed``: another run's logits, whose argmax tokens are fed instead of this model's own, so that two
    runs compared step by step see the same tokens (a near-tie argmax that flips between a bf16 and a
    float32 model would otherwise send the sequences apart: a GPU run failed on exactly that)."""
    logits, pos = [], torch.arange(ids.shape[1], device=ids.device)
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True, cache_position=pos)
        logits.append(out.logits[:, -1].float())
        for i in range(steps):
            tok = (feed[i] if feed is not None else logits[-1]).argmax(-1, keepdim=True)
            p = torch.tensor([ids.shape[1] + i], device=ids.device)
            out = model(tok, past_key_values=cache, use_cache=True, cache_position=p)
            logits.append(out.logits[:, -1].float())
    return logits


def _op_count():
    """A dispatch mode that lists the torch ops run inside it (``.ops``), metadata-only ops left out."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCount(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # metadata-only ops (views, and the detach the mode itself sees for a dtype view) launch no kernel
            if func not in (torch.ops.aten.view.default, torch.ops.aten.view.dtype, torch.ops.aten.detach.default,
                            torch.ops.aten._unsafe_view.default, torch.ops.aten.alias.default):
                self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    return OpCount()


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_fp8_cache_generation_equals_the_dequantised_cache_and_stays_near_float(kind):
    ours, sdpa = _models(kind, ["attntune", "sdpa"])
    ids = _ids()
    n = ids.shape[1] + 7
    cache = FP8StaticCache(config=ours.config, max_cache_len=n)
    ref = _steps(sdpa, ids, _dequant_cache(sdpa.config, n, margin=2.0), 6)
    got = _steps(ours, ids, cache, 6, feed=ref)
    flt = _steps(sdpa, ids, StaticCache(config=sdpa.config, max_cache_len=n), 6, feed=ref)
    for g, r, f in zip(got, ref, flt):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)  # float32 model: exactly the dequantised values
        assert (g - f).abs().max() <= 0.05 * f.abs().max(), ((g - f).abs().max(), f.abs().max())
    fp8_layers = [layer for layer in cache.layers if isinstance(layer, FP8StaticLayer)]
    if kind == "llama":
        assert len(fp8_layers) == len(cache.layers)
        # the FP8 codes differ from the float cache: the comparison above is not one of equal inputs
        assert any((g - f).abs().max() > 1e-4 for g, f in zip(got, flt))
    else:  # every Mistral layer slides (W=4 < the cache): they stay float, the generation is the float one
        assert not fp8_layers
        for g, f in zip(got, flt):
            torch.testing.assert_close(g, f, atol=1e-5, rtol=1e-5)


def test_bf16_model_hands_the_codes_and_their_scales_to_attntune():
    """A 16-bit model: the codes and both scales reach attntune.attention (on the CPU its fp8_dequant path);
    the logits equal HF's SDPA over the dequantised cache to bf16's tolerance."""
    ours, sdpa = _models("llama", ["attntune", "sdpa"], dtype=torch.bfloat16)
    ids = _ids()
    n = ids.shape[1] + 6
    want = _steps(sdpa, ids, _dequant_cache(sdpa.config, n, margin=2.0), 5)
    got = _steps(ours, ids, FP8StaticCache(config=ours.config, max_cache_len=n), 5, feed=want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=0.05, rtol=0.02)
    plans = [p["problem"] for p in attntune.stats()["plans"]]
    assert any("kv:e4m3fn" in p and " S1x" in p for p in plans), plans  # decode steps as FP8 problems


def test_fp8_layers_hold_codes_and_scales():
    llama, = _models("llama", ["attntune"])
    cache = FP8StaticCache(config=llama.config, max_cache_len=20)
    ids = _ids()
    _steps(llama, ids, cache, 2)
    for layer in cache.layers:
        assert isinstance(layer, FP8StaticLayer)
        assert layer.keys.dtype == torch.float8_e4m3fn and layer.keys.shape == (2, 2, 20, 16)
        assert layer.k_scale.shape == (2,) and layer.keys._attntune_scale is layer.k_scale
        assert int(layer.cumulative_length) == ids.shape[1] + 2
        assert layer.keys[:, :, int(layer.cumulative_length):].float().abs().max() == 0  # unwritten slots
        # the prompt's amax times the margin maps to the format's largest value: codes use half the range
        amax = layer.keys[:, :, :ids.shape[1]].float().abs().amax()
        assert 0.4 * 448 <= amax <= 0.5 * 448 + 1e-3
    cache.reset()
    assert not cache.layers[0].scaled and int(cache.layers[0].cumulative_length) == 0


def test_keys_contiguous_values_hold_the_same_codes_and_generate_the_same_tokens():
    """``v_layout="keys"``: each layer's values live in ``[B, Hkv, Dv, L]`` storage (a ``[B, Hkv, L, Dv]`` view
    with the keys contiguous), hold the same codes as the default layout, and the model's steps agree."""
    llama, = _models("llama", ["attntune"])
    ids = _ids()
    caches = {lay: FP8StaticCache(config=llama.config, max_cache_len=20, v_layout=lay) for lay in ("d", "keys")}
    outs = {lay: _steps(llama, ids, c, 3) for lay, c in caches.items()}
    for a, b in zip(caches["d"].layers, caches["keys"].layers):
        assert b.values.shape == a.values.shape and b.values.stride(2) == 1 and a.values.stride(3) == 1
        assert torch.equal(a.values.view(torch.uint8), b.values.view(torch.uint8))
        assert b.values._attntune_scale is b.v_scale
    torch.testing.assert_close(outs["d"], outs["keys"], atol=1e-4, rtol=1e-4)  # a CPU matmul may sum in another order
    with pytest.raises(ValueError, match="v_layout"):
        FP8StaticLayer(8, v_layout="dk")


def test_mistral_full_attention_layers_are_fp8_when_the_window_covers_the_cache():
    """A Mistral whose window is longer than the cache: transformers makes every layer a plain static one,
    so every layer holds codes; the generation still equals the dequantised reference."""
    cfg = _config("mistral")
    cfg.sliding_window = None
    torch.manual_seed(0)
    ours = transformers.MistralForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="attntune").eval()
    ref = transformers.MistralForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa").eval()
    ref.load_state_dict(ours.state_dict())
    cache = FP8StaticCache(config=ours.config, max_cache_len=16)
    got = _steps(ours, _ids(), cache, 3)
    assert all(isinstance(layer, FP8StaticLayer) for layer in cache.layers)
    want = _steps(ref, _ids(), _dequant_cache(ref.config, 16, 2.0), 3)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_codes_without_scales_are_refused_naming_key_value():
    q = torch.randn(1, 4, 1, 16, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 5, 16, dtype=torch.float8_e4m3fn)

    class M(torch.nn.Module):
        is_causal = True

    with pytest.raises(ValueError, match="key/value"):
        attntune.hf.attention_forward(M(), q, k, k.clone(), None)


def test_layer_arguments_are_checked():
    with pytest.raises(ValueError, match="margin"):
        FP8StaticLayer(8, margin=0.5)
    with pytest.raises(ValueError, match="margin"):
        FP8StaticLayer(8, margin=float("inf"))  # every scale inf: a NaN cache
    with pytest.raises(ValueError, match="dtype"):
        FP8StaticLayer(8, fp8_dtype=torch.int8)


@pytest.mark.gpu
def test_gpu_fp8_cache_decode_steps_go_to_triton_decode():
    """bf16 model on a GPU: the decode steps read the codes in triton_decode (kv_lens: a static buffer);
    logits stay within the FP8 error of a float32 reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs an sm_89+ GPU (Triton converts float8 there)")
    cfg = _config("llama")
    cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 256, 4, 2, 64
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa").cuda().eval()
    ours = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="attntune")
    ours.load_state_dict(ref.state_dict())
    ours = ours.to(device="cuda", dtype=torch.bfloat16).eval()
    ids = _ids(batch=3, seq=21, device="cuda")
    n = ids.shape[1] + 9
    want = _steps(ref, ids, _dequant_cache(ref.config, n, 2.0), 8)
    got = _steps(ours, ids, FP8StaticCache(config=ours.config, max_cache_len=n), 8, feed=want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g - w).abs().max() <= 0.05 * w.abs().max() + 1e-2, (i, (g - w).abs().amax(-1), w.abs().max())
    decode = [p for p in attntune.stats()["plans"] if " S1x" in p["problem"]]
    assert decode and all(p["variant"] == "triton_decode" for p in decode), decode
    assert all("kv:e4m3fn" in p["problem"] and "kv_lens" in p["problem"] for p in decode), decode


def test_generate_with_the_decode_step_compiled_reads_the_codes_through_the_fp8_op():
    """What ``model.generate(ids, past_key_values=FP8StaticCache(...))`` does on a GPU: transformers compiles
    the decode step of a static cache by itself (forced here on the CPU with ``_compile_all_devices``; the
    aot_eager backend, no C++ toolchain needed). The compiled steps keep the codes: the FP8 runtime serves
    them (kv:e4m3fn decode problems), and the tokens equal the eager generation's."""
    from transformers import CompileConfig

    ours, = _models("llama", ["attntune"], dtype=torch.bfloat16)
    ids = _ids()
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)
    n = ids.shape[1] + 5
    with torch.no_grad():
        eager = ours.generate(ids, past_key_values=FP8StaticCache(config=ours.config, max_cache_len=n),
                              disable_compile=True, **kw)
        attntune.reset()
        torch._dynamo.reset()
        cc = CompileConfig(backend="aot_eager", fullgraph=False, dynamic=False)
        cc._compile_all_devices = True
        compiled = ours.generate(ids, past_key_values=FP8StaticCache(config=ours.config, max_cache_len=n),
                                 compile_config=cc, **kw)
    torch._dynamo.reset()
    assert torch.equal(compiled, eager)
    decode = [p for p in attntune.stats()["plans"] if " S1x" in p["problem"]]
    assert decode and all("kv:e4m3fn" in p["problem"] for p in decode), decode


def test_a_left_padded_batch_takes_hfs_path_over_the_widened_codes():
    """Padding masks are HF's own path (materialised masks): the codes are widened for it, and generate
    gives exactly the tokens of HF's SDPA over the dequantised cache with the same padding."""
    ours, sdpa = _models("llama", ["attntune", "sdpa"])
    ids = _ids(batch=3, seq=9)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :5] = 0
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0, disable_compile=True)
    n = ids.shape[1] + 5
    with torch.no_grad():
        got = ours.generate(ids, attention_mask=mask,
                            past_key_values=FP8StaticCache(config=ours.config, max_cache_len=n), **kw)
        want = sdpa.generate(ids, attention_mask=mask, past_key_values=_dequant_cache(sdpa.config, n, 2.0), **kw)
    assert torch.equal(got, want)
    assert not [p for p in attntune.stats()["plans"] if "kv:" in p["problem"]]  # no FP8 call reached us


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_the_fp8_cache_names_another_attention_implementation(impl):
    """Another backend reads the codes as numbers and failed deep inside transformers."""
    m, = _models("llama", [impl])
    with pytest.raises(ValueError, match="config: attn_implementation is .*needs attn_implementation='attntune'"):
        FP8StaticCache(config=m.config, max_cache_len=8)


@pytest.mark.parametrize("append_kernel", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize("v_layout", ["d", "keys"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_layer_update_writes_quantize_codes_at_the_next_slots(v_layout, dtype, append_kernel):
    """A layer's update stores exactly ``fp8.quantize``'s codes (saturating ones included) in the slots after the
    current length — a prompt of 5, then single tokens — and leaves every other slot untouched: through torch
    ops and through the append kernel (kernels/fp8_cache; the interpreter here)."""
    if append_kernel:
        pytest.importorskip("triton")
    g = torch.Generator().manual_seed(3)
    layer = FP8StaticLayer(11, v_layout=v_layout)
    layer.append_kernel = append_kernel
    steps = [torch.randn(2, 3, n, 7, generator=g) for n in (5, 1, 1, 1)]
    vals = [torch.randn(2, 3, n, 7, generator=g) for n in (5, 1, 1, 1)]
    steps[2][0, 1, 0, 4] = 1e4  # far past scale * 448: saturates
    written = 0
    for k, v in zip(steps, vals):
        k, v = k.to(dtype), v.to(dtype)
        keys, values = layer.update(k, v)
        n = k.shape[-2]
        for codes, x, sc in ((keys, k, layer.k_scale), (values, v, layer.v_scale)):
            want = fp8.quantize(x, sc)
            got = codes[:, :, written:written + n]
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
            assert codes[:, :, written + n:].view(torch.uint8).eq(0).all()
        written += n
        assert int(layer.cumulative_length) == written
    assert layer.keys[0, 1, 6, 4].float() == 448.0


def test_a_decode_update_launches_nine_ops():
    """Eager generate runs the cache update per layer and step on the host's time: a one-token update dispatches
    at most 9 ops (divide, clamp, cast and copy for K and V, the length's increment)."""
    layer = FP8StaticLayer(16)
    layer.append_kernel = False  # the torch path (the CPU's anyway); a GPU's kernel path: test_gpu_a_decode_update...
    layer.update(torch.randn(1, 2, 4, 8, dtype=torch.bfloat16), torch.randn(1, 2, 4, 8, dtype=torch.bfloat16))
    k, v = torch.randn(1, 2, 1, 8, dtype=torch.bfloat16), torch.randn(1, 2, 1, 8, dtype=torch.bfloat16)
    with _op_count() as c:
        layer.update(k, v)
    assert len(c.ops) <= 9, c.ops


def test_the_append_path_is_torch_on_the_cpu_and_never_the_kernel_under_a_trace(monkeypatch):
    """Left to itself (``append_kernel`` None) a layer appends through torch ops on the CPU; forced to the kernel,
    it still takes torch ops inside a ``torch.compile`` trace (Inductor fuses those)."""
    layer = FP8StaticLayer(8)
    x = torch.randn(1, 2, 1, 8, dtype=torch.bfloat16)
    assert layer._kernel_append(x, x) is False
    layer.append_kernel = True
    assert layer._kernel_append(x, x) is True
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert layer._kernel_append(x, x) is False


@pytest.mark.gpu
@pytest.mark.parametrize("v_layout", ["d", "keys"])
def test_gpu_a_decode_update_is_one_launch_and_one_op(v_layout):
    """On a GPU the layer appends through the kernel by itself: a one-token update dispatches one torch op (the
    length's increment) besides the kernel, and its codes equal the torch path's, prompt and steps."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(4)
    ours, ref = FP8StaticLayer(300, v_layout=v_layout), FP8StaticLayer(300, v_layout=v_layout)
    ref.append_kernel = False
    for n in (257, 1, 1, 3):
        k = torch.randn(2, 3, n, 80, generator=g, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, 3, n, 80, generator=g, device="cuda", dtype=torch.bfloat16) * 5
        ref.update(k, v)
        if n == 1:
            with _op_count() as c:
                ours.update(k, v)
            assert len(c.ops) == 1 and c.ops[0].startswith("aten.add_."), c.ops
        else:
            ours.update(k, v)
        assert ours._kernel_append(k, v)
    assert torch.equal(ours.keys.view(torch.uint8), ref.keys.view(torch.uint8))
    assert torch.equal(ours.values.view(torch.uint8), ref.values.view(torch.uint8))
    assert int(ours.cumulative_length) == int(ref.cumulative_length) == 262
