"""Request files, read once for eval, calibrate and distill: one ``Item`` per line.

One JSON object per line (the format of ``cascade/bench/requests-sample.jsonl``): ``id``,
``state``, ``questions``, ``gold`` ({question id: label}), optional ``images``/``assets`` and
``source``, validated exactly as ``POST /v1/systemone`` validates a body. Ids are unique: a
repeated id is an error naming both lines, never a silent merge. Labels take the form of
``items.jsonl`` answers: the choice key (its text for list criteria), ``true``/``false`` for a
noul, the level index for a score.

An item's ``key`` hashes its content (state, questions, controls, images), not its id or line:
the tier cache (``cascade.eval.tiercache``) and distill's held-back split follow the content.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec

from cascade.calls import EngineCall
from cascade.errors import ClientError
from cascade.request.decode import text_call
from cascade.request.images import collect_images
from cascade.schema import LIMITS


def content_key(call: EngineCall) -> str:
    """sha256 of the canonical JSON of a call's state, questions and controls (and of its
    images' bytes, when it has any)."""
    plain = [call.state, call.questions, call.controls]
    digest = hashlib.sha256(msgspec.json.encode(plain, order="sorted"))
    for image in call.images:
        digest.update(hashlib.sha256(image.data).digest())
    return digest.hexdigest()


class Item(msgspec.Struct, frozen=True, kw_only=True):
    """One validated request line. ``gold``: question id -> label (absent: no gold for that
    question). ``weight`` and ``teacher`` are distill's: the item's share in the loss, and the
    strong tier's probabilities (caller order) once known."""

    id: str
    call: EngineCall
    gold: dict[str, Any] = {}
    source: str = ""
    weight: float = 1.0
    teacher: dict[str, list[float]] | None = None

    @property
    def key(self) -> str:
        return content_key(self.call)

    def only(self, qid: str) -> EngineCall:
        """The call restricted to one question (distill builds rows per question)."""
        return msgspec.structs.replace(self.call, questions={qid: self.call.questions[qid]})


class _Line(msgspec.Struct):
    id: str | int | None = None
    gold: dict[str, Any] = {}
    source: str = ""


class DataError(ValueError):
    """A data file that cannot be read as items; the message names the file and line."""


def read_items(
    path: str | Path,
    *,
    model: str | None = None,
    limit: int | None = None,
    lenient: bool = False,
    text_only: bool = False,
) -> tuple[list[Item], dict[str, Any]]:
    """The items of a JSONL file in file order, and what was left out of it.

    ``model`` replaces each line's (so every item reaches the cascade). Strict (the default), a
    line the gateway would refuse or without an ``id`` raises ``DataError``; ``lenient``, it is
    left out and counted (``invalid``, the first quoted in ``first_invalid``) and an id-less line
    is named ``line-N``. ``text_only`` leaves out lines with images (``with_images``). A repeated
    id always raises."""
    items: list[Item] = []
    left_out: dict[str, Any] = {}
    first_line: dict[str, int] = {}
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc})") from exc
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if limit is not None and len(items) >= limit:
            break
        try:
            item = _item(line, lineno, lenient=lenient, text_only=text_only)
        except (msgspec.DecodeError, msgspec.ValidationError, ClientError, DataError) as exc:
            if not lenient:
                raise DataError(f"{path}:{lineno}: {exc}") from exc
            left_out["invalid"] = left_out.get("invalid", 0) + 1
            left_out.setdefault("first_invalid", f"line {lineno}: {exc}")
            continue
        if item is None:
            left_out["with_images"] = left_out.get("with_images", 0) + 1
            continue
        if item.id in first_line:
            raise DataError(
                f"{path}:{lineno}: duplicate id {item.id!r} (first on line "
                f"{first_line[item.id]}); every item needs a unique `id`"
            )
        first_line[item.id] = lineno
        items.append(
            item
            if model is None
            else msgspec.structs.replace(item, call=msgspec.structs.replace(item.call, model=model))
        )
    return items, left_out


def _item(line: bytes, lineno: int, *, lenient: bool, text_only: bool) -> Item | None:
    """One line's item (None: it has images and ``text_only`` leaves it out)."""
    meta = msgspec.json.decode(line, type=_Line)
    if meta.id is None and not lenient:
        raise DataError("every item needs a unique `id`")
    item_id = f"line-{lineno}" if meta.id is None else str(meta.id)
    env, call = text_call(line, request_id=item_id)
    if env.images or env.assets:
        if text_only:
            return None
        call.images = collect_images(env, {}, LIMITS)
    return Item(id=item_id, call=call, gold=meta.gold, source=meta.source)


def load_items(path: str | Path, *, model: str, limit: int | None = None) -> list[Item]:
    """The labelled items of an evaluation file (strict: ``DataError`` names the bad line)."""
    return read_items(path, model=model, limit=limit)[0]
