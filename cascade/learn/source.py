"""What ``cascade distill`` learns from: a request file, read by eval's reader into ``Item``s.

A request file is the evaluation format (``cascade.eval.data``), one JSON object per line:
``id``, ``state``, ``questions`` and optional Laya controls (``max_len``...), validated exactly
as the gateway validates a body; ``gold`` and anything else are ignored: the teacher is the
strong tier, which distil runs itself. A repeated id is an error naming the line. Lines the
gateway would refuse are left out and counted (the first refusal is quoted), as are lines with
images (Laya reads text only, so the teacher's answer would rest on what the student cannot
see) and lines repeating an earlier line's content (``repeated``: learnt from once). Each
item's ``key`` hashes its content, so the teacher cache and the held-back split follow the
content, not the line order or the ids. ``data_hash`` fingerprints a whole data set.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec

from cascade.eval.data import DataError, Item, read_items


class SourceError(DataError):
    """A source distil cannot learn from; the message names the file (and line)."""


def read_requests(path: Path) -> tuple[list[Item], dict[str, Any]]:
    """The text items of a request file in file order (repeated content kept once, and
    counted), and what was left out."""
    read, left_out = read_items(path, lenient=True, text_only=True)
    items: dict[str, Item] = {}
    for item in read:
        if item.key in items:
            left_out["repeated"] = left_out.get("repeated", 0) + 1
        items.setdefault(item.key, item)
    if not items:
        raise SourceError(f"{path}: no usable text requests {left_out or ''}".rstrip())
    return list(items.values()), left_out


def data_hash(items: list[Item]) -> str:
    """sha256 over every item's key, weight and given teacher answers, in order."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(item.key.encode() + msgspec.json.encode([item.weight, item.teacher]))
    return digest.hexdigest()
