"""The tier-output cache eval, calibrate and distill share: one JSONL file per tier.

A line per finished item (``{"key", "id", "run"}``), appended and flushed as items finish, so an
interrupted run resumes where it stopped; a torn last line is ignored. A line is reused only
when its key matches (``item_key``): the tier's identity (``cascade.eval.tiers.identity``: the
content hash of its weights, or what an upstream reports), the Laya checkpoint, and the item's
content. Rewriting a tier's weights in place changes the identity, so nothing stale is reused.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from cascade.calls import EngineAnswer, EngineCall
from cascade.eval.data import content_key


class TierRun(msgspec.Struct, kw_only=True):
    """One tier's output on one item: its answer (None if it answered nothing) and the
    questions it refused, with why."""

    answer: EngineAnswer | None
    refused: dict[str, str] = msgspec.field(default_factory=dict)


class _CacheLine(msgspec.Struct):
    key: str
    id: str
    run: TierRun


def item_key(identity: str, checkpoint: str | None, call: EngineCall) -> str:
    """The cache key of ``call`` on the tier ``identity`` names (``checkpoint``: Laya's)."""
    return hashlib.sha256(f"{identity}\0{checkpoint}\0{content_key(call)}".encode()).hexdigest()


class TierCache:
    """One tier's finished items by key, read from ``path`` and appended to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[str, TierRun] = {}
        torn = False
        if path.exists():
            text = path.read_bytes()
            torn = bool(text) and not text.endswith(b"\n")
            for raw in text.splitlines():
                try:
                    line = msgspec.json.decode(raw, type=_CacheLine)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                self.runs[line.key] = line.run
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("ab")
        if torn:  # an interrupted write: end it, so the next line starts clean
            self._handle.write(b"\n")

    def put(self, key: str, item_id: str, run: TierRun) -> None:
        self.runs[key] = run
        self._handle.write(msgspec.json.encode(_CacheLine(key=key, id=item_id, run=run)) + b"\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()
