"""Locate, load and verify a Clef release (``Cloudflare/clef-flash`` or ``Cloudflare/clef``).

A release directory holds Qwen3.5 shards loadable by ``Qwen3_5ForConditionalGeneration``,
``joint_head.safetensors`` + ``joint_head_config.json``, and the tokenizer and processor
configs. ``resolve_release`` accepts a local directory or a hub id already in the hub cache;
it never touches the network unless ``allow_download`` is set. Loading is bf16 on CUDA and
fp32 on the CPU for the backbone; the head always runs in fp32 (cheap next to the backbone,
and it keeps the span means and cosine scores of long prompts out of bf16 rounding).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.errors import EngineUnavailable

REQUIRED = (
    "config.json",
    "joint_head.safetensors",
    "joint_head_config.json",
    "tokenizer_config.json",
)
HEAD_KEYS = ("hidden_size", "width", "routing_layers", "layers", "heads", "feedforward")


class ReleaseError(EngineUnavailable):
    """The release is missing, incomplete or does not match its own configs."""


@dataclass(frozen=True)
class Release:
    """A loaded release: backbone, head, tokenizer and where they came from."""

    path: Path
    backbone: Any  # Qwen3_5ForConditionalGeneration, eval mode
    head: Any  # cascade.clef.head.JointSchemaHead, fp32, eval mode
    tokenizer: Any  # the release's transformers tokenizer
    device: Any  # torch.device
    dtype: Any  # the backbone's torch dtype


def resolve_release(
    release: str | Path, *, allow_download: bool = False, cache_dir: Path | None = None
) -> Path:
    """A local directory as is, or the hub cache snapshot of a repo id (offline by default).

    ``cache_dir`` overrides the hub cache (default: huggingface_hub's, ``HF_HUB_CACHE``).
    """
    path = Path(release).expanduser()
    if not path.is_dir():
        path = _from_hub(str(release), allow_download, cache_dir)
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        raise ReleaseError(f"{path} is not a Clef release: missing {', '.join(missing)}")
    return path


def content_hash(path: Path) -> str:
    """sha256 over the files that define the release's outputs (every top-level ``*.json`` and
    ``*.safetensors``: configs, tokenizer, head and backbone weights), each preceded by its name,
    as ``cascade.laya.checkpoint.content_hash`` does for Laya. Reads every byte (about 19 GB for
    Clef-flash), so callers compute it once, only when a calibration or decision log asks."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors"))
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def _from_hub(repo_id: str, allow_download: bool, cache_dir: Path | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(repo_id, local_files_only=not allow_download, cache_dir=cache_dir)
        )
    except (LocalEntryNotFoundError, HFValidationError, OSError) as exc:
        where = "on the hub" if allow_download else "in the local hub cache (offline)"
        raise ReleaseError(f"Clef release {repo_id!r} is not a directory nor {where}") from exc


def pick_device(device: str = "auto") -> Any:
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def load(path: Path, device: str = "auto") -> Release:
    """Load a located release on ``device`` ("auto": CUDA when available)."""
    import torch
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a server's or a test's log is no terminal
    dev = pick_device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    backbone = Qwen3_5ForConditionalGeneration.from_pretrained(
        path, dtype=dtype, device_map={"": str(dev)}
    ).eval()
    backbone.config.use_cache = False
    head = load_head(path, backbone.config.text_config.hidden_size).to(dev)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return Release(
        path=path, backbone=backbone, head=head, tokenizer=tokenizer, device=dev, dtype=dtype
    )


def head_config(path: Path) -> dict[str, int]:
    config = json.loads((path / "joint_head_config.json").read_text())
    missing = [k for k in HEAD_KEYS if k not in config]
    if missing:
        raise ReleaseError(f"joint_head_config.json lacks {', '.join(missing)}")
    return {k: int(config[k]) for k in HEAD_KEYS}


def load_head(path: Path, hidden_size: int) -> Any:
    """The fp32 head, checked tensor by tensor against the config before a strict load."""
    from safetensors.torch import load_file

    from cascade.clef.head import JointSchemaHead

    config = head_config(path)
    if config["hidden_size"] != hidden_size:
        raise ReleaseError(
            f"joint head expects hidden_size {config['hidden_size']}; "
            f"the backbone has {hidden_size}"
        )
    head = JointSchemaHead(**config)
    tensors = load_file(str(path / "joint_head.safetensors"))
    problems = head_mismatches(head.state_dict(), tensors)
    if problems:
        raise ReleaseError(
            "joint_head.safetensors does not match joint_head_config.json: " + "; ".join(problems)
        )
    head.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return head.float().eval()


def head_mismatches(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """Human-readable differences in names and shapes (empty when they match)."""
    problems = [f"missing {k}" for k in expected if k not in found]
    problems += [f"unexpected {k}" for k in found if k not in expected]
    problems += [
        f"{k} has shape {list(found[k].shape)}, expected {list(v.shape)}"
        for k, v in expected.items()
        if k in found and tuple(found[k].shape) != tuple(v.shape)
    ]
    return problems
