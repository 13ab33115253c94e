"""Find a Laya checkpoint: explicit path, then the local hub cache, then a hub download.

``resolve_checkpoint("english")`` (or an alias, or ``convaiinnovations/laya/multilingual``)
looks in the Hugging Face cache first and downloads only the files Laya needs (configs,
``model.safetensors``, ``tokenizer/*``, ``encoder/*``; progress bars shown) unless offline
(``offline=True`` or ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

from pathlib import Path

from cascade.laya.config import CheckpointError
from cascade.laya.preview import ALIASES

REPO = "convaiinnovations/laya"
SUBFOLDERS = {"english": "", "multilingual": "multilingual", "typed-decisions": "typed-decisions"}
FILES = ("rl_agent_config.json", "model.safetensors", "tokenizer/*", "encoder/*")


def _hub_name(ref: str) -> str | None:
    ref = ref.strip()
    if ref.lower() in ALIASES:
        return ALIASES[ref.lower()]
    if ref == REPO:
        return "english"
    sub = ref.removeprefix(REPO + "/")
    return next((name for name, folder in SUBFOLDERS.items() if folder and folder == sub), None)


def resolve_checkpoint(
    ref: str | Path, *, offline: bool | None = None, revision: str | None = None
) -> Path:
    """A local checkpoint directory for ``ref``; raises ``CheckpointError`` naming the problem."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "rl_agent_config.json").exists():
            raise CheckpointError(f"{path}: no rl_agent_config.json; not a Laya checkpoint")
        return path
    name = _hub_name(str(ref))
    if name is None:
        raise CheckpointError(
            f"{ref!r} is neither a checkpoint directory nor a Laya checkpoint "
            f"name ({', '.join(SUBFOLDERS)} or an alias)"
        )
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    folder = SUBFOLDERS[name]
    patterns = [f"{folder}/{f}" if folder else f for f in FILES]
    # The caller's choice (offline=True): a command that downloads can fetch it first.
    why = (
        f"this command downloads nothing: download it first (`cascade export laya {name}`) "
        "or pass a checkpoint directory"
    )
    if offline is None:
        offline = constants.HF_HUB_OFFLINE  # huggingface_hub's reading of HF_HUB_OFFLINE
        # Every download is off while it is set: the command that failed would fail again.
        local_dir = f"DIR/{folder}" if folder else "DIR"
        why = (
            "HF_HUB_OFFLINE is set: unset HF_HUB_OFFLINE so cascade can download it, or "
            f"pass a checkpoint directory (`hf download {REPO} --local-dir DIR`, then "
            f"{local_dir})"
        )
    try:
        local = snapshot_download(
            REPO, revision=revision, allow_patterns=patterns, local_files_only=True
        )
    except LocalEntryNotFoundError as exc:
        if offline:
            raise CheckpointError(f"Laya {name!r} is not in the local hub cache and {why}") from exc
        local = snapshot_download(REPO, revision=revision, allow_patterns=patterns)
    ckpt = Path(local) / folder
    if not (ckpt / "rl_agent_config.json").exists():
        raise CheckpointError(f"{REPO}/{folder}: the snapshot has no rl_agent_config.json")
    return ckpt
