"""Single flight: identical misses in flight at once are computed once.

The first caller to miss a key leads it; later callers missing the same key while it is being
computed wait for the leader's value instead of computing it again. A failure is never kept:
it wakes the waiters with the leader's exception. A leader that was cancelled (its client went
away) wakes them with ``Abandoned``, and they compute the value themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping


class Abandoned(Exception):
    """The leader of a key was cancelled before it had the value."""


class Flights:
    """The keys being computed now, each with the future its waiters await."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[bytes]] = {}

    def __len__(self) -> int:
        return len(self._running)

    def claim(self, keys: Iterable[str]) -> tuple[list[str], dict[str, asyncio.Future[bytes]]]:
        """``(keys this caller now leads, {key: future} of keys another caller leads)``."""
        led, waiting = [], {}
        loop = asyncio.get_running_loop()
        for key in dict.fromkeys(keys):
            running = self._running.get(key)
            if running is None:
                self._running[key] = loop.create_future()
                led.append(key)
            else:
                waiting[key] = running
        return led, waiting

    def land(
        self, values: Mapping[str, bytes], led: Iterable[str], error: BaseException | None = None
    ) -> None:
        """Hand each led key's value (or ``error``, or ``Abandoned`` when a key got no value)
        to its waiters, and end the flights."""
        for key in led:
            future = self._running.pop(key, None)
            if future is None or future.done():
                continue
            if key in values:
                future.set_result(values[key])
            else:
                future.set_exception(error if error is not None else Abandoned(key))
                future.exception()  # retrieved: no "never retrieved" warning without waiters


async def wait(futures: Mapping[str, asyncio.Future[bytes]]) -> dict[str, bytes | BaseException]:
    """Each future's value or exception (shielded: a waiter's own cancellation leaves the
    flights alone)."""
    out: dict[str, bytes | BaseException] = {}
    for key, future in futures.items():
        try:
            out[key] = await asyncio.shield(future)
        except Exception as exc:  # the leader's failure, or Abandoned
            out[key] = exc
    return out
