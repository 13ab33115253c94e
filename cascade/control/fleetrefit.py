"""The accuracy target, fleet-wide: one replica at a time refits on the fleet's labels, and
every replica adopts its thresholds (``[control] scope = "fleet"`` with the decision store in
PostgreSQL).

Every ``sync_s`` (``cascade.control.fleet`` drives ``step``) each replica takes or renews the
refit lease (``cascade.fleet.lease``; it lapses ``LEASE_INTERVALS`` refit intervals, and at
least ``LEASE_SYNCS`` syncs, after its holder's last renewal: a killed holder is replaced
within two intervals where ``refit_interval_s`` is at least two ``sync_s``). The holder, every
``refit_interval_s``, reads the store's judged answers (``evidence``, given by the gateway:
``cascade.store.judged.shared_evidence``, per cell the most recent labelled or shadow rows,
judged under its policy; in a thread, waited on at most ``READ_TIMEOUT_S``), fits them with a
fresh ``Refit`` (the rules of one replica's: tenant caps, a relabel replaces) and publishes the
thresholds with their evidence and its policy's hash as the ``refit`` gate
(``cascade.fleet.gates``). Every replica, the holder too, adopts the newest refit gate fitted
under its own policy's hash (``LiveControl.adopt_refit``); one fitted under another (a rolling
reload: other temperatures) is skipped, logged once. A failed step is counted
(``cascade_fleet_refit_errors_total{stage}``), the last gate kept, and ``status`` says since
when; a request never waits on any of it. A holder whose read of the store fails gives the lease
back and stands aside for one refit interval, so a replica that can reach the store fits
instead (where none can, the lease passes round and every gate stays as it was).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from cascade import metrics
from cascade.control.evidence import Labelled
from cascade.control.live import CELLS, LiveControl
from cascade.control.refit import Fitted, Refit
from cascade.fleet import client, gates
from cascade.fleet.client import server_time
from cascade.fleet.lease import Lease
from cascade.policy.fingerprint import policy_hash
from cascade.policy.model import Control, Policy

log = logging.getLogger("cascade.control")
KEY = "cascade:fleet:lease:refit"
LEASE_INTERVALS = 1.5  # the lease lapses this many refit intervals after its last renewal,
LEASE_SYNCS = 3  # and no sooner than this many syncs (its holder renews it every sync)
READ_TIMEOUT_S = 5.0  # the longest a step waits for the store's rows (statement_timeout too)
GATE_TTL_S = 600.0  # a refit gate outlives its holder at least this long (or 10 intervals)
CALLS = 4  # Redis round trips in one step, each bounded by timeout_s


Evidence = Callable[[Policy], list[Labelled]]  # the fleet's judged answers under a policy


def fit_shared(evidence: Evidence, policy: Policy) -> list[Fitted]:
    """A fresh refit of ``policy``'s cells on the fleet's judged answers (blocking: a
    thread's)."""
    control = policy.control
    assert control is not None
    refit = Refit(control)
    refit.observe(evidence(policy))
    return refit.fit()


def published(fitted: list[Fitted], replica: str, at: float, policy: str) -> gates.Published:
    return gates.Published(
        replica=replica,
        at=at,
        policy=policy,
        thresholds={_key(f): f.threshold for f in fitted},
        evidence={
            _key(f): {
                "n": f.n,
                "kept": f.kept,
                "bound": f.bound,
                "pooled": f.pooled,
                "sources": f.sources,
            }
            for f in fitted
        },
    )


def adopted(gate: gates.Published) -> list[Fitted]:
    """A refit gate's cells as fits (unknown cells left out)."""
    out = []
    for cell in CELLS:
        key = f"{cell[0]}:{cell[1]}"
        if key in gate.thresholds:
            ev = gate.evidence.get(key, {})
            out.append(
                Fitted(
                    cell,
                    gate.thresholds[key],
                    int(ev.get("n", 0)),
                    int(ev.get("kept", 0)),
                    float(ev.get("bound", 0.0)),
                    bool(ev.get("pooled", False)),
                    str(ev.get("sources", "")),
                )
            )
    return out


def _retrieved(task: asyncio.Task[list[Fitted]]) -> None:
    if not task.cancelled():
        task.exception()


def _key(fitted: Fitted) -> str:
    return f"{fitted.cell[0]}:{fitted.cell[1]}"


class FleetRefit:
    """The fleet's refit as one replica takes part in it (module docstring). ``evidence``: the
    shared decision store's judged answers (None: the store is not shared, each replica refits
    alone)."""

    def __init__(
        self,
        control: LiveControl,
        evidence: Evidence | None,
        replica: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control, self.evidence, self.replica = control, evidence, replica
        self.clock = clock
        control.shared_store = evidence is not None
        self.lease = Lease(KEY, f"{replica}:{uuid.uuid4().hex[:8]}")
        self.holder = False
        self.gate: gates.Published | None = None  # the refit gate adopted last
        self.errors = 0
        self.failing: str | None = None  # the stage that failed last, until a step succeeds
        self.down_since: float | None = None  # wall clock of the first failure of a run
        self._next_fit = -math.inf
        self._seen: tuple[float, str, str] | None = None  # (at, replica, our hash) handled
        self._hash: tuple[Policy, str] | None = None
        self._foreign = ""  # the other policy's hash last logged (logged once each)
        self._reading: tuple[asyncio.Task[list[Fitted]], str] | None = None
        self._aside_until = -math.inf  # clock: no lease taken before (the store's read failed)

    async def step(self, redis: Any, config: Control) -> bool:
        """Take part once (module docstring); False when a stage failed."""
        stage = "lease"
        try:
            held = False
            if self.clock() >= self._aside_until:
                async with asyncio.timeout(CALLS * config.timeout_s):
                    held = await self.lease.hold(
                        redis,
                        max(LEASE_INTERVALS * config.refit_interval_s, LEASE_SYNCS * config.sync_s),
                    )
            if held != self.holder:
                log.info("fleet refit: this replica %s the lease", "holds" if held else "lost")
                self._next_fit = -math.inf
            self.holder = held
            if held and self.clock() >= self._next_fit:
                stage = "read"
                fitted, fitted_under = await self._read()
                self._next_fit = self.clock() + config.refit_interval_s
                stage = "publish"
                async with asyncio.timeout(CALLS * config.timeout_s):
                    gate = published(fitted, self.replica, await server_time(redis), fitted_under)
                    await gates.publish(
                        redis, "refit", gate, max(GATE_TTL_S, 10 * config.refit_interval_s)
                    )
            stage = "adopt"
            async with asyncio.timeout(CALLS * config.timeout_s):
                found = await gates.read(redis, "refit")
        except Exception as exc:  # Redis's, PostgreSQL's, a timeout: the loop goes on
            self._failed(stage, exc)
            if stage == "read":
                await self._stand_aside(redis, config)
            return False
        if found is not None:
            self._adopt(found)
        self._succeeded()
        return True

    async def aclose(self, redis: Any, config: Control) -> None:
        """Give the lease back (a replica shutting down), bounded; a failure is ignored: the
        lease lapses anyway. A read still running is abandoned."""
        if self._reading is not None:
            self._reading[0].cancel()
        if self.holder:
            with contextlib.suppress(*client.errors()):
                async with asyncio.timeout(config.timeout_s):
                    await self.lease.release(redis)
            self.holder = False

    async def _stand_aside(self, redis: Any, config: Control) -> None:
        """Give the lease back (bounded; a failure is ignored: it lapses anyway) and take none
        for one refit interval."""
        self._aside_until = self.clock() + config.refit_interval_s
        with contextlib.suppress(*client.errors()):
            async with asyncio.timeout(config.timeout_s):
                await self.lease.release(redis)
        self.holder = False
        log.info(
            "fleet refit: the store's read failed; the lease given back for %g s",
            config.refit_interval_s,
        )

    async def _read(self) -> tuple[list[Fitted], str]:
        """The fit on the store's rows, under the policy served when the read began, and that
        policy's hash; a read still running from an earlier step is waited on again."""
        assert self.evidence is not None
        if self._reading is None or self._reading[0].done():
            policy = self.control.policy
            task = asyncio.create_task(asyncio.to_thread(fit_shared, self.evidence, policy))
            task.add_done_callback(_retrieved)  # a late read's failure is not logged again
            self._reading = (task, self._policy_hash(policy))
        task, under = self._reading
        async with asyncio.timeout(READ_TIMEOUT_S):
            return await asyncio.shield(task), under

    def _adopt(self, gate: gates.Published) -> None:
        mine = self._policy_hash(self.control.policy)
        seen = (gate.at, gate.replica, mine)
        if seen == self._seen:
            return
        self._seen = seen
        if gate.policy != mine:
            if gate.policy != self._foreign:
                self._foreign = gate.policy
                log.warning(
                    "fleet refit: the gate %s fitted is for another policy (%s, "
                    "this replica serves %s): not adopted",
                    gate.replica,
                    gate.policy[:12],
                    mine[:12],
                )
            return
        self.control.adopt_refit(adopted(gate), gate.replica)
        self.gate = gate

    def _policy_hash(self, policy: Policy) -> str:
        if self._hash is None or self._hash[0] is not policy:
            self._hash = (policy, policy_hash(policy))
        return self._hash[1]

    def _failed(self, stage: str, exc: BaseException) -> None:
        metrics.FLEET_REFIT_ERRORS.labels(stage=stage).inc()
        self.errors += 1
        if self.failing is None:
            self.down_since = time.time()
            log.warning(
                "fleet refit: %s failed (%s: %s); the last gate kept",
                stage,
                type(exc).__name__,
                " ".join(str(exc).split()) or "timeout",
            )
        self.failing = stage

    def _succeeded(self) -> None:
        if self.failing is not None:
            log.info("fleet refit: back (after the %s stage failed)", self.failing)
        self.failing, self.down_since = None, None

    def status(self) -> dict[str, Any] | str:
        """For ``/health`` and ``GET /admin/control``: who fitted the gate adopted and when
        (Redis's clock), whether this replica holds the lease, and failures."""
        if self.evidence is None:
            return "replica (no shared store)"
        if not self.control.refits_on_fleet():
            return "replica (no Redis URL)"
        gate = self.gate
        return {
            "scope": "fleet",
            "replica": gate.replica if gate else None,
            "at": gate.at if gate else None,
            "cells": len(gate.thresholds) if gate else 0,
            "lease": self.holder,
            "connected": self.failing is None,
            "failing": self.failing,
            "down_since": self.down_since,
            "errors": self.errors,
        }
