"""Loader contract: both config formats, Laya's temperature clamp, strict tensor inventory."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from cascade.laya.checkpoint import content_hash, load_weights
from cascade.laya.config import CheckpointError, clamp_temperature, load_config
from cascade.laya.tokenizer import LayaTokenizer


@pytest.fixture
def ckpt(tiny_dirs: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_dirs["v5"], tmp_path / "ckpt"))


def edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_both_encoder_config_formats_read_the_same(tiny_dirs: dict[str, Path]) -> None:
    v5, v4 = (load_config(tiny_dirs[f]).encoder for f in ("v5", "v4"))
    assert v5 == v4
    assert v5.global_layers == (True, False, False)
    assert (v5.global_theta, v5.local_theta, v5.window) == (40000.0, 2500.0, 8)


@pytest.mark.parametrize(
    ("raw", "applied"),
    [
        (True, 1.0),
        ("warm", 1.0),
        (None, 1.0),
        (math.nan, 1.0),
        (math.inf, 1.0),
        (0.1006, 0.5),
        (9, 5.0),
        (1.25, 1.25),
        ("2.0", 2.0),
    ],
)
def test_temperatures_are_clamped_like_laya(raw: object, applied: float) -> None:
    assert clamp_temperature(raw) == applied


def test_clamped_temperatures_are_applied(ckpt: Path) -> None:
    cfg = load_config(ckpt)
    assert cfg.temperature_by_options["choice:11+"] == 0.5
    assert cfg.temperature_for(0, 12) == 0.5 and cfg.temperature_for(0, 4) == 1.2
    assert cfg.temperature_for(0, 2) == cfg.temperature[0] == 1.3


@pytest.mark.parametrize(
    ("file", "change", "message"),
    [
        ("rl_agent_config.json", {"option_layout": "parallel"}, "option_layout 'parallel'"),
        ("rl_agent_config.json", {"temperature": [1.0, 1.0]}, "list of 3"),
        ("encoder/config.json", {"attention_bias": True}, "attention_bias=true"),
        ("encoder/config.json", {"norm_bias": True}, "norm_bias=true"),
        ("encoder/config.json", {"hidden_activation": "silu"}, "hidden_activation"),
        (
            "encoder/config.json",
            {"rope_parameters": {"full_attention": {"rope_type": "yarn"}}},
            "unsupported rope_type 'yarn'",
        ),
        ("encoder/config.json", {"model_type": "bert"}, "not modernbert"),
    ],
)
def test_incompatible_configs_are_refused(
    ckpt: Path, file: str, change: dict, message: str
) -> None:
    edit_json(ckpt / file, **change)
    with pytest.raises(CheckpointError, match=message):
        load_config(ckpt)


def test_required_config_keys(ckpt: Path) -> None:
    data = json.loads((ckpt / "rl_agent_config.json").read_text())
    del data["head_layers"]
    (ckpt / "rl_agent_config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"missing required keys \['head_layers'\]"):
        load_config(ckpt)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda w: w.pop("encoder.layers.1.attn_norm.weight"),
            "missing tensor encoder.layers.1.attn_norm.weight",
        ),
        (
            lambda w: w.update({"encoder.layers.0.attn_norm.weight": np.ones(64, np.float16)}),
            "unexpected tensor encoder.layers.0.attn_norm.weight",
        ),
        (
            lambda w: w.update({"scorer.1.weight": np.ones((64, 32), np.float16)}),
            r"scorer.1.weight: shape \(64, 32\), expected \(64, 64\)",
        ),
        (lambda w: w.update({"scorer.1.bias": np.ones(64, np.int32)}), "dtype I32"),
        (lambda w: w.pop("temperature"), "missing tensor temperature"),
    ],
)
def test_tensor_inventory_is_strict(ckpt: Path, mutate, message: str) -> None:
    weights = load_file(str(ckpt / "model.safetensors"))
    mutate(weights)
    save_file(weights, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=message):
        load_weights(ckpt, load_config(ckpt))


def test_f32_and_bf16_weights_load_as_fp32(ckpt: Path) -> None:
    import torch
    from safetensors.torch import save_file as save_torch

    cfg = load_config(ckpt)
    f16 = load_weights(ckpt, cfg)
    for dtype in (torch.float32, torch.bfloat16):
        save_torch(
            {k: torch.from_numpy(v).to(dtype) for k, v in f16.items()},
            str(ckpt / "model.safetensors"),
        )
        loaded = load_weights(ckpt, cfg)
        for name, value in f16.items():
            assert loaded[name].dtype == np.float32
            want = torch.from_numpy(value).to(dtype).float().numpy()
            np.testing.assert_array_equal(loaded[name], want, err_msg=name)


def test_content_hash_follows_the_weights(ckpt: Path) -> None:
    before = content_hash(ckpt)
    weights = load_file(str(ckpt / "model.safetensors"))
    weights["scorer.3.bias"] = weights["scorer.3.bias"] + np.float16(1)
    save_file(weights, str(ckpt / "model.safetensors"))
    assert content_hash(ckpt) != before


def test_tokenizer_specials_come_from_the_config(ckpt: Path) -> None:
    tok = LayaTokenizer(ckpt / "tokenizer")
    assert (tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id) == (1, 2, 3, 4)
    assert tok.encode("a [SEP] b").count(2) == 1  # added tokens in text still match
    (ckpt / "tokenizer" / "special_tokens_map.json").unlink()
    edit_json(ckpt / "tokenizer" / "tokenizer_config.json", mask_token={"content": "[NOPE]"})
    with pytest.raises(CheckpointError, match="no usable mask_token"):
        LayaTokenizer(ckpt / "tokenizer")
