"""The fleet scope's driver: one background task per replica that syncs its live gate with the
fleet's Redis (``[control] scope = "fleet"``).

Every ``sync_s``, off the request path, a sync adds what this replica answered to the shared
counters and reads the fleet's window back (``cascade.fleet.counters``, handed to
``LiveControl.shared``); publishes this replica's budget cuts once it paces on history of its
own, or adopts the fleet's while it has none (``cascade.fleet.gates``); and adds the confidences
the drift monitor tallied to the fleet's histograms, its fleet PSI read back
(``cascade.fleet.histograms``, ``DriftMonitor.shared``). Every Redis call is
bounded by ``timeout_s``. A failed or slow sync is counted (``cascade_fleet_sync_errors_total``),
``cascade_fleet_connected`` drops to 0, ``/health`` and ``GET /admin/control`` say since when,
and the pacer paces on this replica's counts (its tally kept for the next sync) until a sync
succeeds again. A request never waits on any of it. With the decision store in PostgreSQL
(``evidence``) a second task takes part, every ``sync_s``, in the fleet's refit
(``cascade.control.fleetrefit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from cascade import metrics
from cascade.control.drift import DriftMonitor, cell_key
from cascade.control.fleetrefit import Evidence, FleetRefit
from cascade.control.live import CELLS, LiveControl
from cascade.control.pacer import HORIZON, MIN_RECENT
from cascade.fleet import client, counters, gates, histograms
from cascade.fleet.client import server_time
from cascade.policy.model import Control
from cascade.policy.stats import Cell

log = logging.getLogger("cascade.control")
CALLS = 6  # Redis round trips in one sync, each bounded by timeout_s


def replica_name() -> str:
    """This process among the fleet's: its host and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


class FleetLink:
    """Syncs ``control`` with the fleet's Redis while ``start``-ed (module docstring).
    ``evidence``: the judged answers of the shared decision store (PostgreSQL; None: not
    shared)."""

    def __init__(
        self,
        control: LiveControl,
        *,
        replica: str | None = None,
        evidence: Evidence | None = None,
        drift: DriftMonitor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control, self.drift, self.clock = control, drift, clock
        self.replica = replica or replica_name()
        self.refit = FleetRefit(control, evidence, self.replica, clock=clock)
        self._refitting: asyncio.Task[None] | None = None
        self._redis: Any = None
        self._url: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.connected: bool | None = None  # None: no sync tried yet
        self.last_ok = -math.inf  # clock of the last successful sync
        self.down_since: float | None = None  # wall clock of the first failure of a run
        self.failures = 0

    def _config(self) -> Control | None:
        control = self.control.policy.control
        return control if control is not None and control.scope == "fleet" else None

    async def start(self) -> None:
        """One sync now (bounded: the first request finds the fleet's gate), then every
        ``sync_s`` in the background."""
        await self.sync()
        self._task = asyncio.create_task(self._run(), name="cascade-fleet-sync")
        if self.refit.evidence is not None:
            self._refitting = asyncio.create_task(self._refit_run(), name="cascade-fleet-refit")

    async def aclose(self) -> None:
        for task in (self._task, self._refitting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        config = self._config()
        if self._redis is not None and config is not None:
            await self.refit.aclose(self._redis, config)
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def _run(self) -> None:
        while True:
            config = self._config()
            await asyncio.sleep(config.sync_s if config is not None else 1.0)
            await self.sync()

    async def _refit_run(self) -> None:
        while True:
            config = self._config()
            if config is not None and config.url is not None and self.control.refits_on_fleet():
                await self.refit.step(await self._client(config.url, config.timeout_s), config)
            await asyncio.sleep(config.sync_s if config is not None else 1.0)

    async def sync(self) -> bool:
        """One sync (module docstring); False when it failed or the scope is not the fleet."""
        config = self._config()
        if config is None or config.url is None:
            return False
        redis = await self._client(config.url, config.timeout_s)
        tally, failures = self.control.tally, client.errors()
        try:
            async with asyncio.timeout(CALLS * config.timeout_s):
                if tally is not None:
                    found = await counters.sync(
                        redis, tally, self.clock(), config.window_s * HORIZON, MIN_RECENT
                    )
                    self.control.shared(found)
                await self._trade_gates(redis, config)
                await self._share_drift(redis)
        except failures as exc:  # TimeoutError among them
            self._failed(exc)
            return False
        self._succeeded()
        return True

    async def _trade_gates(self, redis: Any, config: Control) -> None:
        mine = self.control.published()
        ttl_s = max(config.window_s, 10 * config.sync_s)
        if mine is not None:
            await gates.publish(
                redis,
                "budget",
                gates.Published(
                    replica=self.replica,
                    at=await server_time(redis),
                    thresholds={f"{t}:{b}": v for (t, b), v in mine.items()},
                ),
                ttl_s,
            )
        else:
            found = await gates.read(redis, "budget")
            if found is not None:
                self.control.adopt(cells(found.thresholds))

    async def _share_drift(self, redis: Any) -> None:
        """This replica's tallied confidences into the fleet's histograms; the fleet's PSI."""
        tally = self.drift.tally if self.drift is not None else None
        if self.drift is not None and tally is not None:
            self.drift.shared(await histograms.sync(redis, tally, self.drift.clock()))

    async def _client(self, url: str, timeout_s: float) -> Any:
        if self._redis is None or self._url != url:
            if self._redis is not None:
                await self._redis.aclose()
            self._redis, self._url = client.connect(url, timeout_s), url
        return self._redis

    def _failed(self, exc: BaseException) -> None:
        metrics.FLEET_SYNC_ERRORS.inc()
        metrics.FLEET_CONNECTED.set(0)
        self.failures += 1
        if self.connected is not False:
            self.down_since = time.time()
            log.warning(
                "fleet: redis sync failed (%s); pacing on this replica's counts, the "
                "last gate kept",
                type(exc).__name__ or "timeout",
            )
        self.connected = False

    def _succeeded(self) -> None:
        metrics.FLEET_CONNECTED.set(1)
        if self.connected is False:
            log.info("fleet: redis back; pacing on the fleet's counts again")
        self.connected, self.down_since, self.last_ok = True, None, self.clock()

    def status(self) -> dict[str, Any] | None:
        """For ``/health`` and ``GET /admin/control`` (None: not the fleet scope)."""
        if self._config() is None:
            return None
        age = self.clock() - self.last_ok
        return {
            "replica": self.replica,
            "connected": bool(self.connected),
            "last_sync_s_ago": round(age, 3) if math.isfinite(age) else None,
            "down_since": self.down_since,
            "failed_syncs": self.failures,
            "pacing": "fleet" if self.control.pacing_on_fleet() else "replica",
            "refit": self.refit.status(),
            "drift": self._drift_status(),
        }

    def _drift_status(self) -> dict[str, Any] | None:
        """The fleet's PSI per cell and its age (None: no snapshot, or none read lately)."""
        age = self.drift.fleet_age() if self.drift is not None else None
        if self.drift is None or age is None:
            return None
        return {
            "psi": {cell_key(c): round(v, 4) for c, v in self.drift.fleet_psi().items()},
            "age_s": round(age, 3),
        }


def cells(thresholds: dict[str, float]) -> dict[Cell, float]:
    """``type:band`` keys as cells (unknown ones left out)."""
    return {
        cell: thresholds[key] for cell in CELLS if (key := f"{cell[0]}:{cell[1]}") in thresholds
    }
