"""The cascade as one sans-IO procedure: what a request asks of the tiers, and what it decides.

``decide(policy, call, previews=..., shadow_key=...)`` is a generator in the shape of httpx's
``Auth.auth_flow``. It yields what it needs, a ``Preview`` of the cheap tier's rows or a
``TierCall`` of one tier on some questions, and is sent back the answer (a ``CallPreview``, an
``EngineAnswer``) or the tier's ``Failure``. It returns one ``Decision``; a request the cascade
refuses ends it with the ``CascadeError`` the client gets. With ``partial=True`` (a contract
with per-question refusals) the questions that alone make it refuse are left out of the answers
and reported in ``Decision.refused`` instead, each with the error; it still ends with the
error when every question is refused, or when the error is not the strong tier's unavailability
(its 4xx on the client's content, back-pressure). It does no I/O, awaits nothing and
reads no clock: ``cascade.gateway`` drives it against live engines, ``cascade.eval.decide``
against cached tier outputs, ``run`` against plain functions. One request::

    preview                 the cheap tier's exact token counts and the checkpoint that reads it
    routing.pre_route       every question, before any tier runs
    ONE cheap call          its questions; failed: a cascade request's go strong (cheap_failed)
    routing.post_route      the confidence gate (calibration view; the live ``Gate`` when given:
                            answers it keeps although its thresholds would escalate them are
                            flagged ``budget``), truncation, option collapse
    novelty                 rows unlike the calibration data (``cascade.policy.novelty``)
    order check             narrow keeps asked again in other option orders (one more cheap
                            call, ``cascade.policy.consistency``; ``[consistency]`` only)
    ONE strong call         pre-routed and escalated together: the state's tokens paid once
    failed or refused       degrade or refuse (``fallback``, ``stand_in``)
    merge                   the results returned (calibration view) and whether to shadow

When the strong tier fails (breaker open, timeout, overload, error) or refuses the request's
content (a 4xx): questions the cheap tier already answered come back marked degraded (their own
confidence, never an invented one); questions pre-routed for a reason the cheap tier could
still answer (too many options, a type rule, a script the any-script checkpoint reads) are
answered by the cheap tier, marked degraded, unless its preview shows it cannot read the text or
would truncate the state; requests only the strong tier can serve (images, states too long for
the cheap tier, a strong-only model name, questions the failed cheap tier handed over) are
refused with 503 + Retry-After, or the strong tier's own 4xx when it refused their content, or
its back-pressure when it was overloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from typing import TypeVar

import msgspec

from cascade import calls
from cascade.calls import CallPreview, EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.engines.base import Previewing
from cascade.errors import (
    BreakerOpen,
    CascadeError,
    ClientError,
    EngineFailed,
    EngineTimeout,
    EngineUnavailable,
    Overloaded,
    TenantLimited,
    ValidationFailed,
)
from cascade.novelty.reference import ReferenceSet
from cascade.policy import consistency, novelty
from cascade.policy.calibration import returned_results
from cascade.policy.consistency import OrderCheck
from cascade.policy.model import LayaTier, Policy
from cascade.policy.quota import StrongQuota
from cascade.policy.routing import (
    STRONG_ONLY,
    Gate,
    GateRead,
    PreRoute,
    QuestionRoute,
    Reason,
    checkpoint_of,
    final_routes,
    judge,
    merge,
    needs_preview,
    pre_route,
    resolve_model,
    split,
    static_reason,
)
from cascade.policy.shadow import shadow_questions
from cascade.policy.stamp import Stamp

T = TypeVar("T")


class Preview(msgspec.Struct, frozen=True):
    """Asks for the cheap tier's preview of ``call`` on ``checkpoint`` (None: its own choice);
    answered with a ``CallPreview``."""

    call: EngineCall
    checkpoint: str | None = None


class TierCall(msgspec.Struct, frozen=True):
    """Asks ``tier`` to answer ``call``; answered with its ``EngineAnswer`` or a ``Failure``."""

    tier: str
    call: EngineCall


class Failure(msgspec.Struct, frozen=True):
    """A tier's answer to a ``TierCall`` when it failed or refused the call."""

    error: CascadeError


Ask = Preview | TierCall
Reply = CallPreview | EngineAnswer | Failure
Flow = Generator[Ask, Reply, T]


class ShadowCall(msgspec.Struct, frozen=True):
    """Mirror ``call`` to ``tier`` off the response path and compare with ``cheap``."""

    tier: str
    call: EngineCall
    cheap: EngineAnswer


class Decision(msgspec.Struct, kw_only=True):
    """What the cascade decided for one request."""

    pre: PreRoute  # the routes before any tier ran, and the cheap checkpoint
    escalated: dict[str, Reason]  # the cheap answers the post-rules (or its failure) sent strong
    routes: dict[str, QuestionRoute]  # each question's final tier and the reason it is not cheap
    degraded: dict[str, str]  # question -> why the cheap tier's answer stands in for the strong
    results: dict[str, QuestionResult]  # what is returned, in the caller's order
    answers: dict[str, EngineAnswer]  # by tier, what it answered (a stand-in merged in)
    usage: EngineUsage  # over every call; truncation of the returned answers only
    model: str  # the answering models, joined with "+"
    shadow: ShadowCall | None
    # question -> what the confidence gate read of its cheap answer: the questions that reached
    # the gate (every consumer counts these; see ``GateRead``)
    gate: dict[str, GateRead] = msgspec.field(default_factory=dict)
    # question -> why it cannot be answered now (``partial`` only; left out of the above)
    refused: dict[str, CascadeError] = msgspec.field(default_factory=dict)
    stamp: Stamp = msgspec.field(default_factory=Stamp)  # what decided it (its log rows' stamp)
    # question -> its option-order check (``[consistency]``; only the questions checked)
    orders: dict[str, OrderCheck] = msgspec.field(default_factory=dict)
    # question -> its novelty over its cell's threshold (above 1: novel; only those judged)
    novelty: dict[str, float] = msgspec.field(default_factory=dict)

    @property
    def tiers(self) -> dict[str, str]:
        """Question id -> the tier whose answer is returned."""
        return {q: r.tier for q, r in self.routes.items()}


class Fallback(msgspec.Struct, frozen=True):
    """What to do when the strong tier cannot answer.

    ``cheap_questions``: questions the cheap tier has not run yet and must now answer, on
    ``cheap_checkpoint``. ``degraded``: every question whose answer now comes from the cheap tier
    although the policy wanted the strong one, with the reason it wanted it. Its answer keeps the
    cheap tier's own probabilities, marked degraded (its confidence is never raised).
    """

    cheap_questions: list[str]
    cheap_checkpoint: str | None
    degraded: dict[str, Reason]


# ---------------------------------------------------------------- the procedure


def decide(
    policy: Policy,
    call: EngineCall,
    *,
    previews: bool,
    shadow_key: str = "",
    partial: bool = False,
    gate: Gate | None = None,
    quota: StrongQuota | None = None,
    stamp: Stamp | None = None,
    reference: ReferenceSet | None = None,
) -> Flow[Decision]:
    """The decision for ``call``. ``previews``: whether the cheap tier answers ``Preview``
    (without, pre-routing sees no token counts). ``shadow_key`` picks the shadow sample.
    ``partial``: refuse the questions nothing can answer now instead of the whole request.
    ``gate``: the confidence gate to apply (None: the policy's thresholds); the cheap answers it
    keeps against its thresholds are routed cheap with the reason ``budget``. ``quota``: the
    tenant's strong answers left (None: no cap), see ``within_quota``. ``stamp``: the version
    deciding, completed with ``policy``'s tier names on the decision. ``reference``: the
    novelty gate's reference set (None: no novelty gate)."""
    strong = policy.route.strong
    preview = (yield from preview_steps(policy, call)) if previews else None
    trip = _Trip(
        policy,
        call,
        pre_route(policy, call, preview),
        previews=previews,
        partial=partial,
        reference=reference,
    )
    pre = trip.pre
    cheap, gated, reads = yield from trip.cheap(preview, gate)
    escalated: dict[str, Reason] = {q: r for q, r in gated.items() if r != "budget"}
    routes = final_routes(policy, pre, escalated)
    routes.update(
        {q: QuestionRoute(r.tier, "budget") for q, r in routes.items() if gated.get(q) == "budget"}
    )
    degraded: dict[str, str] = {}
    over_quota = False
    if quota is not None and strong is not None:
        routes, over_quota = within_quota(policy, pre, escalated, routes, quota)
        escalated = {q: r for q, r in escalated.items() if routes[q].tier == strong}
    strong_call = split(call, routes).get(strong or "")
    if strong_call is not None and strong is not None:
        if over_quota:
            assert quota is not None
            reply: EngineAnswer | Failure = Failure(quota.refusal())  # as if the tier refused
        else:
            reply = yield from _tier(strong, strong_call)
        if isinstance(reply, Failure):
            routes, degraded = yield from trip.degrade(routes, reply.error)
            if len(trip.refused) == len(call.questions):
                raise next(iter(trip.refused.values()))  # System One's error: the first refusal
        else:
            trip.keep(strong, reply)
    tiers = {q: r.tier for q, r in routes.items()}
    shadow = None
    if (
        cheap is not None
        and strong is not None
        and shadow_questions(policy, pre, escalated, shadow_key)
    ):
        shadow = ShadowCall(tier=strong, call=call, cheap=cheap)
    answered = subcall(call, routes) if trip.refused else call
    return Decision(
        pre=pre,
        escalated=escalated,
        routes=routes,
        degraded=degraded,
        gate=reads,
        results=returned_results(policy, merge(answered, routes, trip.answers), tiers),
        answers=trip.answers,
        usage=merged_usage(trip.usages, tiers),
        model="+".join(dict.fromkeys(a.model for a in trip.answers.values())),
        shadow=shadow,
        refused=trip.refused,
        orders=trip.orders,
        novelty=trip.novelty,
        stamp=msgspec.structs.replace(stamp or Stamp(), cheap=policy.route.cheap, strong=strong),
    )


def within_quota(
    policy: Policy,
    pre: PreRoute,
    escalated: Mapping[str, Reason],
    routes: dict[str, QuestionRoute],
    quota: StrongQuota,
) -> tuple[dict[str, QuestionRoute], bool]:
    """``routes`` cut to the strong answers ``quota`` grants: first the questions with no cheap
    answer (pre-routed strong, or handed over by a failed cheap tier), then escalations in
    question order; an escalation left out stays cheap, flagged ``budget``. When the questions
    with no cheap answer do not all fit, none of the request goes strong and the second value
    is True: they are handled as a strong tier refusing with the quota's 429 (a stand-in where
    the policy allows one, flagged ``strong_quota``; else the 429)."""
    strong, cheap = policy.route.strong, policy.route.cheap
    wanted = [q for q, r in routes.items() if r.tier == strong]
    must = [
        q for q in wanted if pre.questions[q].tier == strong or escalated.get(q) == "cheap_failed"
    ]
    granted = quota.take(len(wanted))
    over = granted < len(must)
    if over:
        quota.give(granted)
        granted = len(must)
    optional = [q for q in wanted if q not in must]
    keep = {*must, *optional[: granted - len(must)]}
    trimmed = {
        q: QuestionRoute(cheap, "budget") for q in wanted if q not in keep and cheap is not None
    }
    return {**routes, **trimmed}, over


def run(flow: Flow[T], reply: Callable[[Ask], Reply]) -> T:
    """Drive ``flow`` synchronously, answering each ask with ``reply``."""
    try:
        ask = next(flow)
        while True:
            ask = flow.send(reply(ask))
    except StopIteration as done:
        value: T = done.value
        return value


def cheap_call(call: EngineCall, checkpoint: str | None) -> EngineCall:
    """The cheap tier reads text only and runs the checkpoint routing picked."""
    return msgspec.structs.replace(call, images=[], model=checkpoint or call.model)


def subcall(call: EngineCall, qids: Iterable[str]) -> EngineCall:
    """``call`` restricted to ``qids`` (request order kept)."""
    keep = set(qids)
    return msgspec.structs.replace(
        call, questions={q: v for q, v in call.questions.items() if q in keep}
    )


class _Trip:
    """One request on its way through the tiers: what it asks (``call``, pre-routed ``pre``),
    one answer per tier that answered (a stand-in merged into the cheap tier's), every call's
    usage, the questions refused (``partial`` only), and what the cheap-tier signals beside
    confidence found (``reference``: the novelty gate's reference set, None: no novelty gate)."""

    def __init__(
        self,
        policy: Policy,
        call: EngineCall,
        pre: PreRoute,
        *,
        previews: bool,
        partial: bool,
        reference: ReferenceSet | None = None,
    ) -> None:
        self.policy, self.call, self.pre = policy, call, pre
        self.previews, self.partial, self.reference = previews, partial, reference
        self.orders: dict[str, OrderCheck] = {}
        self.novelty: dict[str, float] = {}
        self.answers: dict[str, EngineAnswer] = {}
        self.usages: list[tuple[str, EngineUsage]] = []
        self.refused: dict[str, CascadeError] = {}

    def keep(self, tier: str, answer: EngineAnswer) -> None:
        """``tier`` answered: merged into what it answered before."""
        base = self.answers.get(tier)
        self.answers[tier] = answer if base is None else calls.merge([base, answer])
        self.usages.append((tier, answer.usage))

    def refuse(
        self, routes: dict[str, QuestionRoute], qids: Iterable[str], why: CascadeError
    ) -> dict[str, QuestionRoute]:
        """``routes`` without ``qids``, which are refused with ``why``."""
        self.refused.update(dict.fromkeys(qids, why))
        return {q: r for q, r in routes.items() if q not in self.refused}

    def cheap(
        self, preview: CallPreview | None, gate: Gate | None
    ) -> Flow[tuple[EngineAnswer | None, dict[str, Reason], dict[str, GateRead]]]:
        """The cheap call of the questions pre-routed cheap: its answer, the escalations (with
        the answers ``gate`` keeps, flagged ``budget``; the novelty gate's and the option-order
        check's included) and what the gate read. A cheap tier
        that fails, or answers without an answer it was asked for, hands a cascade request's
        questions to the strong tier (``cheap_failed``)."""
        policy, call, pre = self.policy, self.call, self.pre
        name, strong = policy.route.cheap, policy.route.strong
        sub = split(call, pre.questions).get(name or "")
        if sub is None or name is None:
            return None, {}, {}
        reply = yield from _tier(name, cheap_call(sub, pre.cheap_checkpoint))
        if isinstance(reply, Failure):
            if isinstance(reply.error, ClientError) or pre.mode != "cascade" or strong is None:
                raise reply.error
            # The cheap tier is busy or broken: the strong tier takes its questions.
            return None, dict.fromkeys(sub.questions, "cheap_failed"), {}
        self.keep(name, reply)
        escalated, reads = judge(policy, call, pre, reply, preview, gate)
        gate = gate or Gate.of(policy)
        novel, scores = novelty.judge(policy, self.reference, gate, pre, reply, escalated)
        self.novelty.update(scores)
        escalated |= consistency.whole_request(policy, pre, novel)
        escalated |= yield from self._order_check(gate, reply, escalated)
        return reply, {q: escalated[q] for q in call.questions if q in escalated}, reads

    def _order_check(
        self, gate: Gate, cheap: EngineAnswer, gated: dict[str, Reason]
    ) -> Flow[dict[str, Reason]]:
        """The option-order check's escalations (``cascade.policy.consistency``): one more
        cheap call of the planned rows, its tokens counted; a failure checks nothing."""
        policy, call, pre = self.policy, self.call, self.pre
        planned = consistency.plan(policy, gate, call, pre, cheap, gated)
        if not planned or policy.route.cheap is None:
            return {}
        extra = consistency.reordered_call(cheap_call(call, pre.cheap_checkpoint), planned)
        reply = yield from _tier(policy.route.cheap, extra)
        if isinstance(reply, Failure):
            return {}
        self.usages.append((policy.route.cheap, reply.usage))
        moved, checks = consistency.judge(policy, gate, cheap, planned, reply)
        self.orders.update(checks)
        return consistency.whole_request(policy, pre, moved)

    def degrade(
        self, routes: dict[str, QuestionRoute], error: CascadeError
    ) -> Flow[tuple[dict[str, QuestionRoute], dict[str, str]]]:
        """The strong tier failed with ``error``: cheap answers marked degraded, or a refusal:
        of the request (raised), or with ``partial`` of the questions nothing can answer now
        (moved from the returned routes to ``refused``, each with the error the request would
        fail with)."""
        policy, retry = self.policy, error.retry_after
        partial = self.partial and not isinstance(error, ClientError | Overloaded)
        plan = fallback(policy, self.pre, routes, retry_after_s=retry)
        if partial and isinstance(plan, EngineUnavailable):
            routes = self.refuse(routes, unservable(policy, routes), plan)
            plan = fallback(policy, self.pre, routes, retry_after_s=retry)
        if isinstance(plan, Fallback) and plan.cheap_questions and self.previews:
            routes, plan = yield from self._previewed(routes, plan, error, partial)
        if isinstance(plan, EngineUnavailable):
            # The client's content (its 4xx stands), or back-pressure (its Retry-After).
            raise error if isinstance(error, ClientError | Overloaded) else plan
        routes = yield from self._stand_in(routes, plan, error, partial)
        name = policy.route.cheap
        why = failure_reason(error)
        degraded = {
            q: QuestionRoute(name, r.reason) if q in plan.degraded and name is not None else r
            for q, r in routes.items()
        }
        return degraded, {q: why for q in plan.degraded if q not in self.refused}

    def _previewed(
        self, routes: dict[str, QuestionRoute], plan: Fallback, error: CascadeError, partial: bool
    ) -> Flow[tuple[dict[str, QuestionRoute], Fallback]]:
        """``plan`` on the checkpoint the stand-in's preview picks; its questions refused
        (``partial``) or the request (raised) when the preview says only the strong tier can
        answer them."""
        policy = self.policy
        checkpoint, blocking = yield from stand_in(
            policy, subcall(self.call, plan.cheap_questions), plan.cheap_checkpoint
        )
        plan = msgspec.structs.replace(plan, cheap_checkpoint=checkpoint)
        if not blocking:
            return routes, plan
        retry = error.retry_after
        unavailable = EngineUnavailable(
            f"the strong tier `{policy.route.strong}` is unavailable and this request needs "
            f"it ({', '.join(blocking)}); retry later",
            retry_after=policy.degrade.retry_after_s if retry is None else retry,
        )
        if not partial:
            raise error if isinstance(error, ClientError | Overloaded) else unavailable
        routes = self.refuse(routes, plan.cheap_questions, unavailable)
        return routes, _without(plan, self.refused)

    def _stand_in(
        self, routes: dict[str, QuestionRoute], plan: Fallback, error: CascadeError, partial: bool
    ) -> Flow[dict[str, QuestionRoute]]:
        """The cheap tier answers ``plan``'s questions it has not run yet; with ``partial``
        once more without those it names (or all of them) when it refuses."""
        name = self.policy.route.cheap
        for attempt in range(2):
            if not plan.cheap_questions or name is None:
                break
            extra = cheap_call(subcall(self.call, plan.cheap_questions), plan.cheap_checkpoint)
            reply = yield from _tier(name, extra)
            if not isinstance(reply, Failure):
                self.keep(name, reply)
                break
            refusal = _cannot_stand_in(self.policy, error, reply.error)
            if not partial:
                raise refusal
            named = _named(reply.error, plan.cheap_questions) if attempt == 0 else []
            routes = self.refuse(routes, named or plan.cheap_questions, refusal)
            plan = _without(plan, self.refused)
        return routes


def _named(error: CascadeError, qids: list[str]) -> list[str]:
    """The questions of ``qids`` a tier's validation error names (``["body", "questions", id]``),
    as Laya's names a question whose options do not fit its head."""
    items = error.items if isinstance(error, ValidationFailed) else []
    named = {
        str(i["loc"][2])
        for i in items
        if len(i["loc"]) > 2 and i["loc"][:2] == ["body", "questions"]
    }
    return [q for q in qids if q in named]


def _without(plan: Fallback, refused: Mapping[str, CascadeError]) -> Fallback:
    return msgspec.structs.replace(
        plan,
        cheap_questions=[q for q in plan.cheap_questions if q not in refused],
        degraded={q: r for q, r in plan.degraded.items() if q not in refused},
    )


def _cannot_stand_in(
    policy: Policy, error: CascadeError, refused: CascadeError
) -> EngineUnavailable:
    """What the client gets when the cheap tier fails standing in for the strong one: the
    503 returned, anything else raised."""
    if not isinstance(refused, ClientError):
        raise refused
    if isinstance(error, ClientError | TenantLimited):
        raise error
    # e.g. too many options for Laya's head: the request is fine, the strong tier is not. A 4xx
    # would never be retried; it must succeed once the strong tier is back.
    return EngineUnavailable(
        f"the strong tier `{policy.route.strong}` is unavailable and the cheap tier cannot "
        f"stand in ({refused.message}); retry later",
        retry_after=policy.degrade.retry_after_s,
    )


def failure_reason(error: CascadeError) -> str:
    """Why an answer is degraded, from the strong tier's failure (a bounded metric label)."""
    if isinstance(error, TenantLimited):
        return "strong_quota"
    if isinstance(error, ClientError):
        return "strong_refused"
    if isinstance(error, Overloaded):
        return "strong_overloaded"
    if isinstance(error, EngineTimeout):
        return "strong_timeout"
    if isinstance(error, BreakerOpen):
        return "breaker_open"
    return "strong_failed"


def merged_usage(usages: list[tuple[str, EngineUsage]], tiers: Mapping[str, str]) -> EngineUsage:
    """One usage for the response: tokens add up over every call; truncation is reported for the
    questions whose returned answer came from a truncated row, and ``state_tokens_dropped`` is
    the most any of those rows dropped."""
    returned = [(q, u) for tier, u in usages for q in u.truncated_questions if tiers.get(q) == tier]
    truncated = [q for q, _ in returned]
    dropped = [u.dropped.get(q, u.state_tokens_dropped) for q, u in returned]
    return EngineUsage(
        input_tokens=sum(u.input_tokens for _, u in usages),
        cached_tokens=sum(u.cached_tokens for _, u in usages),
        state_tokens=next((u.state_tokens for _, u in usages if u.state_tokens is not None), None),
        state_tokens_dropped=max(dropped, default=0),
        truncated_questions=truncated,
        options={q: o for tier, u in usages for q, o in u.options.items() if tiers.get(q) == tier},
    )


def _tier(tier: str, call: EngineCall) -> Flow[EngineAnswer | Failure]:
    """``tier``'s answer to ``call``; an answer that lacks a question asked, or answers it
    with another type, is the tier failing."""
    reply = yield TierCall(tier, call)
    if isinstance(reply, CallPreview):
        raise TypeError("a TierCall is answered with an EngineAnswer or a Failure")
    if isinstance(reply, EngineAnswer):
        for qid, question in call.questions.items():
            result = reply.results.get(qid)
            if result is None or result.type != question.type:
                return Failure(
                    EngineFailed(f"tier `{tier}` returned no {question.type} answer for `{qid}`")
                )
    return reply


def _preview(call: EngineCall, checkpoint: str | None = None) -> Flow[CallPreview]:
    reply = yield Preview(call, checkpoint)
    if not isinstance(reply, CallPreview):
        raise TypeError("a Preview is answered with a CallPreview")
    return reply


# ---------------------------------------------------------------- previews


def preview_steps(policy: Policy, call: EngineCall) -> Flow[CallPreview | None]:
    """The cheap tier's tokenizer-only preview of ``call``, on the checkpoint the policy lets it
    run. Questions the policy sends strong whatever their tokens (type rules, too many
    options) are left out, so Laya's head budget never refuses a question Clef will answer. Text
    the chosen checkpoint cannot read is previewed again on the any-script checkpoint when
    configured and ``route.unreadable`` names it; with ``"strong"`` the default checkpoint must
    read it, else the returned preview is unreadable and ``pre_route`` sends the request strong.
    None when no Laya tier runs first or nothing would run there.
    """
    if not needs_preview(policy, call):
        return None
    mode = resolve_model(policy, call.model)
    tier = policy.cheap_tier()
    if not isinstance(tier, LayaTier):
        return None
    route = policy.route
    to_strong = mode == "cascade" and route.strong is not None
    if to_strong:
        keep = {q: v for q, v in call.questions.items() if static_reason(policy, v) is None}
        if not keep or (route.escalate == "request" and len(keep) < len(call.questions)):
            return None
        call = msgspec.structs.replace(call, questions=keep)
    first = yield from _preview(call)
    switch = not to_strong or route.unreadable != "strong"
    reads_all = tier.any_script()
    if not first.readable and switch and reads_all is not None and first.checkpoint != reads_all:
        return (yield from _preview(call, reads_all))
    if not switch and first.checkpoint != tier.default_checkpoint:
        default = yield from _preview(call, tier.default_checkpoint)
        if not default.readable:
            return default
    return first


def preview_call(policy: Policy, call: EngineCall, previewer: Previewing) -> CallPreview | None:
    """``preview_steps`` run against ``previewer`` (an engine or ``cascade.laya.preview``'s)."""
    return run(preview_steps(policy, call), _previews_with(previewer))


def _previews_with(previewer: Previewing) -> Callable[[Ask], Reply]:
    def reply(ask: Ask) -> Reply:
        if not isinstance(ask, Preview):
            raise TypeError("this flow may only ask for previews")
        return previewer.preview(ask.call, checkpoint=ask.checkpoint)

    return reply


# ---------------------------------------------------------------- degradation


def stand_in(
    policy: Policy, call: EngineCall, checkpoint: str | None
) -> Flow[tuple[str | None, list[Reason]]]:
    """The cheap tier standing in for a strong tier that is down, on ``call``'s questions
    (those pre-routed strong by a rule the cheap tier could still answer).

    Returns the checkpoint to run them on (``checkpoint``, or the any-script one when that reads
    the text and ``checkpoint`` does not) and the strong-only reasons that still forbid it:
    ``script`` when no configured checkpoint reads the text, ``state_too_long`` when their rows
    would drop state tokens and the policy escalates truncation. Non-Laya cheap tiers have no
    preview: nothing forbids them.
    """
    tier = policy.cheap_tier()
    if not isinstance(tier, LayaTier):
        return checkpoint, []
    preview = yield from _preview(call, checkpoint)
    reads_all = tier.any_script()
    if not preview.readable and reads_all is not None and preview.checkpoint != reads_all:
        preview = yield from _preview(call, reads_all)
    blocking: list[Reason] = [] if preview.readable else ["script"]
    if policy.thresholds.truncated and any(
        row.state_tokens_dropped > 0 for row in preview.rows.values()
    ):
        blocking.append("state_too_long")
    return preview.checkpoint, blocking


def fallback(
    policy: Policy,
    pre: PreRoute,
    routes: Mapping[str, QuestionRoute],
    *,
    retry_after_s: float | None = None,
) -> Fallback | EngineUnavailable:
    """The plan when the strong tier is down, open or too slow for this request.

    An ``EngineUnavailable`` (503 + Retry-After, ``retry_after_s`` or the policy's) when the
    policy refuses to degrade, or when a question needs what only the strong tier can do:
    images, an over-long state, a strong-only model, or a script no configured checkpoint reads
    (with an any-script checkpoint, ``script`` questions degrade onto it instead).
    """
    strong = policy.route.strong
    wanted = {q: r.reason for q, r in routes.items() if r.tier == strong}
    retry = policy.degrade.retry_after_s if retry_after_s is None else retry_after_s
    tier = policy.cheap_tier()
    checkpoint = pre.cheap_checkpoint or checkpoint_of(policy, None)
    reads_all = tier.any_script() if isinstance(tier, LayaTier) else None
    if "script" in wanted.values() and reads_all is not None:
        checkpoint = reads_all
    if not wanted:
        return Fallback(cheap_questions=[], cheap_checkpoint=checkpoint, degraded={})
    if tier is None:
        return EngineUnavailable(
            f"the only tier `{strong}` is unavailable; retry later", retry_after=retry
        )
    blocking = sorted({r for r in wanted.values() if r is not None and _needs_strong(r, reads_all)})
    if blocking or not policy.degrade.cheap_answers:
        why = f" ({', '.join(blocking)})" if blocking else ""
        return EngineUnavailable(
            f"the strong tier `{strong}` is unavailable and this request needs it{why}; "
            "retry later",
            retry_after=retry,
        )
    # With a cheap tier every strong route carries a reason (pre_route sets one).
    return Fallback(
        cheap_questions=[q for q in wanted if pre.questions[q].tier == strong],
        cheap_checkpoint=checkpoint,
        degraded={q: r for q, r in wanted.items() if r is not None},
    )


def unservable(policy: Policy, routes: Mapping[str, QuestionRoute]) -> list[str]:
    """The questions of ``routes`` routed strong that ``fallback`` cannot give the cheap tier:
    every one without a cheap tier or when the policy does not degrade, else those whose reason
    only the strong tier can serve."""
    strong = policy.route.strong
    wanted = {q: r.reason for q, r in routes.items() if r.tier == strong}
    tier = policy.cheap_tier()
    if tier is None or not policy.degrade.cheap_answers:
        return list(wanted)
    reads_all = tier.any_script() if isinstance(tier, LayaTier) else None
    return [q for q, r in wanted.items() if r is not None and _needs_strong(r, reads_all)]


def _needs_strong(reason: Reason, reads_all: str | None) -> bool:
    """Whether only the strong tier can answer a question routed there for ``reason``; a
    ``script`` one degrades onto the any-script checkpoint ``reads_all`` when there is one."""
    return reason in STRONG_ONLY and not (reason == "script" and reads_all is not None)
