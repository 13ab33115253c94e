"""The limits' TATs in Redis, so every replica shares them (``[limits] backend = "redis"``).

One Lua script per admission runs ``cascade.tenants.limits.Gcra``'s arithmetic atomically on
Redis's own clock (``TIME``: replicas' clocks may differ, Redis has one), in milliseconds; each
key expires once its bucket is full again. Every call is bounded by ``timeout_s`` (connect
included); a failure or a timeout is ``BackendFailed``, which the admission counts and answers
as configured (``on_error``). After one, Redis is left alone for ``retry_s``: calls raise
``BackendResting`` at once, so a hung Redis costs one timeout per ``retry_s``, not one per call.
A pooled connection that Redis closed (it restarted) is reconnected and the command sent again,
once, within the same bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from cascade.tenants.limits import (
    WINDOW_S,
    BackendFailed,
    BackendResting,
    Check,
    LimitLevel,
    LimitVerdict,
    level,
)

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local window = tonumber(ARGV[1])
local start, wait = {}, 0
for i = 1, #KEYS do
  local per, cost, mode = tonumber(ARGV[i * 3 - 1]), tonumber(ARGV[i * 3]), ARGV[i * 3 + 1]
  local need = 1
  if mode == 'take' then need = cost end
  if need > per then need = per end
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  start[i] = tat
  local over = tat + need * window / per - now - window
  if mode ~= 'look' and over > 0.001 and over > wait then wait = over end
end
local out = {tostring(wait)}
for i = 1, #KEYS do
  local tat = start[i]
  if wait == 0 and ARGV[i * 3 + 1] == 'take' then
    tat = tat + tonumber(ARGV[i * 3]) * window / tonumber(ARGV[i * 3 - 1])
    redis.call('SET', KEYS[i], tostring(tat), 'PX', math.ceil(tat - now) + 1000)
  end
  out[i + 1] = tostring(tat - now)
end
return out
"""

_CHARGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local window = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  local per, cost = tonumber(ARGV[i * 2]), tonumber(ARGV[i * 2 + 1])
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  tat = tat + cost * window / per
  redis.call('SET', KEYS[i], tostring(tat), 'PX', math.ceil(tat - now) + 1000)
  out[i] = tostring(tat - now)
end
return out
"""


class RedisLimitStore:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        prefix: str,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=0,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.clock = clock
        self.prefix = prefix
        self._admit = self.client.register_script(_ADMIT)
        self._charge = self.client.register_script(_CHARGE)
        self._resting_until = float("-inf")

    async def _run(self, script: object, keys: list[str], args: list[object]) -> list[bytes]:
        if self.clock() < self._resting_until:
            raise BackendResting(f"redis: resting {self.retry_s:g} s after a failure")
        try:
            async with asyncio.timeout(self.timeout_s):
                return await script(keys=keys, args=args)  # type: ignore[operator]
        except (RedisError, OSError, TimeoutError) as exc:
            self._resting_until = self.clock() + self.retry_s
            raise BackendFailed(f"redis: {type(exc).__name__}: {exc}") from exc

    async def admit(self, checks: Sequence[Check]) -> LimitVerdict:
        args: list[object] = [WINDOW_S * 1000]
        for c in checks:
            args += [c.per_min, c.cost, c.mode]
        out = await self._run(self._admit, [self.prefix + c.key for c in checks], args)
        wait_ms, *tats = (float(x) for x in out)
        levels = [level(c.per_min, ms / 1000) for c, ms in zip(checks, tats, strict=True)]
        return LimitVerdict(wait_ms == 0, levels, retry_after_s=wait_ms / 1000)

    async def charge(self, checks: Sequence[Check]) -> list[LimitLevel]:
        args: list[object] = [WINDOW_S * 1000]
        for c in checks:
            args += [c.per_min, c.cost]
        out = await self._run(self._charge, [self.prefix + c.key for c in checks], args)
        return [level(c.per_min, float(ms) / 1000) for c, ms in zip(checks, out, strict=True)]

    async def aclose(self) -> None:
        await self.client.aclose()
