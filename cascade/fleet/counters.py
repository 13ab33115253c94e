"""Answer counts every replica adds to, in windows on Redis's clock.

A replica tallies the questions it answered (and those the strong tier answered) per bucket of
its own monotonic clock (``AnswerTally``, no I/O); a sync (``sync``) reads Redis's ``TIME`` and adds
each bucket's counts to the shared bucket of Redis's clock that bucket falls in (Redis's now
less its age here), so replicas whose wall clocks disagree still fill the same buckets. A
shared bucket is one hash (``answered``, ``strong``, ``HINCRBY``) that expires two windows
later; the window's totals (``Counts``) are the sums of its buckets. Counts a failed sync could
not add stay tallied for the next one, until they are older than the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from cascade.fleet.client import server_time

BUCKETS = 100  # per window
PREFIX = "cascade:fleet:answers:"


@dataclass(frozen=True)
class Counts:
    """Answers over one window (the fleet's, or one replica's), as the pacer reads them."""

    answered: int  # questions answered in the window
    strong: int  # of which by the strong tier
    leaving_answered: int  # in the window's oldest horizon (they leave it next)
    leaving_strong: int
    recent: int  # questions answered lately (about the newest horizon)
    span: float  # seconds ``recent`` covers


@dataclass
class AnswerTally:
    """What this replica answered since its last sync, by bucket of its monotonic clock."""

    window_s: float
    _pending: dict[int, list[int]] = field(default_factory=dict)

    @property
    def width(self) -> float:
        return self.window_s / BUCKETS

    def add(self, now: float, *, answered: int, strong: int) -> None:
        counts = self._pending.setdefault(math.floor(now / self.width), [0, 0])
        counts[0] += answered
        counts[1] += strong

    def taken(self, now: float) -> dict[int, list[int]]:
        """The buckets to add (``now`` on the same clock), the tally emptied; ``restore``
        them when the sync fails."""
        oldest = math.floor((now - self.window_s) / self.width)
        pending = {k: v for k, v in self._pending.items() if k > oldest}
        self._pending = {}
        return pending

    def restore(self, pending: dict[int, list[int]]) -> None:
        for key, (answered, strong) in pending.items():
            counts = self._pending.setdefault(key, [0, 0])
            counts[0] += answered
            counts[1] += strong


async def sync(
    redis: Any, tally: AnswerTally, now: float, horizon_s: float, least: int = 0
) -> Counts:
    """Add ``tally``'s buckets (``now``: its clock) to the shared ones and read the fleet's
    window back (``window_counts``). Raises what the Redis client raises; the tally keeps its
    counts then."""
    width = tally.width
    width_ms = max(1, round(width * 1000))
    prefix = f"{PREFIX}{width_ms}:"
    pending = tally.taken(now)
    try:
        server = await server_time(redis)
        ttl_ms = max(1000, round(2 * tally.window_s * 1000))
        current = math.floor(server / width)
        first = current - BUCKETS + 1
        async with redis.pipeline(transaction=False) as pipe:
            for key, (answered, strong) in pending.items():
                age = now - (key + 0.5) * width
                bucket = max(first, min(current, math.floor((server - age) / width)))
                pipe.hincrby(prefix + str(bucket), "answered", answered)
                pipe.hincrby(prefix + str(bucket), "strong", strong)
                pipe.pexpire(prefix + str(bucket), ttl_ms)
            for bucket in range(first, current + 1):
                pipe.hmget(prefix + str(bucket), "answered", "strong")
            found = await pipe.execute()
    except BaseException:
        tally.restore(pending)
        raise
    rows = found[-BUCKETS:]
    buckets = [
        (b * width, int(a or 0), int(s or 0))
        for b, (a, s) in zip(range(first, current + 1), rows, strict=True)
    ]
    return window_counts(buckets, server, tally.window_s, horizon_s, width, least)


def window_counts(
    buckets: list[tuple[float, int, int]],
    now: float,
    window_s: float,
    horizon_s: float,
    width: float,
    least: int = 0,
) -> Counts:
    """``Counts`` of ``buckets`` (start, answered, strong), oldest first, at ``now``;
    ``recent`` is the whole window's when the last horizon has fewer than ``least``."""
    answered = sum(a for _, a, _ in buckets)
    strong = sum(s for _, _, s in buckets)
    leaving = [(a, s) for start, a, s in buckets if start < now - window_s + horizon_s]
    recent = [(start, a) for start, a, _ in buckets if start + width > now - horizon_s]
    if sum(a for _, a in recent) < least:
        recent = [(start, a) for start, a, _ in buckets]
    started = min((start for start, a, _ in buckets if a), default=now)
    span = now - max(started, recent[0][0] if recent else now)
    return Counts(
        answered,
        strong,
        sum(a for a, _ in leaving),
        sum(s for _, s in leaving),
        sum(a for _, a in recent),
        max(0.0, span),
    )
