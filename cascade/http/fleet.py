"""The app's side of ``cascade.fleet``: a lifespan that watches the files (``CASCADE_WATCH_S``)
and joins the fleet (``CASCADE_FLEET_REDIS``, or the ``[limits]``/``[cache]`` Redis), and the
admin calls ``GET /admin/fleet`` and ``POST /admin/reload?scope=fleet``.

Every reload, whatever started it, goes through the app's one ``Reloader`` (one at a time, all
or nothing), so a file change, a broadcast and a SIGHUP arriving together run one or two reloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from litestar import Litestar, Response, get
from redis.exceptions import RedisError

from cascade import __version__
from cascade.errors import ConfigRejected, Conflict, EngineUnavailable, RestartNeeded
from cascade.fleet.member import Member, fleet_url
from cascade.fleet.watch import Watcher
from cascade.http.reload import Reloader
from cascade.http.services import Services, services_of
from cascade.schema import FleetReloadReport, ReplicaReload, ReplicaSeen, encoder
from cascade.store import replica_name

log = logging.getLogger("cascade")
JSON = "application/json"
FLEET_OFF = (
    "the fleet is off: set CASCADE_FLEET_REDIS (or put [limits] or [cache] on Redis) "
    "on every replica"
)


async def outcome(reloader: Reloader, replica: str, actor: str) -> ReplicaReload:
    """``reloader``'s reload as one replica's answer to a fleet reload (``actor``: who asked,
    in the audit record: ``fleet`` or ``watch``)."""
    try:
        report = await reloader.reload(actor)
        return ReplicaReload(
            replica=replica,
            outcome=report.outcome,
            policy_hash=report.policy_hash,
            calibration_hash=report.calibration_hash,
        )
    except ConfigRejected as exc:
        serving = reloader.gateway.serving
        return ReplicaReload(
            replica=replica,
            errors=exc.lines,
            outcome="restart_needed" if isinstance(exc, RestartNeeded) else "rejected",
            policy_hash=serving.policy_hash,
            calibration_hash=serving.calibration_hash,
        )


def _watched(reloader: Reloader) -> list[str]:
    settings = reloader.settings
    named = (
        settings.policy,
        reloader.gateway.policy.calibration.file,
        settings.calibration,
        settings.api_keys_file,
        settings.admin_keys_file,
    )
    return sorted({path for path in named if path})


def _me(services: Services, replica: str, started: float) -> ReplicaSeen:
    policy_hash, calibration_hash = services.view.hashes()
    return ReplicaSeen(
        replica=replica,
        policy_hash=policy_hash,
        calibration_hash=calibration_hash,
        version=__version__,
        uptime_s=round(time.monotonic() - started, 3),
        strong_share=services.control.status()["strong_share"],
    )


@contextlib.asynccontextmanager
async def fleet_lifespan(app: Litestar) -> AsyncIterator[None]:
    """Starts the watcher and the fleet membership the settings ask for; stops them."""
    services = services_of(app)
    settings, reloader = services.settings, services.reloader
    loop, started, replica = asyncio.get_running_loop(), time.monotonic(), replica_name()
    reloads: set[asyncio.Task[None]] = set()

    async def reload() -> None:
        try:
            await outcome(reloader, replica, "watch")  # a refusal: logged, counted, audited
        except Exception:
            log.exception("the reload of the watched files failed; the running version serves")

    def reload_soon() -> None:  # on the watcher's thread
        def run() -> None:
            task = loop.create_task(reload())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.call_soon_threadsafe(run)

    watcher = None
    if settings.watch_s > 0:
        watcher = Watcher(lambda: _watched(reloader), reload_soon, settings.watch_s)
        watcher.start()
    tenants, cache = services.access.tenants.backend, services.view.policy.cache
    url = fleet_url(
        settings,
        tenants.url if tenants.backend == "redis" else None,
        cache.url if cache.backend == "redis" else None,
    )
    member = None
    if url is not None:
        member = Member(
            url,
            settings,
            lambda: _me(services, replica, started),
            lambda: outcome(reloader, replica, "fleet"),
        )
        await member.start()
    services.fleet = member
    try:
        yield
    finally:
        if watcher is not None:
            await asyncio.to_thread(watcher.stop)
        if member is not None:
            await member.aclose()
        for task in list(reloads):
            task.cancel()


def _member(services: Services) -> Member:
    member = services.fleet
    if member is None:
        raise Conflict(FLEET_OFF)
    return member


def _redis_down(exc: Exception) -> EngineUnavailable:
    return EngineUnavailable(f"the fleet's Redis did not answer ({exc})", retry_after=1.0)


async def reload_fleet(services: Services) -> FleetReloadReport:
    """``POST /admin/reload?scope=fleet``: 409 with the fleet off, 503 with its Redis down."""
    try:
        return await _member(services).reload_fleet()
    except (RedisError, OSError) as exc:
        raise _redis_down(exc) from exc


@get("/fleet")
async def fleet(services: Services) -> Response[bytes]:
    """The replicas seen in the last ``CASCADE_FLEET_SEEN_S``: hashes, version, uptime, strong
    share; the majority's hashes and the skew (``cascade.fleet.registry``)."""
    try:
        view = await _member(services).view()
    except (RedisError, OSError) as exc:
        raise _redis_down(exc) from exc
    return Response(content=encoder.encode(view), status_code=200, media_type=JSON)
