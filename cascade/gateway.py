"""Drives one request through the cascade: the only code that awaits engines.

``cascade.policy.flow.decide`` decides; this module answers what it asks (previews off the
event loop, tier calls under budgets and breakers), records metrics, the decision log and
shadow calls, and shapes the decision (``cascade.answers``). Health, readiness and model cards
are ``cascade.http.status``'s; the gauges ``cascade.http.gauges``'s.

Every request gets a ``Budget``: a deadline ``admission_deadline_s`` from its start and a flow id
of its own (a batch's states share one). Engines with queues refuse a call at once when the
measured work ahead would keep it waiting past the deadline (an in-process tier's own
``timeout_s`` caps that wait further); what they accept runs to the end. Remote tiers get
``timeout_s`` as a whole-call limit. Breakers count what says a tier is broken: errors, timeouts
of remote tiers, unavailability. Client errors, overload and cancellations only free a half-open
probe slot. Shadow calls never touch a breaker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

from cascade import answers, metrics
from cascade.answers import Profile
from cascade.calls import Budget, EngineAnswer, EngineCall, capped
from cascade.engines.base import Engine, Previewing
from cascade.errors import (
    BreakerOpen,
    CascadeError,
    ClientError,
    EngineError,
    EngineFailed,
    EngineTimeout,
    Overloaded,
)
from cascade.policy.breaker import CircuitBreaker
from cascade.policy.flow import (
    Ask,
    Decision,
    Failure,
    Flow,
    Preview,
    Reply,
    ShadowCall,
    decide,
    subcall,
)
from cascade.policy.model import Policy, UpstreamTier
from cascade.policy.routing import QuestionRoute
from cascade.policy.shadow import compare
from cascade.schema import SystemOneResponse
from cascade.settings import ADMISSION_DEADLINE_S
from cascade.tenants import spend

log = logging.getLogger("cascade")


class Outcome(msgspec.Struct, kw_only=True):
    response: SystemOneResponse
    headers: dict[str, str]
    label: str  # "ok" or "degraded", the requests_total outcome
    tiers: dict[str, str]  # question id -> the tier whose answer was returned
    # question id -> why it is not answered (``decide(partial=True)`` only; not in ``response``)
    refused: dict[str, CascadeError] = msgspec.field(default_factory=dict)


class DecisionSink(Protocol):
    """Where answered requests are logged (``cascade.eval.decision_log.DecisionLog``).
    ``record`` is awaited before the response goes out (it may wait briefly for the rows to be
    durable); ``shadowed`` returns at once. Neither blocks the event loop."""

    async def record(self, call: EngineCall, routes: Mapping[str, QuestionRoute],
                     answers: Mapping[str, EngineAnswer], degraded: Mapping[str, str],
                     checkpoint: str | None, latency_s: float) -> None: ...

    def shadowed(self, call: EngineCall, strong: EngineAnswer) -> None: ...

    def health(self) -> dict[str, Any]: ...


class Gateway:
    """Owns the engines of one policy; ``systemone`` answers one validated call (``decide``,
    per-question refusals too). ``decisions``: where answered requests are logged."""

    def __init__(self, policy: Policy, engines: Mapping[str, Engine], *, profile: Profile = "laya",
                 demo: bool = False, clock: Callable[[], float] = time.monotonic,
                 admission_deadline_s: float = ADMISSION_DEADLINE_S,
                 decisions: DecisionSink | None = None):
        self.policy = policy
        self.engines = dict(engines)
        self.profile = profile
        self.demo = demo
        self.clock = clock  # the breakers' clock; budgets use time.monotonic, as engines do
        self.admission_deadline_s = admission_deadline_s
        self.decisions = decisions
        self.started = False
        self._flows = itertools.count(1)
        self._shadow_salt = secrets.token_hex(8)  # sampling keys no client can steer
        self.breakers = {name: CircuitBreaker(policy.breaker_for(name)) for name in self.engines}
        # The cheap engine when it can preview rows (Laya): exact token counts for pre-routing.
        cheap = self.engines.get(policy.route.cheap or "")
        self._previewer = cheap if isinstance(cheap, Previewing) else None
        self._shadow_tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Start every engine; if one fails, close them all (none is left half-running)."""
        results = await asyncio.gather(
            *(engine.start() for engine in self.engines.values()), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(*(e.aclose() for e in self.engines.values()),
                                 return_exceptions=True)
            raise failed[0]
        self.started = True

    async def aclose(self) -> None:
        self.started = False
        for task in list(self._shadow_tasks):
            task.cancel()
        await asyncio.gather(*self._shadow_tasks, return_exceptions=True)
        await asyncio.gather(*(engine.aclose() for engine in self.engines.values()))

    # ------------------------------------------------------------ one request

    def budget(self) -> Budget:
        """A new request's budget: its admission deadline and a flow of its own."""
        return Budget(deadline=time.monotonic() + self.admission_deadline_s,
                      flow=next(self._flows))

    async def batch(self, calls: list[EngineCall], **kw: Any) -> list[Outcome]:
        """Laya's batch: every state under one budget (one flow, so the tiers share their
        capacity fairly between this batch and other requests), with ``decide``'s keywords
        ``kw``. The first failure cancels the sibling states and is raised."""
        budget = self.budget()
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self.systemone(c, budget=budget, **kw)) for c in calls]
        except BaseExceptionGroup as failed:  # report a cascade error when there is one
            first: BaseException = failed.subgroup(CascadeError) or failed
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]  # the first leaf, depth first
            raise first from None
        return [task.result() for task in tasks]

    async def systemone(self, call: EngineCall, **kw: Any) -> Outcome:
        """System One's answer: every question, or the request fails (``decide``'s ``kw``)."""
        return await self.decide(call, **kw)

    async def decide(self, call: EngineCall, *, budget: Budget | None = None, partial: bool = False,
                     policy: Policy | None = None, tenant: str = "") -> Outcome:  # a tenant's
        """``partial``: the questions nothing can answer now are ``Outcome.refused`` (left out of
        the response) while the others are answered; the request fails only when all are."""
        call = msgspec.structs.replace(call, budget=budget or self.budget())
        timings: dict[str, float] = {}
        started = time.perf_counter()
        key = f"{self._shadow_salt}:{call.budget.flow if call.budget else 0}"
        flow = decide(policy or self.policy, call, previews=self._previewer is not None,
                      shadow_key=key, partial=partial)
        decision, merging = await self._drive(flow, timings, started)
        call = subcall(call, decision.routes) if decision.refused else call  # the answered
        self._count(call, decision)
        spend.record(tenant, policy or self.policy, decision)
        response = answers.response(call, decision, timings, profile=self.profile,
                                    demo=self.demo)
        metrics.HOP_DURATION.labels(hop="merge").observe(time.perf_counter() - merging)
        if self.decisions is not None:
            await self.decisions.record(call, decision.routes, decision.answers,
                                        decision.degraded, decision.pre.cheap_checkpoint,
                                        time.perf_counter() - started)
        if decision.shadow is not None:
            self._shadow(decision.shadow)
        tiers = decision.tiers
        return Outcome(response=response,
                       headers=answers.headers(Counter(tiers.values()), demo=self.demo),
                       label="degraded" if decision.degraded or decision.refused else "ok",
                       tiers=tiers, refused=decision.refused)

    async def _drive(self, flow: Flow[Decision], timings: dict[str, float],
                     started: float) -> tuple[Decision, float]:
        """Answer every ask of ``flow``; its decision, and when the last answer went in."""
        sent = started
        try:
            ask = next(flow)
            while True:
                reply = await self._answer(ask, timings, started)
                sent = time.perf_counter()
                ask = flow.send(reply)
        except StopIteration as done:
            decision: Decision = done.value
            return decision, sent

    async def _answer(self, ask: Ask, timings: dict[str, float], started: float) -> Reply:
        if isinstance(ask, Preview):
            assert self._previewer is not None  # the flow previews only when told it can
            # Tokenizing a long state takes milliseconds: keep it off the event loop.
            return await asyncio.to_thread(self._previewer.preview, ask.call,
                                           checkpoint=ask.checkpoint)
        if "pre_route" not in timings:  # the first tier call: routing before it is done
            timings["pre_route"] = time.perf_counter() - started
            metrics.HOP_DURATION.labels(hop="pre_route").observe(timings["pre_route"])
        try:
            return await self._call(ask.tier, ask.call, timings)
        except CascadeError as exc:
            return Failure(exc)

    def _count(self, call: EngineCall, decision: Decision) -> None:
        """The per-question metrics of a decided request."""
        for qid, route in decision.routes.items():
            qtype, why = call.questions[qid].type, decision.degraded.get(qid)
            if why is not None:
                metrics.DEGRADED.labels(reason=why, type=qtype).inc()
            elif route.reason is not None:
                metrics.ESCALATIONS.labels(reason=route.reason, type=qtype).inc()
            metrics.QUESTIONS.labels(tier=route.tier, type=qtype).inc()
            metrics.CONFIDENCE.labels(tier=route.tier, type=qtype).observe(
                max(decision.results[qid].probabilities))

    async def _call(self, tier: str, call: EngineCall, timings: dict[str, float], *,
                    record: bool = True) -> EngineAnswer:
        """One engine call under the tier's budget or timeout and its breaker, with metrics.

        ``record=False`` (shadow calls) leaves the breaker alone: optional traffic says nothing
        real requests should act on.
        """
        engine = self.engines[tier]
        breaker = self.breakers[tier]
        config = self.policy.tiers[tier]
        now = self.clock()
        if record and not breaker.allow(now):
            metrics.TIER_DURATION.labels(tier=tier, outcome="breaker_open").observe(0)
            raise BreakerOpen(f"{tier} circuit open", retry_after=breaker.retry_after(now))
        remote = isinstance(config, UpstreamTier)
        started = time.perf_counter()
        outcome = "error"
        try:
            call = capped(call, config.timeout_s, tier, remote)
            # in process (no timeout): admission by expected wait; accepted work runs to the end
            async with asyncio.timeout(config.timeout_s if remote else None):
                answer = await engine.answer(call)
            outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"  # the caller went away: says nothing about the tier
            raise
        except TimeoutError as exc:
            outcome = "timeout"
            raise EngineTimeout(f"{tier} did not answer within {config.timeout_s} s") from exc
        except (ClientError, Overloaded) as exc:
            outcome = "client_error" if isinstance(exc, ClientError) else "overloaded"
            raise
        except EngineError:
            raise
        except Exception as exc:  # a bug in an engine is a tier failure, never a 500
            log.exception("tier %s raised an unexpected error", tier)
            raise EngineFailed(f"{tier} failed ({type(exc).__name__})") from exc
        finally:
            elapsed = time.perf_counter() - started
            timings[tier] = timings.get(tier, 0.0) + elapsed
            metrics.TIER_DURATION.labels(tier=tier, outcome=outcome).observe(elapsed)
            if record and outcome in ("client_error", "overloaded", "cancelled"):
                breaker.release(self.clock())  # no verdict on the tier's health
            elif record:
                breaker.record(self.clock(), outcome == "ok")
        metrics.TOKENS.labels(tier=tier).inc(answer.usage.input_tokens)
        return answer

    def _shadow(self, shadow: ShadowCall) -> None:
        """Mirror a cheap-final request to the strong tier in the background, bounded."""
        busy = len(self._shadow_tasks) >= self.policy.shadow.max_concurrent
        if busy or self.breakers[shadow.tier].state(self.clock()) != "closed":
            metrics.SHADOW.labels(outcome="skipped_busy").inc()
            return
        task = asyncio.get_running_loop().create_task(self._run_shadow(shadow))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _run_shadow(self, shadow: ShadowCall) -> None:
        try:
            strong = await self._call(shadow.tier, shadow.call, {}, record=False)
        except (EngineError, Overloaded, ClientError):
            metrics.SHADOW.labels(outcome="failed").inc()
            return
        metrics.SHADOW.labels(outcome="sent").inc()
        if self.decisions is not None:
            self.decisions.shadowed(shadow.call, strong)
        for found in compare(shadow.cheap, strong).values():
            metrics.SHADOW_TVD.labels(type=found.type, band=found.band).observe(found.tvd)
            if found.metric == "top1":
                agree = "true" if found.value >= 1.0 else "false"
                metrics.SHADOW_AGREEMENT.labels(type=found.type, band=found.band, agree=agree).inc()
            else:
                metrics.SHADOW_DELTA.labels(type=found.type, band=found.band).observe(found.value)
