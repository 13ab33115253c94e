"""Drives one request through the cascade: the only code that awaits engines.

Flow: resolve the ``model`` name → preview the cheap tier's rows (exact token counts, no
inference) → ``routing.pre_route`` → one cheap call for its questions → ``routing.post_route`` →
ONE strong call for every question that must go there (pre-routed or escalated) → merge →
answers built with the configured confidence profile. Decisions are
``cascade.policy.routing``'s pure functions; this module awaits, times, records metrics,
applies breakers and degrades.

Every request gets a ``Budget``: a deadline ``admission_deadline_s`` from its start and a flow id
of its own (a batch's states share one). Engines with queues refuse a call at once when the
measured work ahead would keep it waiting past the deadline (an in-process tier's own
``timeout_s`` caps that wait further); what they accept runs to the end. Remote tiers get
``timeout_s`` as a whole-call limit.

When the cheap tier fails (breaker open, overload, error) a cascade request's cheap questions go
to the strong tier instead (reason ``cheap_failed``); a cheap-only request gets the error.

When the strong tier fails (breaker open, timeout, overload, error) or refuses the request's
content (a 4xx): questions the cheap tier already answered come back marked degraded (their own
confidence, never an invented one); questions pre-routed for a reason the cheap tier could still
answer (too many options, a type rule, a script the multilingual checkpoint reads) are answered
by the cheap tier, marked degraded, unless its preview shows it cannot read the text or would
truncate the state; requests only the strong tier can serve (images, states too long for the
cheap tier, a strong-only model name, questions the failed cheap tier handed over) get 503 +
Retry-After, or the strong tier's own 4xx when it refused their content (``routing.fallback``
and ``routing.stand_in`` decide).

Breakers count what says a tier is broken: errors, timeouts of remote tiers, unavailability.
Client errors, overload and cancellations only free a half-open probe slot. Shadow calls never
touch a breaker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import msgspec

from cascade import __version__, metrics
from cascade.answers import Profile, apply_gate, build_answer, build_usage
from cascade.calls import Budget, EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.engines.base import Engine
from cascade.errors import (
    BreakerOpen,
    CascadeError,
    ClientError,
    EngineError,
    EngineFailed,
    EngineTimeout,
    EngineUnavailable,
    Overloaded,
)
from cascade.policy.breaker import CircuitBreaker
from cascade.policy.calibration import returned_results
from cascade.policy.model import Policy, UpstreamTier
from cascade.policy.routing import (
    PreRoute,
    QuestionRoute,
    fallback,
    final_routes,
    merge,
    needs_preview,
    post_route,
    pre_route,
    preview_call,
    split,
    stand_in,
)
from cascade.policy.shadow import compare, shadow_questions
from cascade.questions import n_options
from cascade.schema import ModelCard, SystemOneResponse
from cascade.settings import ADMISSION_DEADLINE_S

log = logging.getLogger("cascade")
DEMO_PREFIX = "DEMO-random-weights/"
DEMO_WARNING = "DEMO: tiny random weights, answers are meaningless"


class Outcome(msgspec.Struct, kw_only=True):
    response: SystemOneResponse
    headers: dict[str, str]
    label: str  # "ok" or "degraded", the requests_total outcome
    tiers: dict[str, str]  # question id -> the tier whose answer was returned


def subcall(call: EngineCall, qids: Iterable[str]) -> EngineCall:
    """``call`` restricted to ``qids`` (request order kept)."""
    keep = set(qids)
    return msgspec.structs.replace(
        call, questions={q: v for q, v in call.questions.items() if q in keep}
    )


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
    """Owns the engines of one policy; ``systemone`` answers one validated call."""

    decisions: DecisionSink | None = None  # set by ``cascade serve --decision-log``

    def __init__(self, policy: Policy, engines: Mapping[str, Engine], *, profile: Profile = "laya",
                 demo: bool = False, clock: Any = time.monotonic,
                 admission_deadline_s: float = ADMISSION_DEADLINE_S):
        self.policy = policy
        self.engines = dict(engines)
        self.profile = profile
        self.demo = demo
        self.clock = clock  # the breakers' clock; budgets use time.monotonic, as engines do
        self.admission_deadline_s = admission_deadline_s
        self._flows = itertools.count(1)
        self._shadow_salt = secrets.token_hex(8)  # sampling keys no client can steer
        self.cheap_name = policy.route.cheap
        self.strong_name = policy.route.strong
        self.breakers = {name: CircuitBreaker(policy.breaker_for(name)) for name in self.engines}
        # The cheap engine when it can preview rows (Laya): exact token counts for pre-routing.
        cheap = self.engines.get(self.cheap_name or "")
        self._previewer = cheap if hasattr(cheap, "preview") else None
        self._shadow_tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ lifecycle

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
        for name, engine in self.engines.items():
            # Read at scrape time: an upstream going down, or a cooldown ending without any
            # traffic, shows at once.
            metrics.TIER_READY.labels(tier=name).set_function(engine.ready)
            breaker = self.breakers[name]
            metrics.BREAKER_STATE.labels(tier=name).set_function(
                lambda b=breaker: _STATE_CODE[b.state(self.clock())]
            )
        health = self.health()
        metrics.BUILD.info({
            "version": __version__,
            "tiers": ",".join(f"{n}={type(e).__name__}" for n, e in self.engines.items()),
            "checkpoints": ",".join(health["loaded"]),
            "revisions": ",".join(f"{k}={v}" for k, v in health["revisions"].items() if v),
            "demo": "true" if self.demo else "false",
        })

    async def aclose(self) -> None:
        for task in list(self._shadow_tasks):
            task.cancel()
        await asyncio.gather(*self._shadow_tasks, return_exceptions=True)
        await asyncio.gather(*(engine.aclose() for engine in self.engines.values()))
        for name in self.engines:
            metrics.TIER_READY.labels(tier=name).set_function(lambda: 0)

    def ready(self) -> bool:
        """Whether this replica can serve: its cheap tier (or its only tier) is loaded. A strong
        tier that is down only degrades answers; ``/health`` and ``cascade_tier_ready`` show it."""
        first = self.cheap_name or self.strong_name
        return first is not None and self.engines[first].ready()

    def health(self) -> dict[str, Any]:
        """``/health`` details. ``loaded`` and ``revisions`` are the keys Laya's remote client
        reads: the checkpoints (Laya tiers) and models (other tiers) resident right now."""
        now = self.clock()
        tiers = {
            name: {**engine.health(), "ready": engine.ready(),
                   "breaker": self.breakers[name].state(now)}
            for name, engine in self.engines.items()
        }
        resident = [
            (name, detail) for detail in tiers.values() if detail.get("ready")
            for name in detail.get("checkpoints") or [detail.get("model") or ""] if name
        ]
        return {
            "demo": self.demo,
            **({"warning": DEMO_WARNING} if self.demo else {}),
            "ready": self.ready(),
            "loaded": [name for name, _ in resident],
            "revisions": {name: detail.get("revision") for name, detail in resident},
            "route": {"cheap": self.cheap_name, "strong": self.strong_name},
            "tiers": tiers,
            **({"decision_log": self.decisions.health()} if self.decisions is not None else {}),
        }

    def describe(self) -> str:
        tiers = ", ".join(f"{n}={type(e).__name__}" for n, e in self.engines.items())
        return f"{'DEMO (random weights) ' if self.demo else ''}tiers: {tiers}"

    def model_cards(self) -> list[ModelCard]:
        models = self.policy.models
        described = [
            (models.cascade, "cascade: the cheap tier first, escalating to the strong tier"),
            (models.cheap_only, f"the cheap tier only ({self.cheap_name})"),
            (models.strong_only, f"the strong tier only ({self.strong_name})"),
        ]
        prefix = "DEMO, random weights: " if self.demo else ""
        return [
            ModelCard(name=name, description=prefix + text, release_date="2026-11-30")
            for names, text in described
            for name in names
            if "*" not in name and "?" not in name  # patterns such as jev-* are not model names
        ]

    # ------------------------------------------------------------ one request

    def budget(self) -> Budget:
        """A new request's budget: its admission deadline and a flow of its own."""
        return Budget(deadline=time.monotonic() + self.admission_deadline_s,
                      flow=next(self._flows))

    async def batch(self, calls: list[EngineCall]) -> list[Outcome]:
        """Laya's batch: every state under one budget (one flow, so the tiers share their
        capacity fairly between this batch and other requests). The first failure cancels
        the sibling states and is raised."""
        budget = self.budget()
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self.systemone(c, budget=budget)) for c in calls]
        except BaseExceptionGroup as failed:
            raise _first(failed) from None
        return [task.result() for task in tasks]

    async def systemone(self, call: EngineCall, *, budget: Budget | None = None) -> Outcome:
        call = msgspec.structs.replace(call, budget=budget or self.budget())
        timings: dict[str, float] = {}
        started = time.perf_counter()
        policy = self.policy
        preview = None
        if self._previewer is not None and needs_preview(policy, call):
            # Tokenizing a long state takes milliseconds: keep it off the event loop.
            preview = await asyncio.to_thread(preview_call, policy, call, self._previewer)
        pre = pre_route(policy, call, preview)
        timings["pre_route"] = time.perf_counter() - started
        metrics.HOP_DURATION.labels(hop="pre_route").observe(timings["pre_route"])

        answers: dict[str, EngineAnswer] = {}
        usages: list[tuple[str, EngineUsage]] = []
        calls = split(call, pre.questions)
        cheap_answer = None
        escalated: dict[str, str] = {}
        if self.cheap_name in calls:
            cheap_call = self._cheap_call(calls[self.cheap_name], pre.cheap_checkpoint)
            try:
                cheap_answer = await self._call(self.cheap_name, cheap_call, timings)
            except (EngineError, Overloaded):
                if pre.mode != "cascade" or self.strong_name is None:
                    raise
                # The cheap tier is busy or broken: the strong tier takes its questions.
                escalated = dict.fromkeys(calls[self.cheap_name].questions, "cheap_failed")
            else:
                answers[self.cheap_name] = cheap_answer
                usages.append((self.cheap_name, cheap_answer.usage))
                escalated = post_route(policy, call, pre, cheap_answer, preview)
        routes = final_routes(policy, pre, escalated)
        degraded: dict[str, str] = {}
        strong_call = split(call, routes).get(self.strong_name or "")
        if strong_call is not None:
            assert self.strong_name is not None
            try:
                strong_answer = await self._call(self.strong_name, strong_call, timings)
            except (EngineError, Overloaded, ClientError) as exc:
                routes, degraded = await self._degrade(call, pre, routes, exc, answers, usages,
                                                       timings)
            else:
                answers[self.strong_name] = strong_answer
                usages.append((self.strong_name, strong_answer.usage))
        for qid, route in routes.items():
            if route.reason is not None and not degraded.get(qid):
                metrics.ESCALATIONS.labels(reason=route.reason, type=call.questions[qid].type).inc()

        t_merge = time.perf_counter()
        tiers = {q: r.tier for q, r in routes.items()}
        results = returned_results(policy, merge(call, routes, answers), tiers)
        models = [a.model for a in answers.values()]
        response = self._response(call, results, tiers, usages, models, routes, degraded, timings)
        metrics.HOP_DURATION.labels(hop="merge").observe(time.perf_counter() - t_merge)
        if self.decisions is not None:
            await self.decisions.record(call, routes, answers, degraded, pre.cheap_checkpoint,
                                        time.perf_counter() - started)
        key = f"{self._shadow_salt}:{call.budget.flow if call.budget else 0}"
        if cheap_answer is not None and shadow_questions(policy, pre, escalated, key):
            self._shadow(call, cheap_answer)
        return Outcome(response=response, headers=self._headers(Counter(tiers.values())),
                       label="degraded" if degraded else "ok", tiers=tiers)

    def _headers(self, counts: Counter[str]) -> dict[str, str]:
        """``x-cascade-tiers``: tier names and question counts (question ids are client text:
        they stay in the body); ``x-cascade-demo`` in demo mode."""
        headers = {"x-cascade-tiers": ",".join(f"{t}={n}" for t, n in counts.items())}
        if self.demo:
            headers["x-cascade-demo"] = "random weights; answers are meaningless"
        return headers

    def batch_headers(self, outcomes: Iterable[Outcome]) -> dict[str, str]:
        """The headers of a batch response: question counts per tier over every state."""
        return self._headers(Counter(t for o in outcomes for t in o.tiers.values()))

    @staticmethod
    def _cheap_call(call: EngineCall, checkpoint: str | None) -> EngineCall:
        """The cheap tier reads text only and runs the checkpoint routing picked."""
        return msgspec.structs.replace(call, images=[], model=checkpoint or call.model)

    async def _degrade(
        self, call: EngineCall, pre: PreRoute, routes: dict[str, QuestionRoute], exc: Exception,
        answers: dict[str, EngineAnswer], usages: list[tuple[str, EngineUsage]],
        timings: dict[str, float],
    ) -> tuple[dict[str, QuestionRoute], dict[str, str]]:
        """The strong tier failed or refused: cheap answers marked degraded, or 503 (or, when
        it refused the content of a request only it can serve, its own 4xx)."""
        retry = exc.retry_after if isinstance(exc, CascadeError) else None
        try:
            plan = fallback(self.policy, pre, routes, retry_after_s=retry)
            checkpoint = plan.cheap_checkpoint
            if plan.cheap_questions and self._previewer is not None:
                sub = subcall(call, plan.cheap_questions)
                checkpoint, blocking = await asyncio.to_thread(
                    stand_in, self.policy, sub, self._previewer, checkpoint)
                if blocking:
                    raise EngineUnavailable(
                        f"the strong tier `{self.strong_name}` is unavailable and this request "
                        f"needs it ({', '.join(blocking)}); retry later",
                        retry_after=self.policy.degrade.retry_after_s if retry is None else retry)
        except EngineUnavailable:
            if isinstance(exc, ClientError | Overloaded):
                # The client's content (its 4xx stands), or back-pressure (its Retry-After).
                raise exc from None
            raise
        assert self.cheap_name is not None
        if plan.cheap_questions:
            extra = self._cheap_call(subcall(call, plan.cheap_questions), checkpoint)
            try:
                answer = await self._call(self.cheap_name, extra, timings)
            except ClientError as refused:
                # e.g. too many options for Laya's head: the request is fine, the strong tier
                # is not. A 4xx would never be retried; it must succeed once Clef is back.
                if isinstance(exc, ClientError):
                    raise exc from None
                raise EngineUnavailable(
                    f"the strong tier `{self.strong_name}` is unavailable and the cheap tier "
                    f"cannot stand in ({refused.message}); retry later",
                    retry_after=self.policy.degrade.retry_after_s,
                ) from exc
            usages.append((self.cheap_name, answer.usage))
            base = answers.get(self.cheap_name)
            merged = {**base.results, **answer.results} if base else answer.results
            answers[self.cheap_name] = msgspec.structs.replace(answer, results=merged)
        why = _failure_reason(exc)
        for qid in plan.degraded:
            metrics.DEGRADED.labels(reason=why, type=call.questions[qid].type).inc()
        new_routes = {
            q: QuestionRoute(self.cheap_name, r.reason) if q in plan.degraded else r
            for q, r in routes.items()
        }
        return new_routes, dict.fromkeys(plan.degraded, why)

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
            call = _within(call, config.timeout_s, tier, remote)
            if remote:
                async with asyncio.timeout(config.timeout_s):
                    answer = await engine.answer(call)
            else:  # in process: admission by expected wait; accepted work runs to the end
                answer = await engine.answer(call)
            outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"  # the caller went away: says nothing about the tier
            raise
        except TimeoutError as exc:
            outcome = "timeout"
            raise EngineTimeout(f"{tier} did not answer within {config.timeout_s} s") from exc
        except ClientError:
            outcome = "client_error"
            raise
        except Overloaded:
            outcome = "overloaded"
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

    def _response(
        self, call: EngineCall, results: dict[str, QuestionResult], tiers: dict[str, str],
        usages: list[tuple[str, EngineUsage]], models: list[str],
        routes: Mapping[str, QuestionRoute], degraded: dict[str, str], timings: dict[str, float],
    ) -> SystemOneResponse:
        answers = {}
        gate = call.controls.min_confidence
        for qid, question in call.questions.items():
            result = results[qid]
            answer = build_answer(question, result, self.profile)
            if gate is not None and self.profile == "laya":
                apply_gate(answer, question.type, n_options(question), gate)
            answers[qid] = answer
            metrics.QUESTIONS.labels(tier=tiers[qid], type=question.type).inc()
            metrics.CONFIDENCE.labels(tier=tiers[qid], type=question.type).observe(
                max(result.probabilities)
            )
        usage = build_usage(_merge_usage(usages, tiers), self.profile)
        model = "+".join(dict.fromkeys(models))
        response = SystemOneResponse(
            model=DEMO_PREFIX + model if self.demo else model, answers=answers, usage=usage
        )
        if self.profile == "laya":
            response.x_cascade = {
                "tiers": tiers,
                "reasons": {q: r.reason for q, r in routes.items() if r.reason},
                "degraded": degraded,
                "timings_s": {k: round(v, 6) for k, v in timings.items()},
                **({"demo": True} if self.demo else {}),
            }
        return response

    # ------------------------------------------------------------ shadow sampling

    def _shadow(self, call: EngineCall, cheap: EngineAnswer) -> None:
        """Mirror a cheap-final request to the strong tier in the background, bounded."""
        assert self.strong_name is not None
        busy = len(self._shadow_tasks) >= self.policy.shadow.max_concurrent
        if busy or self.breakers[self.strong_name].state(self.clock()) != "closed":
            metrics.SHADOW.labels(outcome="skipped_busy").inc()
            return
        task = asyncio.get_running_loop().create_task(self._run_shadow(call, cheap))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _run_shadow(self, call: EngineCall, cheap: EngineAnswer) -> None:
        assert self.strong_name is not None
        try:
            strong = await self._call(self.strong_name, call, {}, record=False)
        except (EngineError, Overloaded, ClientError):
            metrics.SHADOW.labels(outcome="failed").inc()
            return
        metrics.SHADOW.labels(outcome="sent").inc()
        if self.decisions is not None:
            self.decisions.shadowed(call, strong)
        for found in compare(cheap, strong).values():
            metrics.SHADOW_TVD.labels(type=found.type, band=found.band).observe(found.tvd)
            if found.metric == "top1":
                agree = "true" if found.value >= 1.0 else "false"
                metrics.SHADOW_AGREEMENT.labels(type=found.type, band=found.band, agree=agree).inc()
            else:
                metrics.SHADOW_DELTA.labels(type=found.type, band=found.band).observe(found.value)


def _within(call: EngineCall, timeout_s: float, tier: str, remote: bool) -> EngineCall:
    """``call`` with its budget capped for ``tier``: an in-process tier's ``timeout_s`` bounds
    the wait it accepts (a remote tier's is its whole-call limit instead). Raises ``Overloaded``
    when the request's budget is already spent: nothing is sent to any tier then."""
    budget = call.budget
    if budget is None:
        return call
    now = time.monotonic()
    if now >= budget.deadline:
        raise Overloaded(f"{tier}: the request's wait budget is spent", retry_after=1.0)
    if remote:
        return call
    capped = Budget(deadline=min(budget.deadline, now + timeout_s), flow=budget.flow)
    return msgspec.structs.replace(call, budget=capped)


def _first(group: BaseExceptionGroup) -> BaseException:
    """The exception to report for a failed batch: a cascade error when there is one."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            pending[:0] = exc.exceptions
        else:
            leaves.append(exc)
    return next((e for e in leaves if isinstance(e, CascadeError)), leaves[0])


_STATE_CODE = {"closed": 0, "half_open": 1, "open": 2}


def _failure_reason(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        return "strong_refused"
    if isinstance(exc, Overloaded):
        return "strong_overloaded"
    if isinstance(exc, EngineTimeout):
        return "strong_timeout"
    if isinstance(exc, BreakerOpen):
        return "breaker_open"
    return "strong_failed"


def _merge_usage(usages: list[tuple[str, EngineUsage]], tiers: Mapping[str, str]) -> EngineUsage:
    """One usage for the response: tokens add up over every call; truncation is reported for the
    questions whose returned answer came from a truncated row, and ``state_tokens_dropped`` is
    the most any of those rows dropped."""
    returned = [(q, u) for tier, u in usages for q in u.truncated_questions
                if tiers.get(q) == tier]
    truncated = [q for q, _ in returned]
    dropped = [u.dropped.get(q, u.state_tokens_dropped) for q, u in returned]
    return EngineUsage(
        input_tokens=sum(u.input_tokens for _, u in usages),
        state_tokens=next((u.state_tokens for _, u in usages if u.state_tokens is not None), None),
        state_tokens_dropped=max(dropped, default=0),
        truncated_questions=truncated,
        options={q: o for tier, u in usages for q, o in u.options.items() if tiers.get(q) == tier},
    )
