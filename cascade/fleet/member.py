"""This replica as a member of the fleet: its heartbeat (which also reads the fleet, for
``cascade_fleet_config_skew``), its listener for fleet reloads, and the calls ``/admin`` makes.

Nothing here is on a request's path: Redis slow or gone costs the heartbeat a timeout
(``TIMEOUT_S``) and a count (``cascade_fleet_errors_total``), and ``/admin/fleet`` a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from cascade import metrics
from cascade.fleet.broadcast import ask, listen
from cascade.fleet.registry import Registry, skew
from cascade.schema import FleetReloadReport, FleetView, ReplicaReload, ReplicaSeen
from cascade.settings import Settings

log = logging.getLogger("cascade")
TIMEOUT_S = 1.0  # one Redis call (connect included), off the request path


def fleet_url(settings: Settings, limits_url: str | None, cache_url: str | None) -> str | None:
    """The Redis the fleet meets on: ``CASCADE_FLEET_REDIS``, else the keys file's ``[limits]``
    Redis, else the policy's ``[cache]`` Redis (each None when not on Redis)."""
    return settings.fleet_redis or limits_url or cache_url


def _again() -> Retry:
    """A pooled connection Redis closed (it restarted) is reconnected and the command sent
    again, once."""
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def commands(url: str) -> aioredis.Redis:
    """The client for heartbeats and calls: each bounded by ``TIMEOUT_S``."""
    return aioredis.Redis.from_url(
        url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S, retry=_again()
    )


def subscriber(url: str) -> aioredis.Redis:
    """The listener's client: its connection idles between calls (no read timeout, kept
    alive)."""
    return aioredis.Redis.from_url(
        url,
        socket_connect_timeout=TIMEOUT_S,
        socket_keepalive=True,
        health_check_interval=30,
        retry=_again(),
    )


class Member:
    """Joins the fleet at ``start``, leaves at ``aclose`` (its heartbeat key is deleted).
    ``me()``: this replica's heartbeat now; ``reload()``: its reload, as a fleet answer."""

    def __init__(
        self,
        url: str,
        settings: Settings,
        me: Callable[[], ReplicaSeen],
        reload: Callable[[], Awaitable[ReplicaReload]],
    ) -> None:
        self.client, self.subscriber = commands(url), subscriber(url)
        self.registry = Registry(self.client, settings.fleet_seen_s)
        self.heartbeat_s, self.reply_s = settings.fleet_heartbeat_s, settings.fleet_reply_s
        self.me, self.reload = me, reload
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._beat()),
            asyncio.create_task(listen(self.subscriber, self.reload, self.heartbeat_s)),
        ]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(RedisError, OSError):
            await self.registry.leave(self.me().replica)
        await self.client.aclose()
        await self.subscriber.aclose()

    async def view(self) -> FleetView:
        """The replicas seen and the skew; raises ``RedisError``."""
        return skew(await self.registry.seen())

    async def reload_fleet(self) -> FleetReloadReport:
        """Every replica's reload outcome (``cascade.fleet.broadcast.ask``); raises
        ``RedisError``."""

        async def names() -> list[str]:
            return [seen.replica for seen in await self.registry.seen()]

        return await ask(self.client, self.me().replica, self.reply_s, names)

    async def _beat(self) -> None:
        while True:
            try:
                await self.registry.beat(self.me())
                view = await self.view()
                metrics.FLEET_REPLICAS.set(len(view.replicas))
                metrics.FLEET_CONFIG_SKEW.set(view.skew)
            except (RedisError, OSError) as exc:
                metrics.FLEET_ERRORS.inc()
                log.warning("fleet heartbeat failed (%s); next in %g s", exc, self.heartbeat_s)
            await asyncio.sleep(self.heartbeat_s)
