"""Tiny random Laya checkpoints in the real layout, for tests and ``cascade serve --demo``.

The weights are random (non-degenerate: spec §9's recipe) and mean nothing. The encoder is small
but real: 3 layers (one global, two local), a local window of 8 that binds on every row, and
distinct non-default RoPE thetas, so a wrong window or RoPE changes the answers. Rows are read as
the English checkpoint reads them (``max_len`` 512, ``head_max_len`` 192), so the default policy's
truncation and option-collapse rules mean in the demo what they mean in production. Temperatures
are inside Laya's clamp range, so loading one logs nothing. The tokenizer is a byte-level BPE
trained with ``tokenizers`` on a small built-in text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
from safetensors.numpy import save_file
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from cascade.laya.checkpoint import expected_tensors
from cascade.laya.config import load_config

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
_CORPUS = """\
The customer wants a refund because the order arrived broken and late.
Please route billing questions to the finance team and technical issues to support.
Is the user asking about their account, a payment, a password reset or a delivery?
Choice question: which department should handle this message? Score question: how urgent is it?
Yes, the statement holds. No, the statement does not hold. true false level 0 1 2 3 4 5 6 7 8 9
Hello, I cannot log in to my account since yesterday and I am very frustrated with your service.
The invoice total does not match the purchase order; please check the duplicate charge.
{"role": "user", "content": "where is my refund?"} {"subject": "urgent", "body": "call me"}
Bonjour, je voudrais annuler ma commande. Guten Tag, mein Paket ist nicht angekommen.
"""


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=640,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS.splitlines() * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    return tok


TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "local_attention": 8,
}


def _encoder_config(vocab: int, fmt: Literal["v4", "v5"], shape: dict) -> dict:
    layers = shape["num_hidden_layers"]
    cfg = {
        "model_type": "modernbert",
        "architectures": ["ModernBertModel"],
        "vocab_size": vocab,
        **shape,
        "hidden_activation": "gelu",
        "max_position_embeddings": 8192,
        "norm_eps": 1e-5,
        "norm_bias": False,
        "attention_bias": False,
        "mlp_bias": False,
        "pad_token_id": 3,
        "cls_token_id": 1,
        "sep_token_id": 2,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if fmt == "v5":
        cfg["layer_types"] = [
            "full_attention" if i % 3 == 0 else "sliding_attention" for i in range(layers)
        ]
        cfg["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 40000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 2500.0},
        }
    else:
        cfg |= {
            "global_rope_theta": 40000.0,
            "local_rope_theta": 2500.0,
            "global_attn_every_n_layers": 3,
        }
    return cfg


_AGENT_CONFIG = {
    "encoder": "cascade/tiny-random-modernbert",
    "head_layers": 2,
    # The English checkpoint's row budgets.
    "max_len": 512,
    "head_max_len": 192,
    "act_costs": {"escalate": 0.5},
    # The random-weights marker (``cascade.build.random_weights``): labelled DEMO everywhere.
    "model_name": "cascade-tiny-random",
    "temperature": [1.3, 0.9, 1.1],
    # Within Laya's clamp range [0.5, 5] (tests write an out-of-range one to check the clamp).
    "temperature_by_options": {"choice:3-5": 1.2, "choice:11+": 0.6, "noul:2": 1.7},
}


def _weights(ckpt: Path, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_tensors(load_config(ckpt)).items():
        if name == "temperature":
            w = np.ones(shape)
        elif name.endswith("bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:  # LayerNorm gains
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "tok_embeddings" in name:
            w = rng.standard_normal(shape)
        elif name == "type_emb.weight":
            w = 0.5 * rng.standard_normal(shape)
        elif name == "scorer.3.weight":
            w = rng.standard_normal(shape) * 6 / np.sqrt(shape[1])
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[1])
        out[name] = w.astype(np.float16)
    return out


def make_tiny(out: Path, *, config_format: Literal["v4", "v5"] = "v5", seed: int = 0) -> Path:
    """Write a tiny random checkpoint to ``out`` (created if needed) and return ``out``."""
    return write_random(out, config_format=config_format, seed=seed)


def write_random(
    out: Path,
    *,
    shape: dict | None = None,
    vocab: int | None = None,
    agent: dict | None = None,
    config_format: Literal["v4", "v5"] = "v5",
    seed: int = 0,
) -> Path:
    """A random checkpoint of any ModernBERT ``shape`` (the benchmark uses base and large).

    ``vocab`` widens the embedding past the tiny tokenizer's; ``agent`` overrides
    ``rl_agent_config.json`` keys (e.g. ``temperature_by_options`` out of Laya's clamp range).
    """
    out = Path(out)
    (out / "tokenizer").mkdir(parents=True, exist_ok=True)
    (out / "encoder").mkdir(exist_ok=True)
    tok = _tokenizer()
    tok.save(str(out / "tokenizer" / "tokenizer.json"))
    names = dict(zip(("unk", "cls", "sep", "pad", "mask"), SPECIALS, strict=True))
    specials = {f"{role}_token": text for role, text in names.items()}
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 8192,
        "clean_up_tokenization_spaces": False,
        **specials,
    }
    _write(out / "tokenizer" / "tokenizer_config.json", tok_config)
    _write(out / "tokenizer" / "special_tokens_map.json", specials)
    encoder = _encoder_config(vocab or tok.get_vocab_size(), config_format, shape or TINY_SHAPE)
    _write(out / "encoder" / "config.json", encoder)
    _write(out / "rl_agent_config.json", _AGENT_CONFIG | (agent or {}))
    save_file(_weights(out, seed), str(out / "model.safetensors"))
    return out


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
