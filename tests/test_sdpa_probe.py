"""torch's SDPA support probe (attntune.kernels.sdpa_probe) and the source equivalence that let it move out of
the SDPA variants' hashed module without staling their rows.

torch's ``can_use_*`` only answer for CUDA tensors (a CPU build returns False silently), so the probe's logic
is checked here against fakes that follow torch's rules as its GPU code states them: a GPU backend refuses a
mask whose last dimension is not contiguous, and with ``debug=True`` it writes its reasons to fd 2 in c10's
format (the binding has no Python warning handler)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend

from attntune.cache import judge
from attntune.cache.models import record_to_row
from attntune.kernels import registry, sdpa_probe
from attntune.problem import AttentionProblem

from test_cache import make_rec


def _problem(**kw):
    d = dict(batch=3, heads_q=8, heads_kv=2, seqlen_q=5, seqlen_kv=37, head_dim=64, head_dim_v=64,
             dtype="bfloat16", device_type="cuda", causal=True)
    d.update(kw)
    return AttentionProblem(**d)


def _c10(msg: str) -> bytes:
    return f"[W1205 18:27:24.135775117 sdp_utils_cpp.h:527] Warning: {msg} (function check_last_dim)\n".encode()


class FakeCheck:
    """torch's GPU rule for masks and its way of reporting, on CPU tensors."""

    def __init__(self):
        self.calls = []

    def __call__(self, params, debug):
        self.calls.append(debug)
        mask = params.attn_mask
        ok = mask is None or mask.stride(-1) == 1
        if not ok and debug:
            os.write(2, _c10(f"All fused kernels require the last dimension of the input to have stride 1. "
                             f"Got Attn_mask.stride(-1): {mask.stride(-1)}"))
        return ok


@pytest.mark.parametrize("kw", [dict(), dict(window=(7, 0)), dict(seqlen_q=1, kv_lens=True)],
                         ids=["chunked-causal", "window", "kv_lens"])
def test_probe_mask_is_laid_out_as_a_materialised_mask(kw):
    """The masked problems a GPU backend can take: the probe mask's last dimension is contiguous (one real
    row broadcast over the queries), so the efficient and cuDNN backends are offered them."""
    p = _problem(**kw)
    q, k, v, mask, expand = sdpa_probe.probe_tensors(SDPBackend.EFFICIENT_ATTENTION, p, "cpu")
    assert mask is not None and mask.shape == (p.seqlen_q, p.seqlen_kv) and mask.stride(-1) == 1
    assert p.seqlen_q == 1 or mask.stride(0) == 0  # one row of Skv bytes, broadcast
    assert all(t.stride(-1) == 1 for t in (q, k, v)) and expand and k.shape[1] == p.heads_q
    *_, expand_flash = sdpa_probe.probe_tensors(SDPBackend.FLASH_ATTENTION, p, "cpu")
    assert not expand_flash  # flash takes GQA natively


def test_a_backend_that_takes_the_problem_is_asked_once_and_silently(monkeypatch, capfd):
    fake = FakeCheck()
    monkeypatch.setattr(torch.backends.cuda, "can_use_efficient_attention", fake)
    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", _Params)
    assert sdpa_probe.torch_gpu_reasons.__wrapped__(SDPBackend.EFFICIENT_ATTENTION, _problem(window=(7, 0)),
                                                    "cpu") == []
    assert fake.calls == [False]
    assert capfd.readouterr().err == ""


def test_a_refusal_gives_torchs_reasons_and_nothing_reaches_stderr(monkeypatch, capfd):
    """A refusal is asked again with debug=True; the c10 lines it writes to fd 2 become the reasons (not a
    generic line) and stay out of the user's terminal; other output meanwhile passes through."""

    def refuse(params, debug):
        if debug:
            os.write(2, _c10("Flash Attention does not support non-null attn_mask."))
            os.write(2, b"another thread's line\n")
        return False

    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", refuse)
    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", _Params)
    got = sdpa_probe.torch_gpu_reasons.__wrapped__(SDPBackend.FLASH_ATTENTION, _problem(window=(7, 0)), "cpu")
    assert got == ["Flash Attention does not support non-null attn_mask."]
    err = capfd.readouterr().err
    assert "Warning:" not in err and "another thread's line" in err


def test_captured_warnings_keeps_python_warnings_and_the_result():
    def f(x):
        warnings.warn("from python")
        os.write(2, _c10("from c++"))
        return x + 1

    out, msgs = sdpa_probe.captured_warnings(f, 1)
    assert out == 2 and msgs == ["from python", "from c++"]


def test_a_row_of_an_equivalent_earlier_source_is_judged_as_current():
    """Variant.equivalent_sources: a row written under a listed earlier hash reads as valid (versions still
    compared); an unlisted earlier hash is a changed source (stale, not a hint)."""
    var = registry.get("sdpa_math")
    rec = make_rec(variant="sdpa_math")

    def under(h):
        fp = rec.fingerprint.model_copy(update={"variant_hash": h})
        return judge(record_to_row(rec.model_copy(update={"fingerprint": fp})), "t")

    listed = next(iter(var.equivalent_sources))
    assert under(listed).status == "valid" and under(var.source_hash()).status == "valid"
    other = under("0123456789abcdef")
    assert other.status == "stale" and other.reasons == ["variant source changed"] and not other.hint


class _Params:
    """SDPAParams' fields as torch's checks read them (torch's constructor only takes CUDA-ready arguments
    in some builds)."""

    def __init__(self, query, key, value, attn_mask, dropout, is_causal, enable_gqa):
        self.query, self.key, self.value, self.attn_mask = query, key, value, attn_mask
        self.dropout, self.is_causal, self.enable_gqa = dropout, is_causal, enable_gqa
