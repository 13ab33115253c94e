"""The fleet's Redis client: every call bounded by a timeout, and Redis's clock."""

from __future__ import annotations

from typing import Any


def connect(url: str, timeout_s: float) -> Any:
    """A client of ``url`` whose every call (connecting included) gives up after
    ``timeout_s``. Needs the ``redis`` package."""
    from redis.asyncio import Redis

    return Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def errors() -> tuple[type[BaseException], ...]:
    """What a failed or timed-out call raises."""
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


async def server_time(redis: Any) -> float:
    """Redis's clock, seconds: the one every replica shares, whatever their own say."""
    seconds, micros = await redis.time()
    return int(seconds) + int(micros) / 1e6
