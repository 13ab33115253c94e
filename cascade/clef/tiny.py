"""Tiny random Clef releases in the real on-disk format, for tests and demos.

``make_tiny(out)`` writes what a Cloudflare release holds, only small: a Qwen3.5 config and
safetensors shards that ``Qwen3_5ForConditionalGeneration.from_pretrained`` loads (text and
vision towers), ``joint_head.safetensors`` + ``joint_head_config.json``, a byte-level BPE
tokenizer with the Qwen special tokens, and the processor configs. Weights are drawn so that
answers depend on the input (spec §7): matrices N(0, 0.1²), norms jittered around their
init, non-zero logit scales and gate. Deterministic for a given ``seed``.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
)
# Qwen's pre-tokenizer split (the same pattern the Qwen3.5 tokenizer uses).
PRETOKENIZE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# A little text to learn merges from, so that pieces tokenized together would merge across
# boundaries (which makes span tests meaningful) and the fixed prompt stays short.
CORPUS = (
    "Read the complete state and schema. Decide every field jointly. Each answer must be "
    "exactly one of that field's allowed options. STATE SCHEMA FIELDS FIELD ID TYPE "
    "INSTRUCTION ALLOWED OPTIONS OPTION END FIELD JOINT SCHEMA DECISIONS system user assistant "
    'choice score noul {"description":"The proposition is true or the answer is yes.",'
    '"option_id":"true"} false no billing technical charged twice',
)
# The random-weights marker (``cascade.build.random_weights``): labelled DEMO everywhere. In
# config.json, which transformers reads whole; joint_head_config.json is the head's kwargs.
RANDOM_MARKER = {"model_name": "cascade-tiny-random"}
VOCAB_SIZE = 512
TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 65536,
    "tie_word_embeddings": False,
}
VISION = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 64,
}
HEAD = {
    "hidden_size": 64,
    "width": 32,
    "routing_layers": 1,
    "layers": 1,
    "heads": 2,
    "feedforward": 64,
}
# Small images: at most 8x8 patches of 16 px, i.e. at most 16 merged image tokens.
IMAGE_PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": 32 * 32, "longest_edge": 128 * 128},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "do_resize": True,
    "resample": 3,
}


def make_tiny(out: Path, *, seed: int = 0) -> Path:
    """Write a tiny random release into ``out`` (created if missing) and return ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out)
    _write_processor(out)
    _write_backbone(out, ids, seed)
    _write_head(out, seed)
    return out


def write_tokenizer(out: Path) -> dict[str, int]:
    """Byte-level BPE with the Qwen special tokens; returns their ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 64,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(CORPUS) * 2, trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    ids = {token: vocab[token] for token in SPECIAL_TOKENS}
    added = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 262144,
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "image_token": "<|image_pad|>",
        "video_token": "<|video_pad|>",
        "vision_bos_token": "<|vision_start|>",
        "vision_eos_token": "<|vision_end|>",
    }
    _dump(out / "tokenizer_config.json", config)
    return ids


def _write_processor(out: Path) -> None:
    image = {**IMAGE_PROCESSOR, "processor_class": "Qwen3VLProcessor"}
    _dump(out / "preprocessor_config.json", image)
    video = {
        **IMAGE_PROCESSOR,
        "video_processor_type": "Qwen3VLVideoProcessor",
        "fps": 2,
        "processor_class": "Qwen3VLProcessor",
    }
    video.pop("image_processor_type")
    _dump(out / "video_preprocessor_config.json", video)
    _dump(out / "processor_config.json", {"processor_class": "Qwen3VLProcessor"})


def _write_backbone(out: Path, ids: dict[str, int], seed: int) -> None:
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from transformers.utils import logging as hf_logging

    text = {**TEXT, "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}
    config = Qwen3_5Config(
        text_config=text,
        vision_config=VISION,
        tie_word_embeddings=False,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    hf_logging.disable_progress_bar()  # a server's or a test's log is no terminal
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).float()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            _discriminating_(name, param, generator)
    model.save_pretrained(out)
    config_file = out / "config.json"
    _dump(config_file, json.loads(config_file.read_text()) | RANDOM_MARKER)


def _write_head(out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    from cascade.clef.head import JointSchemaHead

    head = JointSchemaHead(**HEAD)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in head.named_parameters():
            _discriminating_(name, param, generator)
        head.prior_logit_scale.fill_(3.0)
        head.joint_logit_scale.fill_(3.0)
        head.residual_gate.fill_(0.5)
    tensors = {k: v.detach().float().contiguous() for k, v in head.state_dict().items()}
    save_file(tensors, str(out / "joint_head.safetensors"))
    _dump(out / "joint_head_config.json", HEAD)


def _discriminating_(name: str, param, generator) -> None:  # noqa: ANN001 (torch types)
    """Matrices N(0, 0.1²); vectors (norms, biases) jittered by N(0, 0.1²); A_log kept."""
    import torch

    if name.endswith("A_log") or param.ndim == 0:
        return
    noise = torch.randn(param.shape, generator=generator) * 0.1
    if param.ndim >= 2:
        param.copy_(noise)
    else:
        param.add_(noise)


def _dump(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
