"""Gates the fleet publishes: the latest one of each kind, with who published it and when.

A gate is a JSON document under ``cascade:fleet:gate:<kind>`` that expires after ``ttl_s``
(a fleet that stopped publishing leaves none behind): ``budget``, the cuts of a replica that
paces on history, which a replica without any starts from; ``refit``, the thresholds the
lease holder fitted on the fleet's labels, which every replica adopts.
"""

from __future__ import annotations

from typing import Any

import msgspec

PREFIX = "cascade:fleet:gate:"


class Published(msgspec.Struct, kw_only=True):
    """One published gate. ``thresholds``: ``type:band`` -> threshold (or cut); ``evidence``:
    per cell what it was fitted on (refit gates); ``at``: Redis's clock, seconds; ``policy``:
    the hash of the policy it was fitted under (refit gates: ``cascade.policy.fingerprint``)."""

    replica: str
    thresholds: dict[str, float]
    at: float
    evidence: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    policy: str = ""


_decoder = msgspec.json.Decoder(Published)


async def publish(redis: Any, kind: str, gate: Published, ttl_s: float) -> None:
    await redis.set(PREFIX + kind, msgspec.json.encode(gate), px=max(1, round(ttl_s * 1000)))


async def read(redis: Any, kind: str) -> Published | None:
    found = await redis.get(PREFIX + kind)
    return None if found is None else _decoder.decode(found)
