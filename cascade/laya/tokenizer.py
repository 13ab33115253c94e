"""The checkpoint's tokenizer, read with ``tokenizers`` alone (spec §1.5).

Special tokens come from ``tokenizer/tokenizer_config.json`` (a string or ``{"content": ...}``),
falling back to ``special_tokens_map.json``; vocabulary guesses are never used. Text is always
encoded without special tokens, padding or truncation: Laya inserts CLS/SEP itself. A
``tokenizers.Tokenizer`` is safe to share between threads once padding/truncation are off.

A long text is encoded in pieces of about ``PIECE_CHARS`` characters: ``tokenizers`` keeps
several words of bookkeeping per byte while it encodes (a 1,000,000-character state took
160 MiB), and the state's exact token count is part of the answer's usage. The pieces give the
very same ids as the whole text: they are cut only at a single space between two letters or
digits, which the byte-level pre-tokenizer's regex always splits before (the space starts the
next word's token) and NFC never composes across, and only for a tokenizer whose pre-tokenizer
is that regex and whose added tokens cannot match across such a space (none mixes whitespace
with other characters, or strips whitespace towards a letter or digit). Any other tokenizer
encodes the whole text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, normalizers, pre_tokenizers

from cascade.laya.config import CheckpointError

_ROLES = ("cls", "sep", "pad", "mask", "unk")
PIECE_CHARS = 1 << 16
_CUT = re.compile(r"(?<=[^\W_]) (?=[^\W_])")  # a space between two letters or digits


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def cuts_safely(tok: Tokenizer) -> bool:
    """Whether ``_CUT`` positions are word boundaries for ``tok``."""
    pre, norm = tok.pre_tokenizer, tok.normalizer
    if not isinstance(pre, pre_tokenizers.ByteLevel) or not pre.use_regex:
        return False
    if norm is not None and not isinstance(norm, normalizers.NFC):
        return False
    for added in tok.get_added_tokens_decoder().values():
        text, lstrip, rstrip = added.content, added.lstrip, added.rstrip
        if not text or (lstrip and text[0].isalnum()) or (rstrip and text[-1].isalnum()):
            return False
        # Runs of spaces (ModernBERT has 2 to 24 as added tokens) never reach a cut, which has
        # a letter or digit on each side; whitespace beside other characters could span one.
        if any(c.isspace() for c in text) and not (text.isspace() and not lstrip and not rstrip):
            return False
    return True


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` cut at ``_CUT`` positions into pieces of about ``size`` characters (longer
    where no such position comes sooner)."""
    start = 0
    while len(text) - start > size:
        cut = _CUT.search(text, start + size // 2)
        if cut is None:
            break
        yield text[start : cut.start()]
        start = cut.start()
    yield text[start:]


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
        self._in_pieces = cuts_safely(self._tok)
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
        if len(text) <= PIECE_CHARS or not self._in_pieces:
            return self._tok.encode(text, add_special_tokens=False).ids
        ids: list[int] = []
        for piece in pieces(text):
            ids += self._tok.encode(piece, add_special_tokens=False).ids
        return ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def strip_mask(self, text: str) -> str:
        """Laya replaces the literal mask string in user text by a space before encoding."""
        return text.replace(self.mask_text, " ")
