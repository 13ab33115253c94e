"""Drives one request through the cascade: the only code that awaits engines.

Flow: resolve the ``model`` name → preview the cheap tier's rows (exact token counts, no
inference) → ``routing.pre_route`` → one cheap call for its questions → ``routing.post_route`` →
ONE strong call for every question that must go there (pre-routed or escalated) → merge →
answers built with the configured confidence profile. Decisions are
``cascade.policy.routing``'s pure functions; this module awaits, times, records metrics,
applies breakers and degrades.

Degradation when the strong tier fails (breaker open, timeout, overload, error): questions the
cheap tier already answered come back marked degraded (their own confidence, never an invented
one); questions pre-routed for a reason the cheap tier could still answer (too many options, a
type rule, a script the multilingual checkpoint reads) are answered by the cheap tier, marked
degraded; requests only the strong tier can serve (images, states too long for the cheap tier,
a strong-only model name) get 503 + Retry-After (``routing.fallback`` decides).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import msgspec

from cascade import __version__, metrics
from cascade.answers import Profile, apply_gate, build_answer, build_usage
from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.engines.base import Engine
from cascade.errors import (
    BreakerOpen,
    CascadeError,
    ClientError,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    Overloaded,
)
from cascade.policy.breaker import CircuitBreaker
from cascade.policy.calibration import returned_results
from cascade.policy.model import Policy
from cascade.policy.routing import (
    PreRoute,
    QuestionRoute,
    fallback,
    final_routes,
    merge,
    post_route,
    pre_route,
    preview_call,
    split,
)
from cascade.policy.shadow import compare, shadow_questions
from cascade.questions import n_options
from cascade.schema import ModelCard, SystemOneResponse

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


class Gateway:
    """Owns the engines of one policy; ``systemone`` answers one validated call."""

    decisions: DecisionSink | None = None  # set by ``cascade serve --decision-log``

    def __init__(self, policy: Policy, engines: Mapping[str, Engine], *, profile: Profile = "laya",
                 demo: bool = False, clock: Any = time.monotonic):
        self.policy = policy
        self.engines = dict(engines)
        self.profile = profile
        self.demo = demo
        self.clock = clock
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
            metrics.TIER_READY.labels(tier=name).set(1 if engine.ready() else 0)
            metrics.BREAKER_STATE.labels(tier=name).set(0)
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
            metrics.TIER_READY.labels(tier=name).set(0)

    def ready(self) -> bool:
        return all(engine.ready() for engine in self.engines.values())

    def health(self) -> dict[str, Any]:
        """``/health`` details. ``loaded`` and ``revisions`` are the keys Laya's remote client
        reads: the checkpoints (Laya tiers) and models (other tiers) resident right now."""
        now = self.clock()
        tiers = {
            name: {**engine.health(), "breaker": self.breakers[name].state(now)}
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
        ]

    # ------------------------------------------------------------ one request

    async def systemone(self, call: EngineCall) -> Outcome:
        timings: dict[str, float] = {}
        started = time.perf_counter()
        policy = self.policy
        preview = None
        if self._previewer is not None:
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
            cheap_answer = await self._call(self.cheap_name, cheap_call, timings)
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
            except (EngineError, Overloaded) as exc:
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
        if cheap_answer is not None and shadow_questions(policy, pre, escalated, call.request_id):
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
        """The strong tier failed: cheap answers marked degraded, or 503 (``fallback`` decides)."""
        retry = exc.retry_after if isinstance(exc, CascadeError) else None
        plan = fallback(self.policy, pre, routes, retry_after_s=retry)
        assert self.cheap_name is not None
        if plan.cheap_questions:
            extra = self._cheap_call(subcall(call, plan.cheap_questions), plan.cheap_checkpoint)
            try:
                answer = await self._call(self.cheap_name, extra, timings)
            except ClientError as refused:
                # e.g. too many options for Laya's head: the request is fine, the strong tier
                # is not. A 4xx would never be retried; it must succeed once Clef is back.
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

    async def _call(self, tier: str, call: EngineCall, timings: dict[str, float]) -> EngineAnswer:
        """One engine call under the tier's timeout and breaker, with metrics."""
        engine = self.engines[tier]
        breaker = self.breakers[tier]
        config = self.policy.tiers[tier]
        now = self.clock()
        if not breaker.allow(now):
            metrics.BREAKER_STATE.labels(tier=tier).set(_STATE_CODE[breaker.state(now)])
            metrics.TIER_DURATION.labels(tier=tier, outcome="breaker_open").observe(0)
            raise BreakerOpen(f"{tier} circuit open", retry_after=breaker.retry_after(now))
        started = time.perf_counter()
        outcome = "error"  # anything but a clean answer counts against the tier
        try:
            async with asyncio.timeout(config.timeout_s):
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
        except (EngineError, Overloaded) as exc:
            outcome = "overloaded" if isinstance(exc, Overloaded) else "error"
            raise
        finally:
            elapsed = time.perf_counter() - started
            timings[tier] = timings.get(tier, 0.0) + elapsed
            metrics.TIER_DURATION.labels(tier=tier, outcome=outcome).observe(elapsed)
            if outcome not in ("client_error", "overloaded", "cancelled"):
                breaker.record(self.clock(), outcome == "ok")
            metrics.BREAKER_STATE.labels(tier=tier).set(_STATE_CODE[breaker.state(self.clock())])
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
            strong = await self._call(self.strong_name, call, {})
        except (EngineError, Overloaded, ClientError):
            metrics.SHADOW.labels(outcome="failed").inc()
            return
        metrics.SHADOW.labels(outcome="sent").inc()
        if self.decisions is not None:
            self.decisions.shadowed(call, strong)
        for found in compare(cheap, strong).values():
            if found.metric == "top1":
                agree = "true" if found.value >= 1.0 else "false"
                metrics.SHADOW_AGREEMENT.labels(type=found.type, band=found.band, agree=agree).inc()
            else:
                metrics.SHADOW_DELTA.labels(type=found.type, band=found.band).observe(found.value)


_STATE_CODE = {"closed": 0, "half_open": 1, "open": 2}


def _failure_reason(exc: Exception) -> str:
    if isinstance(exc, Overloaded):
        return "strong_overloaded"
    if isinstance(exc, EngineTimeout):
        return "strong_timeout"
    if isinstance(exc, BreakerOpen):
        return "breaker_open"
    return "strong_failed"


def _merge_usage(usages: list[tuple[str, EngineUsage]], tiers: Mapping[str, str]) -> EngineUsage:
    """One usage for the response: tokens add up over every call; truncation is reported for the
    questions whose returned answer came from a truncated row."""
    truncated = [q for tier, u in usages for q in u.truncated_questions if tiers.get(q) == tier]
    dropped = [u.state_tokens_dropped for tier, u in usages
               if any(tiers.get(q) == tier for q in u.truncated_questions)]
    return EngineUsage(
        input_tokens=sum(u.input_tokens for _, u in usages),
        state_tokens=next((u.state_tokens for _, u in usages if u.state_tokens is not None), None),
        state_tokens_dropped=max(dropped, default=0),
        truncated_questions=truncated,
        options={q: o for tier, u in usages for q, o in u.options.items() if tiers.get(q) == tier},
    )
