"""Labelled evaluation data: request lines with gold answers, validated as the gateway does.

One JSON object per line (the format of ``cascade/bench/requests-sample.jsonl``): ``id``, ``state``,
``questions``, ``gold`` ({question id: label}), optional ``images``/``assets`` and ``source``.
Labels take the form of ``items.jsonl`` answers: the choice key (its text for list criteria),
``true``/``false`` for a noul, the level index for a score.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from cascade.calls import EngineCall
from cascade.errors import ClientError
from cascade.http.images import collect_images
from cascade.http.intake import text_call
from cascade.questions import option_names
from cascade.schema import LIMITS, ChoiceQuestion, NoulQuestion, Question

Label = str | bool | int


class Item(msgspec.Struct, kw_only=True):
    id: str
    call: EngineCall
    gold: dict[str, Any]  # question id -> label (absent: no gold for that question)
    source: str = ""


class _Line(msgspec.Struct):
    id: str | int | None = None
    gold: dict[str, Any] = {}
    source: str = ""


class DataError(ValueError):
    """A data line the gateway itself would refuse, or without an id."""


def load_items(path: str | Path, *, model: str, limit: int | None = None) -> list[Item]:
    """The items of a JSONL file, each validated exactly as ``POST /v1/systemone`` validates a
    body (``model`` replaces the line's, so every item reaches the cascade). Raises
    ``DataError`` naming the line."""
    items: list[Item] = []
    seen: set[str] = set()
    with Path(path).open("rb") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            if limit is not None and len(items) >= limit:
                break
            try:
                meta = msgspec.json.decode(line, type=_Line)
                env, call = text_call(line, request_id=str(meta.id))
                if env.images or env.assets:
                    call.images = collect_images(env, {}, LIMITS)
            except (msgspec.DecodeError, msgspec.ValidationError, ClientError) as exc:
                raise DataError(f"{path}:{lineno}: {exc}") from exc
            if meta.id is None or str(meta.id) in seen:
                raise DataError(f"{path}:{lineno}: every item needs a unique `id`")
            seen.add(str(meta.id))
            call.model = model
            items.append(Item(id=str(meta.id), call=call, gold=meta.gold, source=meta.source))
    return items


def answer_label(question: Question, probabilities: Sequence[float]) -> Label:
    """The predicted label: argmax, the first maximum in the caller's order winning (as
    ``cascade.answers`` picks a choice)."""
    best = 0
    for i, p in enumerate(probabilities):
        if p > probabilities[best]:
            best = i
    if isinstance(question, ChoiceQuestion):
        return option_names(question)[best]
    if isinstance(question, NoulQuestion):
        return best == 1
    return best


def label_index(question: Question, label: Any) -> int | None:
    """The option index of a gold label (None when it names no option)."""
    if isinstance(question, ChoiceQuestion):
        names = option_names(question)
        return names.index(label) if label in names else None
    if isinstance(question, NoulQuestion):
        return int(label) if isinstance(label, bool) else None
    n = len(question.criteria)
    ok = isinstance(label, int) and not isinstance(label, bool) and 0 <= label < n
    return label if ok else None
