"""A canary rollout as the app runs it: started, joined or found finished from the policy's
``[rollout]`` at boot and on every reload (``plan``, then ``install`` at the reload's swap),
stepped, promoted, aborted by an admin (``POST /admin/rollout/...``), or by the guards
(``cascade.rollout.driver``: actor ``auto``), each decision one audit record and one
``cascade_rollout_decisions_total`` count.

The state lives in the ``Book`` (the decision store when one is configured), keyed by the pair of
policy hashes: a restarted replica whose policy names the same candidate joins a running
rollout (same ``started``), serves the candidate of a promoted one, and the current version of
one rolled back or aborted, with no split. Every decision is a conditional update of that state
(``Book.update`` refuses a finished rollout), so of two replicas deciding at once one wins and
the other applies its result at its next look (``follow``). A promotion swaps the candidate in
through the same all-or-nothing ``Gateway.prepare``/``swap`` a reload uses; everything here runs
under the reloader's lock, one change at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, NamedTuple

from cascade import metrics
from cascade.audit.log import AuditLog
from cascade.build import candidate_of
from cascade.errors import Conflict, RolloutRunning
from cascade.gateway import Gateway
from cascade.policy.fingerprint import policy_hash
from cascade.policy.model import Policy
from cascade.policy.serving import Serving
from cascade.rollout.book import Book
from cascade.rollout.canary import Canary
from cascade.rollout.driver import RolloutDriver
from cascade.rollout.state import RolloutFinished, RolloutState, RolloutStatus
from cascade.rollout.verdict import ArmCounts, Verdict
from cascade.settings import Settings

log = logging.getLogger("cascade")
NO_LOG = (
    "no decision log is configured: nothing counts the arms, so the guards give no verdict; "
    "only POST /admin/rollout/promote and /abort end the rollout, and a restart starts it again"
)


class RolloutPlan(NamedTuple):
    """What a policy's ``[rollout]`` asks for now: the version that ``serve``s, the ``canary``
    beside it (None: no split), the rollout this plan ``started`` (None: joined or none) and the
    finished rollout it found (``ended``)."""

    serve: Policy
    canary: Canary | None
    started: RolloutState | None = None
    ended: RolloutState | None = None


class Rollouts:
    """The rollouts of ``gateway``, kept in ``book`` (module docstring); ``lock``: the
    reloader's."""

    def __init__(
        self, settings: Settings, gateway: Gateway, audit: AuditLog, lock: asyncio.Lock
    ) -> None:
        self.settings, self.gateway, self.audit, self.lock = settings, gateway, audit, lock
        self.book = Book(audit.target, audit.replica)
        self.last: RolloutState | None = None  # the last state this replica saw
        self.verdict: Verdict | None = None
        self.counts: dict[str, ArmCounts] = {}
        self._told: set[int] = set()  # finished rollouts logged as found
        self.driver = RolloutDriver(
            self.book, gateway.split, audit.target, follow=self.follow, judged=self.judged
        )

    # ------------------------------------------------------------ boot and reload

    def plan(self, policy: Policy, actor: str) -> RolloutPlan:
        """What ``policy``'s ``[rollout]`` asks for (blocking: it reads the candidate and the
        state). ``ConfigRejected`` lines for a bad candidate, ``RestartNeeded`` for one that
        needs other engines, ``RolloutRunning`` for a change of a running canary's versions."""
        candidate = candidate_of(self.settings, policy)
        running, current = self.gateway.split.canary, policy_hash(policy)
        digest = None if candidate is None else policy_hash(candidate)
        if running is not None and (running.current_hash, running.serving.policy_hash) != (
            current,
            digest,
        ):
            raise RolloutRunning(
                [
                    f"{self.settings.policy or '<policy>'}: error: a rollout is running "
                    f"({running.current_hash[:12]} -> {running.serving.policy_hash[:12]}): "
                    "promote or abort it first (POST /admin/rollout/promote or /abort)"
                ]
            )
        if running is not None:
            return RolloutPlan(policy, running)
        if candidate is None or policy.rollout is None:
            return RolloutPlan(policy, None)
        assert digest is not None
        found = self.book.latest(current, digest)
        if found is not None and found.status != "running":
            return RolloutPlan(
                candidate if found.status == "promoted" else policy, None, ended=found
            )
        state = self.book.open(current, digest, policy.rollout.share, actor=actor, now=time.time())
        canary = self._canary(policy, Serving(candidate, self.gateway.engines), state)
        return RolloutPlan(policy, canary, started=None if found is not None else state)

    def install(self, plan: RolloutPlan, actor: str, client: str | None = None) -> None:
        """Apply ``plan``'s split (no await: at the reload's swap)."""
        self.gateway.split.run(plan.canary)
        if plan.started is not None:
            self.last = plan.started
            self._decided("rollout_start", "started", actor, client, plan.started)
        if plan.ended is not None and plan.ended.id not in self._told:
            self._told.add(plan.ended.id)
            self.last = plan.ended
            log.info(
                "rollout %s of %s was %s (%s): serving %s, no split",
                plan.ended.id,
                plan.ended.candidate_hash[:12],
                plan.ended.status.replace("_", " "),
                plan.ended.reason or "no reason given",
                policy_hash(plan.serve)[:12],
            )

    async def boot(self) -> None:
        """At start-up: the boot policy's ``[rollout]`` planned and applied; a bad candidate
        raises (the server does not start). Then the driver starts."""
        policy = self.gateway.policy
        if policy.rollout is not None:
            async with self.lock:
                plan = await asyncio.to_thread(self.plan, policy, "boot")
                if policy_hash(plan.serve) != self.gateway.serving.policy_hash:
                    prepared = await asyncio.to_thread(self.gateway.prepare, plan.serve)
                    self.gateway.swap(prepared)
                self.install(plan, "boot")
            if self.book.target is None:
                log.warning("rollout: %s", NO_LOG)
        self.driver.start()

    async def aclose(self) -> None:
        await self.driver.aclose()

    # ------------------------------------------------------------ decisions

    async def promote(self, actor: str, client: str | None = None, reason: str = "") -> None:
        """The next step's share, or 100 %: the candidate serves (``Conflict``: none runs, or
        another replica decided it first)."""
        async with self.lock:
            canary = self._running()
            share, before = canary.next_share(), _hashes(self.gateway, canary)
            if share is not None:
                state = await self._update(canary, share=share, actor=actor, reason=reason)
                stepped = dataclasses.replace(canary, share=share, step=canary.step + 1)
                self.gateway.split.run(stepped)
                self._decided("rollout_step", "stepped", actor, client, state, before)
                return
            prepared = await asyncio.to_thread(self.gateway.prepare, canary.serving.policy)
            state = await self._update(canary, status="promoted", actor=actor, reason=reason)
            self.gateway.swap(prepared)
            self.gateway.split.run(None)
            self._decided("rollout_promote", "promoted", actor, client, state, before)
            log.info("rollout %s promoted by %s: serving it", canary.id, actor or "-")

    async def abort(self, actor: str, client: str | None = None, reason: str = "") -> None:
        """Drop the candidate: the current version serves every request."""
        await self._end(None, "aborted", actor, client, reason)

    async def rollback(self, canary: Canary, reason: str) -> None:
        """The guards' rollback of ``canary`` (actor ``auto``), logged with why."""
        log.warning("rollout %s rolled back: %s", canary.id, reason)
        await self._end(canary, "rolled_back", "auto", None, reason)

    async def judged(self, canary: Canary, counts: dict[str, ArmCounts], verdict: Verdict) -> None:
        """A look's verdict: shown on ``GET /admin/rollout``; acted on when ``guards.auto``."""
        self.counts, self.verdict = counts, verdict
        if not canary.rollout.guards.auto or verdict.action == "wait":
            return
        try:
            if verdict.action == "rollback":
                await self.rollback(canary, "; ".join(verdict.reasons))
            elif self.gateway.split.canary is canary:
                await self.promote("auto", None, "; ".join(verdict.reasons))
        except Conflict as exc:  # decided meanwhile, here or by another replica
            log.info("rollout %s: the guards' %s came late (%s)", canary.id, verdict.action, exc)

    async def follow(self, canary: Canary, found: RolloutState | None) -> None:
        """Apply what another replica (or an admin on one) decided for ``canary``."""
        async with self.lock:
            if self.gateway.split.canary is not canary or found is None or found.id != canary.id:
                return
            self.last = found
            if found.status == "running":
                steps = [canary.rollout.share, *canary.rollout.steps]
                step = steps.index(found.share) if found.share in steps else canary.step
                self.gateway.split.run(dataclasses.replace(canary, share=found.share, step=step))
                return
            if found.status == "promoted":
                prepared = await asyncio.to_thread(self.gateway.prepare, canary.serving.policy)
                self.gateway.swap(prepared)
            self.gateway.split.run(None)
            log.info(
                "rollout %s was %s by %s on %s: applied here",
                found.id,
                found.status.replace("_", " "),
                found.actor or "-",
                found.replica or "-",
            )

    def status(self) -> dict[str, Any]:
        """``GET /admin/rollout``."""
        canary, last = self.gateway.split.canary, self.last
        found: dict[str, Any] = {
            "status": "running" if canary is not None else last.status if last else "none",
            "serving_hash": self.gateway.serving.policy_hash,
            "stored": self.book.target is not None,
            "note": None if self.book.target is not None else NO_LOG,
        }
        if last is not None:
            found |= {
                "id": last.id,
                "current_hash": last.current_hash,
                "candidate_hash": last.candidate_hash,
                "started": last.started,
                "decided": last.decided,
                "reason": last.reason,
                "actor": last.actor,
            }
        if canary is not None:
            rollout = canary.rollout
            found |= {
                "id": canary.id,
                "current_hash": canary.current_hash,
                "candidate_hash": canary.serving.policy_hash,
                "started": canary.started,
                "share": canary.share,
                "step": canary.step,
                "steps": [rollout.share, *rollout.steps, 1.0],
                "sticky": rollout.sticky,
                "auto": rollout.guards.auto,
            }
        found["counts"] = self.counts
        found["verdict"] = self.verdict
        return found

    # ------------------------------------------------------------ helpers

    def _canary(self, policy: Policy, candidate: Serving, state: RolloutState) -> Canary:
        assert policy.rollout is not None
        steps = [policy.rollout.share, *policy.rollout.steps]
        return Canary(
            rollout=policy.rollout,
            serving=candidate,
            current_hash=state.current_hash,
            share=state.share,
            started=state.started,
            id=state.id,
            step=steps.index(state.share) if state.share in steps else 0,
        )

    def _running(self) -> Canary:
        canary = self.gateway.split.canary
        if canary is None:
            raise Conflict("no rollout is running (a policy's [rollout] starts one on reload)")
        return canary

    async def _end(
        self,
        canary: Canary | None,
        status: RolloutStatus,
        actor: str,
        client: str | None,
        reason: str,
    ) -> None:
        async with self.lock:
            running = self._running()
            if canary is not None and running is not canary:
                raise Conflict("the rollout changed since it was judged")
            before = _hashes(self.gateway, running)
            state = await self._update(running, status=status, actor=actor, reason=reason)
            self.gateway.split.run(None)
            action = "rollout_rollback" if status == "rolled_back" else "rollout_abort"
            self._decided(action, status, actor, client, state, before)

    async def _update(self, canary: Canary, **changes: Any) -> RolloutState:
        """``Book.update`` of ``canary`` (``Conflict`` when it was decided elsewhere first: the
        driver applies that at its next look)."""
        try:
            state = await asyncio.to_thread(self.book.update, canary.id, now=time.time(), **changes)
        except RolloutFinished as exc:
            raise Conflict(f"the rollout was decided elsewhere first ({exc})") from exc
        self.last = state
        return state

    def _decided(
        self,
        action: str,
        outcome: str,
        actor: str,
        client: str | None,
        state: RolloutState,
        before: dict[str, str] | None = None,
    ) -> None:
        """One audit record and one ``cascade_rollout_decisions_total`` count."""
        metrics.ROLLOUT_DECISIONS.labels(outcome=outcome).inc()
        now = self.gateway.split.canary
        self.audit.record(
            action,
            actor,
            "applied",
            client=client,
            message=state.reason,
            before=before or {},
            after=_hashes(self.gateway, now),
            detail={
                "rollout": state.id,
                "candidate": state.candidate_hash,
                "share": None if now is None else now.share,
                "status": state.status,
            },
        )


def _hashes(gateway: Gateway, canary: Canary | None) -> dict[str, str]:
    """The serving policy's hash and, while a canary runs, the candidate's."""
    found = {"policy": gateway.serving.policy_hash}
    if canary is not None:
        found["candidate"] = canary.serving.policy_hash
    return found
