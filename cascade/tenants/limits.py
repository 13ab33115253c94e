"""Per-minute limits as GCRA (the generic cell rate algorithm), sans IO, on an injected clock.

A limit of L per minute is a bucket that holds L units and refills continuously (one unit
every 60/L s), kept as one number per key: the theoretical arrival time (TAT), when the
bucket would be full again. A charge of n units moves the TAT n·60/L s later; it is allowed
while the TAT stays within a minute of now. So a tenant may burst up to L at once, then gets
L per minute; ``remaining`` is the units left and ``reset`` the time until the bucket is full.
A request larger than the whole limit is let through when the bucket is full (its excess is a
debt paid before the next); ``charge`` without a check records what was known only afterwards
(input tokens, strong-tier questions), so the request after that one is the one refused.

``LocalStore`` keeps TATs in this process (limits per replica); ``cascade.tenants.redis_store``
runs the same arithmetic in Redis (limits across replicas).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

import msgspec

WINDOW_S = 60.0
_EPSILON = 1e-6  # L charges of 60/L s each must fit in the window despite rounding


class Check(msgspec.Struct, frozen=True):
    """One limit of an admission. ``take``: charge ``cost`` units (refused when they do not
    fit); ``peek``: refused unless one unit is left, nothing charged; ``look``: never refused,
    nothing charged (its level says whether a unit is left)."""

    key: str
    per_min: int
    cost: int = 1
    mode: Literal["take", "peek", "look"] = "take"


class LimitLevel(msgspec.Struct, frozen=True):
    """A limit after a check: what the ``x-ratelimit-*`` headers say."""

    limit: int
    remaining: int
    reset_s: float


class LimitVerdict(msgspec.Struct, frozen=True):
    allowed: bool
    levels: list[LimitLevel]  # one per check, in order
    retry_after_s: float = 0.0  # when refused: until every refused check would pass


def level(per_min: int, ahead_s: float) -> LimitLevel:
    """A limit whose TAT is ``ahead_s`` from now."""
    used = max(0.0, ahead_s) * per_min / WINDOW_S
    return LimitLevel(
        limit=per_min,
        remaining=max(0, math.floor(per_min - used + _EPSILON)),
        reset_s=max(0.0, ahead_s),
    )


class Gcra:
    """TATs by key. ``admit`` is all or nothing: a refused request charges no limit."""

    def __init__(self) -> None:
        self.tat: dict[str, float] = {}

    def admit(self, checks: Sequence[Check], now: float) -> LimitVerdict:
        start = [max(self.tat.get(c.key, now), now) for c in checks]
        wait = 0.0
        for check, tat in zip(checks, start, strict=True):
            need = min(check.cost if check.mode == "take" else 1, check.per_min)
            over = tat + need * WINDOW_S / check.per_min - now - WINDOW_S
            if check.mode != "look" and over > _EPSILON:
                wait = max(wait, over)
        if wait == 0:
            for i, check in enumerate(checks):
                if check.mode == "take":
                    start[i] += check.cost * WINDOW_S / check.per_min
                    self.tat[check.key] = start[i]
        levels = [level(c.per_min, t - now) for c, t in zip(checks, start, strict=True)]
        return LimitVerdict(wait == 0, levels, retry_after_s=wait)

    def charge(self, key: str, per_min: int, cost: int, now: float) -> LimitLevel:
        """Add ``cost`` units, never refused; the limit's level after them."""
        self.tat[key] = max(self.tat.get(key, now), now) + cost * WINDOW_S / per_min
        return level(per_min, self.tat[key] - now)


class BackendFailed(Exception):
    """The shared store did not answer in time, or failed (Redis down, slow, refusing)."""


class BackendResting(BackendFailed):
    """The shared store is not asked: it failed less than its ``retry_s`` ago."""


class LimitStore(Protocol):
    """Where the TATs live: this process or Redis (which raises ``BackendFailed``). Each method
    is one call to the store."""

    async def admit(self, checks: Sequence[Check]) -> LimitVerdict: ...

    async def charge(self, checks: Sequence[Check]) -> list[LimitLevel]:
        """Add each check's ``cost``, never refused; each limit's level after it."""
        ...

    async def aclose(self) -> None: ...


class LocalStore:
    """Limits per replica: a ``Gcra`` on ``clock``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.gcra = Gcra()
        self.clock = clock

    async def admit(self, checks: Sequence[Check]) -> LimitVerdict:
        return self.gcra.admit(checks, self.clock())

    async def charge(self, checks: Sequence[Check]) -> list[LimitLevel]:
        now = self.clock()
        return [self.gcra.charge(c.key, c.per_min, c.cost, now) for c in checks]

    async def aclose(self) -> None:
        return None
