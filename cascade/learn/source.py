"""What ``cascade distill`` learns from: a request file, read here into ``Item``s.

A request file is the evaluation format, one JSON object per line: ``id``, ``state``,
``questions`` and optional Laya controls (``max_len``...), validated exactly as the gateway
validates a body; ``gold`` and anything else are ignored: the teacher is the strong tier, which
distil runs itself. Lines the gateway would refuse are left out and counted (the first refusal
is quoted), as are lines with images (Laya reads text only, so the teacher's answer would rest
on what the student cannot see). Each item's ``key`` is the sha256 of its
canonical (state, questions, controls) JSON, so the teacher cache and the held-back split follow
the content, not the line order or the ids. ``data_hash`` fingerprints a whole data set.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec

from cascade.calls import EngineCall
from cascade.errors import ClientError
from cascade.http.intake import text_call


class SourceError(ValueError):
    """A source file distil cannot read; the message names the file and line."""


class Item(msgspec.Struct, frozen=True, kw_only=True):
    """One validated call; ``teacher`` is set when the source already holds the strong tier's
    answers (the decision log), else distil asks the strong tier."""

    key: str
    call: EngineCall
    weight: float = 1.0  # the item's share in the loss and the held-back figures
    teacher: dict[str, list[float]] | None = None  # question id -> probabilities, caller order

    def only(self, qid: str) -> EngineCall:
        """The call restricted to one question (rows are built per question)."""
        return msgspec.structs.replace(self.call, questions={qid: self.call.questions[qid]})


def content_key(call: EngineCall) -> str:
    """sha256 of the canonical JSON of a call's state, questions and controls."""
    plain = [call.state, call.questions, call.controls]
    return hashlib.sha256(msgspec.json.encode(plain, order="sorted")).hexdigest()


class _Meta(msgspec.Struct):
    id: str | int | None = None


def read_requests(path: Path) -> tuple[list[Item], dict[str, Any]]:
    """The text items of a request file in file order (repeated content kept once), and what
    was left out."""
    items: dict[str, Item] = {}
    left_out: dict[str, Any] = {}
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc})") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            meta = msgspec.json.decode(line, type=_Meta)
            env, call = text_call(line, request_id=str(meta.id or f"line-{number}"))
        except (msgspec.DecodeError, msgspec.ValidationError, ClientError) as exc:
            left_out["invalid"] = left_out.get("invalid", 0) + 1
            left_out.setdefault("first_invalid", f"line {number}: {exc}")
            continue
        if env.images or env.assets:
            left_out["with_images"] = left_out.get("with_images", 0) + 1
            continue
        key = content_key(call)
        items.setdefault(key, Item(key=key, call=call))
    if not items:
        raise SourceError(f"{path}: no usable text requests {left_out or ''}".rstrip())
    return list(items.values()), left_out


def data_hash(items: list[Item]) -> str:
    """sha256 over every item's key, weight and given teacher answers, in order."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(item.key.encode() + msgspec.json.encode([item.weight, item.teacher]))
    return digest.hexdigest()
