"""Pure routing decisions: which tier answers each question, and why.

No I/O, no clock, no metrics: ``cascade.gateway`` drives these functions, awaits the engines
and records what happened. One request flows like this::

    preview = preview_call(policy, call, previewer)  # a Previewer, default=default_checkpoint
    pre = pre_route(policy, call, preview)                  # before any tier runs
    cheap = await cheap_engine.answer(split(call, pre.questions)[cheap])   # if it has questions
    escalated = post_route(policy, call, pre, cheap, preview)
    routes = final_routes(policy, pre, escalated)
    strong = await strong_engine.answer(split(call, routes)[strong])       # ONE call, if any
    results = merge(call, routes, {cheap: cheap, strong: strong})

Running the cheap tier first and then one strong call for everything the strong tier must
answer (pre-routed and escalated together) pays for the state's tokens on the strong tier once.
When the strong tier is down, ``fallback`` says which questions the cheap tier answers
(marked degraded) or raises ``EngineUnavailable`` when only the strong tier can serve one.
Feed each tier's breaker with ``breaker.record(now, ok)`` after every call it allowed.

Reason codes (bounded, usable as metric labels): pre-routing ``images``, ``state_too_long``,
``too_many_options``, ``script``, ``type_rule``, ``model_alias``; post-rules ``low_confidence``,
``low_margin``, ``truncated``, ``options_collapsed``; either ``whole_request``; and
``cheap_failed`` when the cheap tier could not answer (down, overloaded, broken) and its
questions went to the strong tier instead.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

from cascade.calls import EngineAnswer, EngineCall, QuestionResult
from cascade.errors import EngineFailed, EngineUnavailable, UnknownModel, ValidationFailed
from cascade.policy.calibration import gate_view
from cascade.policy.model import LayaTier, Mode, Policy
from cascade.questions import n_options, option_band
from cascade.schema import Question

if TYPE_CHECKING:
    from cascade.calls import CallPreview, RowPreview

Reason = Literal[
    "images", "state_too_long", "too_many_options", "script", "type_rule", "model_alias",
    "low_confidence", "low_margin", "truncated", "options_collapsed", "whole_request",
    "cheap_failed",
]
# The strong tier is the only one that can answer these; without it the request gets a 503.
STRONG_ONLY: frozenset[str] = frozenset(
    {"images", "state_too_long", "script", "model_alias", "cheap_failed"}
)


class QuestionRoute(msgspec.Struct, frozen=True):
    """The tier that answers (or first answers) a question; ``reason`` says why not the cheap."""

    tier: str
    reason: Reason | None = None


class PreRoute(msgspec.Struct, frozen=True):
    mode: Mode
    cheap_checkpoint: str | None  # the Laya checkpoint to run, e.g. "multilingual"
    questions: dict[str, QuestionRoute]  # every question, in the caller's order


class Fallback(msgspec.Struct, frozen=True):
    """What to do when the strong tier cannot answer.

    ``cheap_questions``: questions the cheap tier has not run yet and must now answer, on
    ``cheap_checkpoint``. ``degraded``: every question whose answer now comes from the cheap tier
    although the policy wanted the strong one, with the reason it wanted it. Its answer keeps the
    cheap tier's own probabilities; the gateway marks it degraded (never raises its confidence).
    """

    cheap_questions: list[str]
    cheap_checkpoint: str | None
    degraded: dict[str, Reason]


# ---------------------------------------------------------------- small facts


def answer_confidence(result: QuestionResult) -> float:
    """max p, the calibrated confidence Laya's temperatures are fitted for."""
    return max(result.probabilities)


def top_two_margin(result: QuestionResult) -> float:
    """p(top) - p(second); 1.0 for a single option."""
    top = sorted(result.probabilities, reverse=True)
    return top[0] - top[1] if len(top) > 1 else 1.0


def resolve_model(policy: Policy, model: str) -> Mode:
    """What a request's ``model`` asks for. Names match without regard to case or surrounding
    blanks (as laya-serve matches them); a listed name with ``*`` or ``?`` is a pattern
    (``jev-*``). An exact name wins over a pattern; among patterns, cheap_only, strong_only,
    then cascade. Raises ``UnknownModel`` (400) for unlisted names unless the policy treats them
    as the cascade."""
    models = policy.models
    key = model.strip().lower()
    modes: tuple[Mode, ...] = ("cheap_only", "strong_only", "cascade")
    for mode in modes:
        if key in (name.lower() for name in getattr(models, mode) if not _pattern(name)):
            return mode
    for mode in modes:
        if any(fnmatch.fnmatchcase(key, name.lower())
               for name in getattr(models, mode) if _pattern(name)):
            return mode
    if models.unknown == "cascade":
        return "cascade"
    known = ", ".join(models.cascade + models.cheap_only + models.strong_only)
    raise UnknownModel(f"unknown model `{model}`; this server answers: {known}")


def _pattern(name: str) -> bool:
    return "*" in name or "?" in name


# ---------------------------------------------------------------- pre-routing


class Previews(Protocol):
    """What ``preview_call`` needs: ``cascade.laya.preview.Previewer`` (or an engine holding
    one). ``checkpoint=None`` is its own choice from the model alias, task, lang and script,
    with the tier's ``default_checkpoint`` as its default."""

    def preview(self, call: EngineCall, *, checkpoint: str | None = None) -> CallPreview: ...


def needs_preview(policy: Policy, call: EngineCall) -> bool:
    """Whether ``preview_call`` would preview ``call`` at all: a Laya cheap tier, a model that
    may reach it, and no images sending the whole request strong. Cheap: no tokenizing."""
    mode = resolve_model(policy, call.model)
    if mode == "strong_only" or not isinstance(policy.cheap_tier(), LayaTier):
        return False
    return not (mode == "cascade" and policy.route.strong is not None and call.images)


def preview_call(policy: Policy, call: EngineCall, previewer: Previews) -> CallPreview | None:
    """The cheap tier's tokenizer-only preview of ``call``, on the checkpoint the policy lets it
    run. Questions the policy sends strong whatever their tokens (type rules, too many
    options) are left out, so Laya's head budget never refuses a question Clef will answer. Text
    the chosen checkpoint cannot read is previewed again on the multilingual checkpoint when
    configured and ``route.unreadable = "multilingual"``; with ``"strong"`` the default
    checkpoint must read it, else the returned preview is unreadable and ``pre_route`` sends the
    request strong. None when no Laya tier runs first or nothing would run there.
    """
    if not needs_preview(policy, call):
        return None
    mode = resolve_model(policy, call.model)
    tier = policy.cheap_tier()
    assert isinstance(tier, LayaTier)
    route = policy.route
    to_strong = mode == "cascade" and route.strong is not None
    if to_strong:
        keep = {q: v for q, v in call.questions.items() if _static_reason(policy, v) is None}
        if not keep or (route.escalate == "request" and len(keep) < len(call.questions)):
            return None
        call = msgspec.structs.replace(call, questions=keep)
    first = previewer.preview(call)
    switch = not to_strong or route.unreadable == "multilingual"
    if (not first.readable and switch and first.checkpoint != "multilingual"
            and "multilingual" in tier.checkpoints.named()):
        return previewer.preview(call, checkpoint="multilingual")
    if not switch and first.checkpoint != tier.default_checkpoint:
        default = previewer.preview(call, checkpoint=tier.default_checkpoint)
        if not default.readable:
            return default
    return first


def pre_route(policy: Policy, call: EngineCall, preview: CallPreview | None) -> PreRoute:
    """Route every question before any tier runs.

    ``preview`` is what ``preview_call`` returned: exact token counts from the cheap tier's
    tokenizer, or None when there is no Laya cheap tier or the mode skips it. Raises
    ``UnknownModel``, or ``ValidationFailed`` when images reach a text-only deployment.
    """
    mode = resolve_model(policy, call.model)
    route = policy.route
    qids = list(call.questions)
    checkpoint = _checkpoint(policy, preview)
    if mode == "strong_only":
        return _all(mode, None, qids, _must(route.strong), "model_alias")
    if route.strong is None or mode == "cheap_only":
        _text_only(policy, call)
        return _all(mode, checkpoint, qids, _must(route.cheap), None)
    if route.cheap is None:
        return _all(mode, None, qids, route.strong, None)
    if call.images:
        return _all(mode, None, qids, route.strong, "images")
    if preview is not None and not preview.readable:
        return _all(mode, None, qids, route.strong, "script")
    rows = preview.rows if preview is not None else {}
    reasons = {q: _pre_reason(policy, call.questions[q], rows.get(q)) for q in qids}
    if route.escalate == "request" and any(reasons.values()):
        reasons = {q: r or "whole_request" for q, r in reasons.items()}
    questions = {
        q: QuestionRoute(route.strong, r) if r else QuestionRoute(route.cheap) for q, r in
        reasons.items()
    }
    any_cheap = any(r.tier == route.cheap for r in questions.values())
    return PreRoute(mode, checkpoint if any_cheap else None, questions)


def _pre_reason(policy: Policy, question: Question, row: RowPreview | None) -> Reason | None:
    th = policy.thresholds
    static = _static_reason(policy, question)
    if static is not None or row is None:
        return static
    if th.truncated and row.state_tokens_dropped > 0:
        return "state_too_long"
    if th.collapsed and row.collapsed:
        return "options_collapsed"
    return None


def _static_reason(policy: Policy, question: Question) -> Reason | None:
    """Rules on the question alone, before any token is counted."""
    route = policy.route
    if question.type in route.strong_types:
        return "type_rule"
    if question.type == "choice" and n_options(question) > route.max_choice_options:
        return "too_many_options"
    return None


def _checkpoint(policy: Policy, preview: CallPreview | None) -> str | None:
    if preview is not None:
        return preview.checkpoint
    tier = policy.cheap_tier()
    return tier.default_checkpoint if isinstance(tier, LayaTier) else None


def _all(mode: Mode, checkpoint: str | None, qids: list[str], tier: str,
         reason: Reason | None) -> PreRoute:
    return PreRoute(mode, checkpoint, {q: QuestionRoute(tier, reason) for q in qids})


def _must(tier: str | None) -> str:
    if tier is None:  # validate() rejects policies where a mode's tier is missing
        raise ValueError("the policy has no tier for this mode")
    return tier


def _text_only(policy: Policy, call: EngineCall) -> None:
    if call.images and isinstance(policy.cheap_tier(), LayaTier):
        raise ValidationFailed.at(
            ["images"], f"model `{call.model}` is served by a text-only tier; images need the "
            "strong tier (ask for a cascade model)"
        )


# ---------------------------------------------------------------- post-rules


def post_route(
    policy: Policy, call: EngineCall, pre: PreRoute, cheap: EngineAnswer,
    preview: CallPreview | None,
) -> dict[str, Reason]:
    """Which cheap answers escalate, ``{question id: reason}`` (empty: all are final).

    Signals, in order: truncation and option collapse (the cheap tier's usage, or the preview
    ``pre_route`` saw), then ``answer_confidence`` and the top-two margin against the policy's
    (type x option band) thresholds. With ``escalate = "request"`` one escalation takes every
    cheap question along (``whole_request``). Raises ``EngineFailed`` when ``cheap`` lacks an
    answer it was asked for.
    """
    route = policy.route
    if pre.mode != "cascade" or route.strong is None:
        return {}
    cheap_qids = [q for q, r in pre.questions.items() if r.tier == route.cheap]
    rows = preview.rows if preview is not None else {}
    out: dict[str, Reason] = {}
    for qid in cheap_qids:
        result = cheap.results.get(qid)
        if result is None:
            raise EngineFailed(f"tier `{route.cheap}` returned no answer for question `{qid}`")
        reason = _post_reason(policy, qid, result, cheap, rows.get(qid))
        if reason is not None:
            out[qid] = reason
    if out and route.escalate == "request":
        out = {q: out.get(q, "whole_request") for q in cheap_qids}
    return {q: out[q] for q in call.questions if q in out}


def _post_reason(policy: Policy, qid: str, result: QuestionResult, cheap: EngineAnswer,
                 row: RowPreview | None) -> Reason | None:
    th, usage = policy.thresholds, cheap.usage
    result = gate_view(policy, result)  # a calibration's temperatures, when the policy has one
    truncated = qid in usage.truncated_questions or (row is not None and
                                                     row.state_tokens_dropped > 0)
    collapsed = qid in usage.options or (row is not None and row.collapsed)
    if th.truncated and truncated:
        return "truncated"
    if th.collapsed and collapsed:
        return "options_collapsed"
    band = option_band(len(result.probabilities))
    floor = th.confidence.of(result.type).get(band)
    if floor is not None and answer_confidence(result) < floor:
        return "low_confidence"
    margin = th.margin.of(result.type).get(band)
    if margin is not None and top_two_margin(result) < margin:
        return "low_margin"
    return None


# ---------------------------------------------------------------- merge planning


def final_routes(policy: Policy, pre: PreRoute, escalated: Mapping[str, str]
                 ) -> dict[str, QuestionRoute]:
    """Every question's final tier and reason: the pre-route, with escalations moved strong."""
    strong = policy.route.strong
    return {
        q: QuestionRoute(_must(strong), escalated[q]) if q in escalated else r
        for q, r in pre.questions.items()
    }


def split(call: EngineCall, routes: Mapping[str, QuestionRoute]) -> dict[str, EngineCall]:
    """One call per tier holding that tier's questions in the caller's order (same state,
    images and controls), so each tier is called once per request."""
    by_tier: dict[str, dict[str, Question]] = {}
    for qid, question in call.questions.items():
        by_tier.setdefault(routes[qid].tier, {})[qid] = question
    return {tier: msgspec.structs.replace(call, questions=qs) for tier, qs in by_tier.items()}


def merge(call: EngineCall, routes: Mapping[str, QuestionRoute],
          answers: Mapping[str, EngineAnswer]) -> dict[str, QuestionResult]:
    """Each question's result from the tier its route names, in the caller's order.

    Raises ``EngineFailed`` when that tier's answer lacks the question or has another type.
    """
    out: dict[str, QuestionResult] = {}
    for qid, question in call.questions.items():
        tier = routes[qid].tier
        answer = answers.get(tier)
        result = answer.results.get(qid) if answer is not None else None
        if result is None or result.type != question.type:
            raise EngineFailed(f"tier `{tier}` returned no {question.type} answer for `{qid}`")
        out[qid] = result
    return out


# ---------------------------------------------------------------- degradation


def stand_in(policy: Policy, call: EngineCall, previewer: Previews,
             checkpoint: str | None) -> tuple[str | None, list[Reason]]:
    """The cheap tier standing in for a strong tier that is down, on ``call``'s questions
    (those pre-routed strong by a rule the cheap tier could still answer).

    Returns the checkpoint to run them on (``checkpoint``, or multilingual when that reads
    the text and ``checkpoint`` does not) and the strong-only reasons that still forbid it:
    ``script`` when no configured checkpoint reads the text, ``state_too_long`` when their rows
    would drop state tokens and the policy escalates truncation. Non-Laya cheap tiers have no
    preview: nothing forbids them.
    """
    tier = policy.cheap_tier()
    if not isinstance(tier, LayaTier):
        return checkpoint, []
    preview = previewer.preview(call, checkpoint=checkpoint)
    if (not preview.readable and preview.checkpoint != "multilingual"
            and "multilingual" in tier.checkpoints.named()):
        preview = previewer.preview(call, checkpoint="multilingual")
    blocking: list[Reason] = [] if preview.readable else ["script"]
    if policy.thresholds.truncated and any(
            row.state_tokens_dropped > 0 for row in preview.rows.values()):
        blocking.append("state_too_long")
    return preview.checkpoint, blocking



def fallback(policy: Policy, pre: PreRoute, routes: Mapping[str, QuestionRoute], *,
             retry_after_s: float | None = None) -> Fallback:
    """The plan when the strong tier is down, open or too slow for this request.

    Raises ``EngineUnavailable`` (503 + Retry-After, ``retry_after_s`` or the policy's) when the
    policy refuses to degrade, or when a question needs what only the strong tier can do:
    images, an over-long state, a strong-only model, or a script no configured checkpoint reads
    (with a multilingual checkpoint, ``script`` questions degrade onto it instead).
    """
    strong = policy.route.strong
    wanted = {q: r.reason for q, r in routes.items() if r.tier == strong}
    retry = policy.degrade.retry_after_s if retry_after_s is None else retry_after_s
    tier = policy.cheap_tier()
    checkpoint = pre.cheap_checkpoint or _checkpoint(policy, None)
    if "script" in wanted.values() and isinstance(tier, LayaTier):
        if "multilingual" in tier.checkpoints.named():
            checkpoint = "multilingual"
    if not wanted:
        return Fallback(cheap_questions=[], cheap_checkpoint=checkpoint, degraded={})
    if tier is None:
        raise EngineUnavailable(f"the only tier `{strong}` is unavailable; retry later",
                                retry_after=retry)
    blocking = sorted({r for r in wanted.values() if r in STRONG_ONLY
                       and not (r == "script" and checkpoint == "multilingual")})
    if blocking or not policy.degrade.cheap_answers:
        why = f" ({', '.join(blocking)})" if blocking else ""
        raise EngineUnavailable(
            f"the strong tier `{strong}` is unavailable and this request needs it{why}; "
            "retry later", retry_after=retry)
    # With a cheap tier every strong route carries a reason (pre_route sets one).
    return Fallback(
        cheap_questions=[q for q in wanted if pre.questions[q].tier == strong],
        cheap_checkpoint=checkpoint,
        degraded={q: r for q, r in wanted.items() if r is not None},
    )
