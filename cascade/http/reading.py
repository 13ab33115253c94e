"""Reading request bodies: capped in size, in time and in rate, under a budget of their own.

Admission (``CASCADE_MAX_INFLIGHT``) counts work, not connections, so a body is read before
its request takes an admission permit. A slow sender would otherwise hold a permit for the whole
read (256 connections sending one byte every 2 s kept an honest client at 2 answers in 25 s).
Instead:

- a body complete at its first read (the usual case: it came with, or right behind, its head)
  takes nothing; a body still arriving after its first read takes a slot of ``BodyReads``, at
  most ``max_body_reads`` at once and ``max_body_reads_per_client`` per client address; over
  the first 503, over the second 429, both with ``Retry-After``, at once;
- a body must keep up ``min_body_rate`` bytes/s on average once ``body_rate_grace_s`` has
  passed, and arrive whole within ``body_read_timeout_s``; otherwise 408.

A refused body is not read to its end: its answer carries ``connection: close``
(``closes_connection``), so the rest of a slow body never holds the connection.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, cast

from litestar import Request
from litestar.types import HTTPReceiveMessage

from cascade.errors import BodyTimeout, Overloaded, PayloadTooLarge, RateLimited
from cascade.http.context import context_in, context_of
from cascade.settings import Settings


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its work was cancelled."""


def closes_connection(scope: Any) -> bool:
    """Whether this request's answer must close its connection (its body was left unread)."""
    context = context_in(scope)
    return context is not None and context.close


class BodyReads:
    """The bodies being read that were not complete at their first read: at most ``limit`` at
    once, ``per_client`` per client address. Non-blocking: a refused slot is ``Overloaded`` at
    once. Used from the event loop only."""

    def __init__(self, limit: int, per_client: int) -> None:
        self.limit = limit
        self.per_client = per_client
        self.active = 0
        self._by_client: Counter[str] = Counter()

    @contextmanager
    def slot(self, client: str) -> Iterator[None]:
        if self._by_client[client] >= self.per_client:
            raise RateLimited(
                f"too many slow request bodies from this client (at most {self.per_client} "
                "at once); send the body with its request",
                retry_after=1,
            )
        if self.active >= self.limit:
            raise Overloaded(
                f"too many slow request bodies ({self.limit} being read)", retry_after=1
            )
        self.active += 1
        self._by_client[client] += 1
        try:
            yield
        finally:
            self.active -= 1
            self._by_client[client] -= 1
            if not self._by_client[client]:
                del self._by_client[client]


def _client(request: Request) -> str:
    client = request.scope.get("client")
    return str(client[0]) if client else ""


async def read_body(request: Request, settings: Settings, reads: BodyReads) -> bytes:
    """The raw body, refused past ``max_body_bytes`` (413), too slow or too late (408), or over
    the ``reads`` budget (429/503); each refusal closes the connection (module docstring)."""
    try:
        return await _read(request, settings, reads)
    except (BodyTimeout, Overloaded, PayloadTooLarge):
        context_of(request.scope).close = True
        raise


async def _read(request: Request, settings: Settings, reads: BodyReads) -> bytes:
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
    loop = asyncio.get_running_loop()
    started = loop.time()
    last = started + settings.body_read_timeout_s
    rate, grace = settings.min_body_rate, settings.body_rate_grace_s

    def deadline(size: int) -> float:  # each byte received buys 1/rate s past the grace
        return min(last, started + grace + size / rate)

    chunks: list[bytes] = []
    size = 0
    with ExitStack() as slot:  # holds a slot of ``reads`` from the second read on
        try:
            async with asyncio.timeout_at(deadline(0)) as timer:
                while True:
                    # An HTTP scope receives only http.request and http.disconnect (ASGI).
                    message = cast(HTTPReceiveMessage, await request.receive())
                    if message["type"] == "http.disconnect":
                        raise ClientGone()
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
                    if len(chunks) == 1:  # not complete at its first read
                        slot.enter_context(reads.slot(_client(request)))
                    timer.reschedule(deadline(size))
        except TimeoutError as exc:
            if loop.time() >= last:
                wait = settings.body_read_timeout_s
                raise BodyTimeout(f"request body not received within {wait} s") from exc
            raise BodyTimeout(
                f"request body arrived slower than {rate:g} bytes/s ({size} bytes in "
                f"{loop.time() - started:.1f} s)"
            ) from exc
