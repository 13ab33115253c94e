"""The checkpoint's tokenizer, read with ``tokenizers`` alone (spec §1.5).

Special tokens come from ``tokenizer/tokenizer_config.json`` (a string or ``{"content": ...}``),
falling back to ``special_tokens_map.json``; vocabulary guesses are never used. Text is always
encoded without special tokens, padding or truncation: Laya inserts CLS/SEP itself. A
``tokenizers.Tokenizer`` is safe to share between threads once padding/truncation are off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from cascade.laya.config import CheckpointError

_ROLES = ("cls", "sep", "pad", "mask", "unk")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(tok_dir: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = tok_dir / name
        if not path.exists():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        for role in _ROLES:
            text = _token_text(data.get(f"{role}_token"))
            if text is not None:
                found.setdefault(role, text)
    return found


class LayaTokenizer:
    """Encodes text to ids; exposes Laya's special ids and the mask string to strip."""

    def __init__(self, tok_dir: Path) -> None:
        path = tok_dir / "tokenizer.json"
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise CheckpointError(f"{path}: cannot load tokenizer ({exc})") from exc
        self._tok.no_padding()
        self._tok.no_truncation()
        specials = _special_tokens(tok_dir)
        ids = {}
        for role in ("cls", "sep", "pad", "mask"):
            text = specials.get(role)
            token_id = self._tok.token_to_id(text) if text is not None else None
            if token_id is None:
                raise CheckpointError(
                    f"{tok_dir}: no usable {role}_token in tokenizer_config.json or "
                    f"special_tokens_map.json (got {text!r})"
                )
            ids[role] = token_id
        self.cls_id, self.sep_id = ids["cls"], ids["sep"]
        self.pad_id, self.mask_id = ids["pad"], ids["mask"]
        self.mask_text: str = specials["mask"]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens (added tokens in the text still match)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def strip_mask(self, text: str) -> str:
        """Laya replaces the literal mask string in user text by a space before encoding."""
        return text.replace(self.mask_text, " ")
