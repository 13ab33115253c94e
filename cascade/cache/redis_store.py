"""``RedisCacheStore``: the decision cache in Redis, shared by every replica that points at it.

Each operation is bounded by ``timeout_s`` (connecting included). A failure or timeout is
counted (``cascade_cache_errors_total{op}``) and reads as a miss, or drops the write; after one,
Redis is left alone for ``retry_s`` (lookups miss at once rather than each waiting out a timeout
on a Redis that is down). Entries expire after ``ttl_s`` (``PX``); the bound on bytes is Redis's
own ``maxmemory`` with an LRU eviction policy (``allkeys-lru``). Needs the ``redis`` package.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cascade import metrics

log = logging.getLogger("cascade")
PREFIX = "cascade:cache:"


class RedisCacheStore:
    def __init__(
        self,
        url: str,
        *,
        ttl_s: float,
        timeout_s: float,
        retry_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from redis.asyncio import Redis

        self._redis: Any = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._errors: tuple[type[BaseException], ...] = _errors()
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.clock = clock
        self._resting_until = float("-inf")

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys or self.clock() < self._resting_until:
            return [None] * len(keys)
        try:
            async with asyncio.timeout(self.timeout_s):
                found = await self._redis.mget([PREFIX + key for key in keys])
        except self._errors as exc:
            self._failed("get", exc)
            return [None] * len(keys)
        return [value if isinstance(value, bytes) else None for value in found]

    async def put_many(self, items: Mapping[str, bytes]) -> None:
        if not items or self.clock() < self._resting_until:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._redis.pipeline(transaction=False) as pipe:
                    for key, value in items.items():
                        pipe.set(PREFIX + key, value, px=self.ttl_ms)
                    await pipe.execute()
        except self._errors as exc:
            self._failed("put", exc)

    async def aclose(self) -> None:
        await self._redis.aclose()

    def _failed(self, op: str, exc: BaseException) -> None:
        metrics.CACHE_ERRORS.labels(op=op).inc()
        self._resting_until = self.clock() + self.retry_s
        log.warning(
            "cache: redis %s failed (%s); misses for %.1f s", op, type(exc).__name__, self.retry_s
        )


def _errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)
