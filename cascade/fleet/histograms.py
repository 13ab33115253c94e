"""Confidence histograms every replica adds to, in windows on Redis's clock (the fleet's drift).

A replica tallies the gate confidences it saw, already binned on the reference's edges (the
calibration snapshot's), per cell and bucket of its own monotonic clock (``ConfidenceTally``,
no I/O); a sync (``sync``) adds each bucket's counts to the shared bucket of Redis's clock it
falls in (Redis's now less its age here), as ``cascade.fleet.counters`` does for answers. A
shared bucket is one hash (field ``cell|bin``, ``HINCRBY``) that expires two windows later,
under a key naming the reference, so only replicas binning on the same snapshot add up. The
fleet's window (``Merged``) is the sum of its buckets. Counts a failed sync could not add stay
tallied for the next one, until they are older than the window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cascade.fleet.client import server_time

BUCKETS = 12  # per window, as the replica's own drift window has slices
PREFIX = "cascade:fleet:confidences:"

Merged = dict[str, list[int]]  # cell ("choice:2") -> the fleet's counts per bin over the window


@dataclass
class ConfidenceTally:
    """The confidences this replica saw since its last sync: per bucket of its monotonic
    clock, per cell, counts on the reference's bins. ``reference`` names the reference (its
    hash); ``bins``: each cell's number of bins."""

    window_s: float
    reference: str
    bins: Mapping[str, int]
    _pending: dict[int, dict[str, list[int]]] = field(default_factory=dict)

    @property
    def width(self) -> float:
        return self.window_s / BUCKETS

    def add(self, now: float, cell: str, at: int) -> None:
        """Count one confidence of ``cell`` in bin ``at`` now."""
        bucket = self._pending.setdefault(math.floor(now / self.width), {})
        bucket.setdefault(cell, [0] * self.bins[cell])[at] += 1

    def taken(self, now: float) -> dict[int, dict[str, list[int]]]:
        """The buckets to add (``now`` on the same clock), the tally emptied; ``restore``
        them when the sync fails."""
        oldest = math.floor((now - self.window_s) / self.width)
        pending = {k: v for k, v in self._pending.items() if k > oldest}
        self._pending = {}
        return pending

    def restore(self, pending: dict[int, dict[str, list[int]]]) -> None:
        for key, cells in pending.items():
            bucket = self._pending.setdefault(key, {})
            for cell, counts in cells.items():
                mine = bucket.setdefault(cell, [0] * len(counts))
                bucket[cell] = [a + b for a, b in zip(mine, counts, strict=True)]


async def sync(redis: Any, tally: ConfidenceTally, now: float) -> Merged:
    """Add ``tally``'s buckets (``now``: its clock) to the shared ones and read the fleet's
    window back. Raises what the Redis client raises; the tally keeps its counts then."""
    width = tally.width
    prefix = f"{PREFIX}{tally.reference}:{max(1, round(width * 1000))}:"
    pending = tally.taken(now)
    try:
        server = await server_time(redis)
        ttl_ms = max(1000, round(2 * tally.window_s * 1000))
        current = math.floor(server / width)
        first = current - BUCKETS + 1
        async with redis.pipeline(transaction=False) as pipe:
            for key, cells in pending.items():
                age = now - (key + 0.5) * width
                bucket = prefix + str(max(first, min(current, math.floor((server - age) / width))))
                for cell, counts in cells.items():
                    for at, n in enumerate(counts):
                        if n:
                            pipe.hincrby(bucket, f"{cell}|{at}", n)
                pipe.pexpire(bucket, ttl_ms)
            for bucket_no in range(first, current + 1):
                pipe.hgetall(prefix + str(bucket_no))
            found = await pipe.execute()
    except BaseException:
        tally.restore(pending)
        raise
    return merged(found[-BUCKETS:], tally.bins)


def merged(buckets: list[dict[bytes, bytes]], bins: Mapping[str, int]) -> Merged:
    """The sum of ``buckets`` (``HGETALL`` replies) per cell of ``bins``."""
    out = {cell: [0] * n for cell, n in bins.items()}
    for fields in buckets:
        for name, value in fields.items():
            cell, _, at = name.decode().rpartition("|")
            counts = out.get(cell)
            if counts is not None and at.isdigit() and int(at) < len(counts):
                counts[int(at)] += int(value)
    return out
