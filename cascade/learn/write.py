"""Write NEWDIR: a standard Laya checkpoint with the distilled weights, plus ``distill.json``.

Everything but the weights is the source's, byte for byte: its top-level files
(``rl_agent_config.json`` and the like) and its ``encoder/`` and ``tokenizer/`` folders
(symlinks of a hub snapshot are copied as files; sibling checkpoints in sub-folders are not).
``model.safetensors`` holds the same tensor names, shapes and dtypes as the source's, with its
``__metadata__``. The directory is assembled beside NEWDIR and renamed into place, checked
first with the same strict inventory the engine loads through; an existing NEWDIR is refused.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from cascade.laya.checkpoint import load_weights
from cascade.laya.config import load_config

META_FILE = "distill.json"
WEIGHTS = "model.safetensors"
FOLDERS = ("encoder", "tokenizer")


def refuse_existing(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists; distil writes a new checkpoint directory only")


def write_checkpoint(
    source: Path, out: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> Path:
    """Assemble NEWDIR from ``source`` and ``tensors`` (already in the source's dtypes)."""
    refuse_existing(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for path in source.iterdir():
            if path.is_file() and path.name not in (WEIGHTS, META_FILE):
                shutil.copyfile(path, work / path.name)
            elif path.is_dir() and path.name in FOLDERS:
                shutil.copytree(path, work / path.name)
        with safe_open(str(source / WEIGHTS), "pt") as fh:
            metadata = fh.metadata()
        save_file(tensors, str(work / WEIGHTS), metadata=metadata)
        load_weights(work, load_config(work))  # the engine's own strict check
        (work / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        work.chmod(0o755)
        if out.exists():
            out.rmdir()  # an empty directory, checked above
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out
