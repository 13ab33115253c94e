"""Drives one request through the cascade: the only code that awaits engines.

``cascade.policy.flow.decide`` decides; this module answers what it asks (previews off the
event loop, tier calls under budgets and breakers), records metrics and the decision log,
starts shadow calls (``cascade.shadowing.mirror``), and shapes the decision (``cascade.answers``).
``cascade.control`` gives each request its gate and learns from each decision and shadow
answer. Health, readiness and model cards
are ``cascade.http.status``'s; the gauges ``cascade.http.gauges``'s.

Every request gets a ``Budget``: a deadline ``admission_deadline_s`` from its start and a flow id
of its own (a batch's states share one). Engines with queues refuse a call at once when the
measured work ahead would keep it waiting past the deadline (an in-process tier's own
``timeout_s`` caps that wait further); what they accept runs to the end. Remote tiers get
``timeout_s`` as a whole-call limit. Breakers count what says a tier is broken: errors, timeouts
of remote tiers, unavailability. Client errors, overload and cancellations only free a half-open
probe slot. Shadow calls never touch a breaker. What is served is one ``Serving``
(``cascade.policy.serving``): a request runs on the one it started on; ``reconfigure`` swaps it.
While a canary runs, ``split`` (``cascade.rollout.canary``) gives a share of the requests the
candidate's ``Serving`` and gate instead.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from cascade import answers, metrics
from cascade.answers import Outcome, Profile
from cascade.cache.decision import CacheControl, DecisionCache, Lookup
from cascade.calls import Budget, EngineAnswer, EngineCall
from cascade.control.drift import DriftMonitor
from cascade.control.fleet import FleetLink
from cascade.control.live import LiveControl
from cascade.engines.base import Engine
from cascade.errors import (
    CascadeError,
)
from cascade.policy.costs import kind_of
from cascade.policy.fingerprint import policy_hash
from cascade.policy.flow import (
    Ask,
    Decision,
    Failure,
    Flow,
    Preview,
    Reply,
    decide,
    subcall,
)
from cascade.policy.model import Policy
from cascade.policy.quota import StrongQuota
from cascade.policy.routing import Gate
from cascade.policy.serving import Reconfigurable, Serving
from cascade.policy.stamp import Stamp
from cascade.questions import n_options, option_band
from cascade.rollout.canary import CanarySplit, Chosen
from cascade.settings import ADMISSION_DEADLINE_S
from cascade.shadowing.mirror import ShadowMirror
from cascade.store.base import DecisionStore
from cascade.store.judged import shared_evidence
from cascade.store.postgres import PostgresStore
from cascade.tenants import spend
from cascade.tenants.usage import UsageBook
from cascade.tiercall import call_tier
from cascade.tracing import active as tracing
from cascade.tracing import attributes
from cascade.tracing.calls import traced

log = logging.getLogger("cascade")


class Gateway(Reconfigurable):
    """Owns the engines of one policy, reconfigurable (``Reconfigurable``); ``systemone`` answers
    one validated call (``decide``, per-question refusals too). ``decisions``: the log."""

    def __init__(
        self,
        policy: Policy,
        engines: Mapping[str, Engine],
        *,
        profile: Profile = "laya",
        demo: bool = False,
        clock: Callable[[], float] = time.monotonic,
        admission_deadline_s: float = ADMISSION_DEADLINE_S,
        decisions: DecisionStore | None = None,
        cache: DecisionCache | None = None,
        weights: Mapping[str, str] | None = None,
    ):
        super().__init__(policy, engines, clock=clock)  # budgets use time.monotonic, as engines
        self.profile = profile
        self.demo = demo
        self.admission_deadline_s = admission_deadline_s
        self.decisions, self.cache = decisions, cache  # the decision log; the decision cache
        self.weights = dict(weights or {})  # {tier: weights' content hash}, fixed per process
        self._own_hashes: dict[int, tuple[Policy, str]] = {}  # tenants' policies' hashes
        self.started = False
        self._flows = itertools.count(1)
        self._shadow_salt = secrets.token_hex(8)  # sampling keys no client can steer
        self.control = LiveControl(policy, engines, clock=clock, deadline_s=admission_deadline_s)
        self.drift = DriftMonitor(policy, clock=clock)  # PSI of the cheap tier's confidences
        self.split = CanarySplit(
            lambda escalate: self.control.gate(escalate=escalate)
        )  # a canary's
        shared = (
            functools.partial(shared_evidence, decisions.url)  # the fleet refit's labels
            if isinstance(decisions, PostgresStore)
            else None
        )
        # [control] scope = "fleet": the gate, its refit and drift histograms synced with others
        self.fleet = FleetLink(self.control, evidence=shared, drift=self.drift)
        self.usage = UsageBook()  # each tenant's figures by UTC day (GET /v1/usage)
        self.shadows = ShadowMirror(
            lambda serving, tier, call: self._call(serving, tier, call, {}, record=False),
            self.breakers,
            clock,
            self.control,
        )
        self.reconfigured.append(lambda serving: self.control.prepare(serving.policy))
        if cache is not None:  # its identity of the next version's weights, hashed before it serves
            self.reconfigured.append(cache.prepare)

    async def start(self) -> None:
        """Start every engine; if one fails, close them all (none is left half-running)."""
        results = await asyncio.gather(
            *(engine.start() for engine in self.engines.values()), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(
                *(e.aclose() for e in self.engines.values()), return_exceptions=True
            )
            raise failed[0]
        await self.fleet.start()
        self.started = True

    async def aclose(self) -> None:
        self.started = False
        await self.fleet.aclose()
        await self.shadows.aclose()
        closing = [engine.aclose() for engine in self.engines.values()]
        await asyncio.gather(*closing, *([self.cache.aclose()] if self.cache else []))

    # ------------------------------------------------------------ one request

    def budget(self) -> Budget:
        """A new request's budget: its admission deadline and a flow of its own."""
        return Budget(deadline=time.monotonic() + self.admission_deadline_s, flow=next(self._flows))

    async def batch(self, calls: list[EngineCall], **kw: Any) -> list[Outcome]:
        """Laya's batch: every state under one budget (one flow, so the tiers share their
        capacity fairly between this batch and other requests), with ``decide``'s keywords
        ``kw``. The first failure cancels the sibling states and is raised."""
        budget, chosen = self.budget(), self._pick(calls[0], kw)  # one version for every state
        try:
            async with asyncio.TaskGroup() as tg:
                jobs = [
                    tg.create_task(self.decide(c, budget=budget, chosen=chosen, **kw))
                    for c in calls
                ]
        except BaseExceptionGroup as failed:  # report a cascade error when there is one
            first: BaseException = failed.subgroup(CascadeError) or failed
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]  # the first leaf, depth first
            raise first from None
        return [job.result() for job in jobs]

    async def systemone(self, call: EngineCall, **kw: Any) -> Outcome:
        """System One's answer: every question, or the request fails (``decide``'s ``kw``)."""
        return await self.decide(call, **kw)

    async def decide(self, call: EngineCall, *, chosen: Chosen | None = None, **kw: Any) -> Outcome:
        """One request, or one state of a batch (``_decide``'s keywords), on the version the
        split chooses (``chosen``: a batch's, for every state)."""
        chosen = chosen or self._pick(call, kw)
        with tracing.span("cascade.decide"), self.split.meter(chosen) as done:
            outcome = await self._decide(call, chosen=chosen, **kw)
            done(outcome.label, outcome.tiers)
        return outcome

    def _pick(self, call: EngineCall, kw: Mapping[str, Any]) -> Chosen:
        own = kw.get("policy") is not None  # a tenant's own policy: the current version
        return self.split.pick(self.serving, kw.get("tenant", ""), call.request_id, own=own)

    async def _decide(
        self,
        call: EngineCall,
        *,
        budget: Budget | None = None,
        partial: bool = False,
        tenant: str = "",
        policy: Policy | None = None,
        escalate: bool = True,
        cache: CacheControl = "use",
        chosen: Chosen,
        quota: StrongQuota | None = None,
    ) -> Outcome:
        """``partial``: the questions nothing can answer now are ``Outcome.refused`` (left out of
        the response) while the others are answered; the request fails only when all are.
        ``escalate=False``: no cheap answer escalates on confidence (flagged ``budget``).
        ``quota``: the tenant's strong answers left (``cascade.policy.quota``; a batch's states
        share one). ``tenant``: whose request (its cache namespace, spend, log rows);
        ``policy``: its own. ``chosen``: the version that decides it (``cascade.rollout``);
        only the current one uses the decision cache, shadows and feeds the live control."""
        serving = chosen.serving  # this request's version, read once, to its end
        call = msgspec.structs.replace(call, budget=budget or self.budget())
        timings: dict[str, float] = {}
        started = time.perf_counter()
        key = f"{self._shadow_salt}:{call.budget.flow if call.budget else 0}"
        lookup = (
            None
            if self.cache is None or not chosen.live
            else self.cache.lookup(self, serving, tenant=tenant, control=cache)
        )
        # a tenant's own policy gates with its thresholds; the served one with the live gate
        gate = chosen.gate(escalate) if policy is None else Gate.of(policy, escalate=escalate)
        stamp = Stamp(
            policy_hash=serving.policy_hash,
            calibration_hash=serving.calibration_hash,
            weights=self.weights,
            tenant=tenant,
            tenant_policy_hash=None if policy is None else self._own_hash(policy),
            trace_id=tracing.trace_id(),
        )
        tracing.annotate(lambda: attributes.started(call, stamp))
        own = policy is not None  # a tenant's own policy: its calibration's set is not loaded
        policy = policy or serving.policy
        flow = decide(
            policy,
            call,
            previews=serving.previewer is not None,
            shadow_key=key,
            partial=partial,
            gate=gate,
            quota=quota,
            stamp=stamp,
            reference=None if own else serving.reference,
        )
        decision, merging = await self._drive(flow, serving, timings, started, lookup)
        call = subcall(call, decision.routes) if decision.refused else call  # the answered
        self._count(call, decision, serving.policy, live=chosen.live)
        charged = spend.record(tenant, policy, decision, self.usage)
        response = answers.response(call, decision, timings, profile=self.profile, demo=self.demo)
        metrics.HOP_DURATION.labels(hop="merge").observe(time.perf_counter() - merging)
        if self.decisions is not None:
            with tracing.span("cascade.decision_log"):
                await self.decisions.record(call, decision, time.perf_counter() - started)
        if decision.shadow is not None and chosen.live:
            self.shadows.mirror(serving, decision.shadow, decision.stamp, self.decisions)
        tiers = decision.tiers
        label = "degraded" if decision.degraded or decision.refused else "ok"
        tracing.annotate(lambda: attributes.decided(call, decision, label))
        costs = {tier: tally.cost for tier, tally in charged.items() if tally.requests}
        return Outcome(
            response=response,
            headers=answers.headers(
                Counter(tiers.values()), demo=self.demo, timings=timings, costs=costs
            )
            | (lookup.header if lookup else {})
            | {"x-cascade-policy": serving.policy_hash},
            label=label,
            tiers=tiers,
            refused=decision.refused,
            cached_tokens=decision.usage.cached_tokens,
            timings=timings,
            costs=costs,
        )

    async def _drive(
        self,
        flow: Flow[Decision],
        serving: Serving,
        timings: dict[str, float],
        started: float,
        lookup: Lookup | None = None,
    ) -> tuple[Decision, float]:
        """Answer every ask of ``flow``; its decision, and when the last answer went in."""
        sent = started
        try:
            ask = next(flow)
            while True:
                reply = await self._answer(ask, serving, timings, started, lookup)
                sent = time.perf_counter()
                ask = flow.send(reply)
        except StopIteration as done:
            decision: Decision = done.value
            return decision, sent

    async def _answer(
        self,
        ask: Ask,
        serving: Serving,
        timings: dict[str, float],
        started: float,
        lookup: Lookup | None = None,
    ) -> Reply:
        if isinstance(ask, Preview):
            assert serving.previewer is not None  # the flow previews only when told it can
            # Tokenizing a long state takes milliseconds: keep it off the event loop.
            return await asyncio.to_thread(
                serving.previewer.preview, ask.call, checkpoint=ask.checkpoint
            )
        if "pre_route" not in timings:  # the first tier call: routing before it is done
            timings["pre_route"] = time.perf_counter() - started
            metrics.HOP_DURATION.labels(hop="pre_route").observe(timings["pre_route"])
        answering = (
            self._call(serving, ask.tier, ask.call, timings)
            if lookup is None
            else lookup.call(ask.tier, ask.call, timings)
        )  # in a span when traced
        slot = "cheap" if ask.tier == serving.policy.route.cheap else "strong"
        try:
            return await traced(
                ask.tier, slot, kind_of(serving.policy.tiers[ask.tier]), ask.call, answering
            )
        except CascadeError as exc:
            return Failure(exc)

    def _count(self, call: EngineCall, decision: Decision, served: Policy, *, live: bool) -> None:
        """The per-question metrics of a decided request and, when the current version decided
        it (``live``), the live control's and the drift monitor's counts (under ``served``, the
        version the request ran on: a tenant's own policy never resets it)."""
        if live:
            self.drift.observe(served, decision)
            self.control.decided(call, decision)
        for qid, route in decision.routes.items():
            qtype, why = call.questions[qid].type, decision.degraded.get(qid)
            if why is not None:
                metrics.DEGRADED.labels(reason=why, type=qtype).inc()
            elif route.reason not in (None, "budget"):  # budget: kept cheap (control counts)
                metrics.ESCALATIONS.labels(reason=route.reason, type=qtype).inc()
            metrics.QUESTIONS.labels(tier=route.tier, type=qtype).inc()
            if decision.novelty.get(qid, 0.0) > 1:
                metrics.NOVELTY_FLAGS.labels(
                    type=qtype, band=option_band(n_options(call.questions[qid]))
                ).inc()
            metrics.CONFIDENCE.labels(tier=route.tier, type=qtype).observe(
                max(decision.results[qid].probabilities)
            )

    async def _call(
        self,
        serving: Serving,
        tier: str,
        call: EngineCall,
        timings: dict[str, float],
        *,
        record: bool = True,
    ) -> EngineAnswer:
        """One call of ``serving``'s ``tier`` under its timeout and breaker (``call_tier``)."""
        return await call_tier(
            tier,
            self.engines[tier],
            serving.policy.tiers[tier],
            self.breakers[tier],
            call,
            timings,
            clock=self.clock,
            record=record,
        )

    def _own_hash(self, policy: Policy) -> str:
        """A tenant's own policy's hash, computed once per policy object."""
        known = self._own_hashes.get(id(policy))
        if known is None or known[0] is not policy:
            known = self._own_hashes[id(policy)] = (policy, policy_hash(policy))
        return known[1]

    # ---------------- what the front door reads (cascade.http.view.GatewayView; tiers: the base)

    def decision_log_health(self) -> dict[str, Any] | None:
        return None if self.decisions is None else self.decisions.health()

    def fleet_status(self) -> dict[str, Any] | None:
        return self.fleet.status()

    def psi(self) -> dict[tuple[str, str], float]:
        return {(qtype, band): v for (qtype, band), v in self.drift.psi().items()}

    def fleet_psi(self) -> dict[tuple[str, str], float]:
        return {(qtype, band): v for (qtype, band), v in self.drift.fleet_psi().items()}

    def gate_thresholds(self) -> dict[tuple[str, str], float]:
        return dict(self.control.thresholds())

    def strong_share(self) -> float:
        return self.control.strong_share

    def cache_size(self) -> tuple[int, int]:
        return self.cache.size() if self.cache is not None else (0, 0)
