"""Typed launch configs (kernels/launch_config.py): one declaration per knob, everything derived."""

from __future__ import annotations

import json

import pytest
import torch

from attntune.kernels.launch_config import LaunchConfig, cached_parser, typed
from attntune.kernels.triton_decode.launch import DecodeConfig
from attntune.kernels.triton_flash.config import (FlashBwdConfig, FlashFwdConfig, FlashTrainConfig,
                                                  default_train_config)
from attntune.kernels.triton_flash.space import constraint_reasons, flash_space
from attntune.key import config_key
from attntune.problem import AttentionProblem

CLASSES = (FlashFwdConfig, FlashBwdConfig, FlashTrainConfig, DecodeConfig)


def _prob(mode="fwd", d=80, dtype="bfloat16"):
    return AttentionProblem(batch=2, heads_q=4, heads_kv=2, seqlen_q=33, seqlen_kv=47, head_dim=d, head_dim_v=d,
                            dtype=dtype, device_type="cuda", causal=True, mode=mode)


@pytest.mark.parametrize("cls", CLASSES)
def test_dict_form_round_trips_and_is_the_identity(cls):
    cfg = cls()
    d = cfg.to_dict(rocm=False)
    assert list(d) == list(cls.names(rocm=False)) and cls.from_dict(d, rocm=False) == cfg
    assert hash(cfg) == hash(cls.from_dict(d, rocm=False))  # frozen: usable as a cache key
    # the identity is the canonical JSON of the dict form, whatever the key order
    assert config_key(d) == config_key(dict(reversed(list(d.items())))) == json.dumps(d, sort_keys=True)


@pytest.mark.parametrize("cls", CLASSES)
def test_space_derives_from_the_knobs(cls):
    default = cls()
    sp = cls.space(default, lambda c: [] if isinstance(c, cls) else ["not typed"], rocm=False)
    assert sp.names == cls.names(rocm=False)
    assert [p.choices for p in sp.params] == [k.choices for _, k in cls.knobs(rocm=False)]
    assert sp.first() == default.to_dict(rocm=False)
    assert sum(1 for _ in sp.grid()) == sp.raw_size()  # the constraint saw typed configs: all passed


def test_rocm_knobs_exist_only_on_rocm():
    assert "waves_per_eu" not in FlashFwdConfig.names(rocm=False)
    assert FlashFwdConfig.names(rocm=True)[-2:] == ("waves_per_eu", "matrix_instr_nonkdim")
    assert "waves_per_eu" in FlashFwdConfig().to_dict(rocm=True)
    with pytest.raises(ValueError, match=r"config: unknown keys \['waves_per_eu'\]"):
        FlashFwdConfig.from_dict({"waves_per_eu": 2}, rocm=False)
    assert DecodeConfig.names(rocm=True) == DecodeConfig.names(rocm=False)


@pytest.mark.parametrize("cls,bad,msg", [
    (FlashFwdConfig, {"BLOCK_M": 48}, r"config: BLOCK_M must be a power of two >= 16, got 48"),
    (FlashFwdConfig, {"BLOCK_N": 64.0}, r"config: BLOCK_N must be an integer, got 64.0"),
    (FlashFwdConfig, {"num_warps": 3}, r"config: num_warps must be 1, 2, 4, 8 or 16, got 3"),
    (FlashFwdConfig, {"num_stages": 0}, r"config: num_stages must be >= 1, got 0"),
    (FlashFwdConfig, {"BWD_WARPS": 4}, r"config: unknown keys \['BWD_WARPS'\]"),
    (FlashBwdConfig, {"BLOCK_M": 64}, r"bwd_config: unknown keys \['BLOCK_M'\]"),
    (FlashBwdConfig, {"BWD_BLOCK_N": True}, r"bwd_config: BWD_BLOCK_N must be an integer"),
    (DecodeConfig, {"BLOCK_N": 24}, r"config: BLOCK_N must be a power of two >= 16, got 24"),
    (DecodeConfig, {"num_splits": 65}, r"config: num_splits must be in \[0, 64\] \(0 = auto\), got 65"),
    (DecodeConfig, {"num_stages": -1}, r"config: num_stages must be >= 0 \(0 = auto\), got -1"),
    (DecodeConfig, "BLOCK_N=64", r"config: expected a dict or DecodeConfig, got str"),
])
def test_bad_configs_are_refused_naming_the_argument_and_key(cls, bad, msg):
    with pytest.raises(ValueError, match=msg):
        cls.from_dict(bad)


def test_decode_auto_spellings_and_partial_dicts():
    assert DecodeConfig.from_dict({"num_splits": "auto", "num_stages": None}) == DecodeConfig()
    assert DecodeConfig.from_dict({"BLOCK_N": 32}) == DecodeConfig(BLOCK_N=32)
    assert DecodeConfig.from_dict(None) == DecodeConfig() == typed(DecodeConfig, None, DecodeConfig())


def test_training_config_is_its_own_type_with_both_launches():
    t = default_train_config(64, torch.bfloat16)
    assert isinstance(t.forward, FlashFwdConfig) and isinstance(t.backward, FlashBwdConfig)
    assert t.forward.to_dict(rocm=False) == {k: v for k, v in t.to_dict(rocm=False).items() if not k.startswith("BWD")}
    assert t.backward.launch_opts() == {"num_warps": t.BWD_WARPS, "num_stages": t.BWD_STAGES}
    assert t.forward.launch_opts() == {"num_warps": t.num_warps, "num_stages": t.num_stages}
    # a training key's forward domain is narrower than a forward key's
    assert dict(FlashTrainConfig.knobs(False))["BLOCK_M"].choices == (64, 128)
    assert dict(FlashFwdConfig.knobs(False))["BLOCK_M"].choices == (32, 64, 128)


def test_flash_space_is_typed_per_mode_and_checks_the_backward_only_for_training():
    fwd, train = flash_space(_prob("fwd")), flash_space(_prob("fwd_bwd"))
    assert fwd.names == FlashFwdConfig.names() and train.names == FlashTrainConfig.names()
    huge_bwd = default_train_config(80, torch.bfloat16).replace(BWD_BLOCK_M=64, BWD_BLOCK_N=128, BWD_WARPS=4)
    assert any("backward" in r for r in constraint_reasons(huge_bwd, 80, torch.bfloat16, "sm_90"))
    assert not any("backward" in r for r in constraint_reasons(huge_bwd.forward, 80, torch.bfloat16, "sm_90"))
    assert train.validate(huge_bwd.to_dict()) != []


def test_rows_stored_before_typed_configs_read_unchanged():
    """The stored form kept its keys and values when the configs were typed: a row written by the dict-config
    code parses to the config it named (since the LOADS knob its forward rows are stale, with that reason)."""
    old_fwd = {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "num_warps": 8}
    old_train = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "BWD_BLOCK_M": 32,
                 "BWD_BLOCK_N": 128, "BWD_WARPS": 8, "BWD_STAGES": 2}
    old_decode = {"BLOCK_N": 64, "num_splits": 16, "num_warps": 4, "num_stages": 0}
    # a forward row from before the LOADS knob is stale with a clear reason (its kernel source changed too);
    # parsed, it is the pointer-load launch it always was
    assert flash_space(_prob("fwd", d=128)).validate(old_fwd) == ["missing parameter LOADS"]
    assert flash_space(_prob("fwd_bwd", d=64)).validate(old_train) == ["missing parameter LOADS"]
    assert FlashFwdConfig.from_dict(old_fwd, rocm=False).to_dict(rocm=False) == dict(old_fwd, LOADS=0)
    assert FlashTrainConfig.from_dict(old_train, rocm=False).BWD_BLOCK_N == 128
    assert DecodeConfig.from_dict(old_decode) == DecodeConfig(num_splits=16)


def test_cached_parser_parses_each_distinct_dict_once(monkeypatch):
    calls = []
    real = DecodeConfig.from_dict.__func__
    monkeypatch.setattr(DecodeConfig, "from_dict", classmethod(lambda cls, c, rocm=False: calls.append(c) or real(cls, c)))
    parse = cached_parser(DecodeConfig)
    a = parse({"BLOCK_N": 32})
    assert parse({"BLOCK_N": 32}) is a and parse({"BLOCK_N": 64}) == DecodeConfig() and len(calls) == 2


def test_a_field_without_knob_metadata_is_a_declaration_error():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Bad(LaunchConfig):
        BLOCK: int = 16

    with pytest.raises(TypeError, match="Bad.BLOCK is not declared with knob"):
        Bad.knobs(False)


def test_flash_op_refuses_bad_backward_configs_at_the_call():
    pytest.importorskip("triton")
    from attntune.kernels.triton_flash.op import flash_attention

    q = k = v = torch.randn(1, 2, 17, 16)
    with pytest.raises(ValueError, match=r"bwd_config: unknown keys \['BLOCK_M'\]"):
        flash_attention(q, k, v, bwd_config={"BLOCK_M": 64})  # before any launch, not first in backward
    with pytest.raises(ValueError, match="bwd_config: not with a FlashTrainConfig"):
        flash_attention(q, k, v, config=default_train_config(16, torch.float32), bwd_config={"BWD_WARPS": 4})
    with pytest.raises(ValueError, match=r"config: BLOCK_M must be a power of two >= 16, got 100"):
        flash_attention(q, k, v, config={"BLOCK_M": 100})
