"""The routing rules: which tier answers each question, and why.

Pure functions of the policy, the call, the cheap tier's preview and its answer: no I/O, no
clock, no metrics. ``cascade.policy.flow`` is the one procedure that applies them in order
(model resolution, pre-routing, the post-rules after the cheap answer, the final routes, one
call per tier, the merge); nothing else sequences them.

Reason codes (bounded, usable as metric labels): pre-routing ``images``, ``state_too_long``,
``too_many_options``, ``script``, ``type_rule``, ``model_alias``; post-rules ``low_confidence``,
``low_margin``, ``truncated``, ``options_collapsed``, ``order_unstable`` (the option-order
check, ``cascade.policy.consistency``), ``novel`` (the novelty gate,
``cascade.policy.novelty``); either ``whole_request``; and
``cheap_failed`` when the cheap tier could not answer (down, overloaded, broken) and its
questions went to the strong tier instead; and ``budget``, not an escalation: the gate wanted
the strong tier (low confidence or margin) but the live ``Gate`` kept the cheap answer (the
strong tier's budget or capacity binds, or a tenant is over its quota).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import msgspec

from cascade.calls import EngineAnswer, EngineCall, QuestionResult
from cascade.errors import EngineFailed, UnknownModel, ValidationFailed
from cascade.policy.calibration import gate_view
from cascade.policy.model import LayaTier, Mode, Policy, TypeBands
from cascade.questions import Band, n_options, option_band
from cascade.schema import Question, QuestionType

if TYPE_CHECKING:
    from cascade.calls import CallPreview, RowPreview

Reason = Literal[
    "images",
    "state_too_long",
    "too_many_options",
    "script",
    "type_rule",
    "model_alias",
    "low_confidence",
    "low_margin",
    "truncated",
    "options_collapsed",
    "whole_request",
    "cheap_failed",
    "budget",
    "order_unstable",
    "novel",
]
# The strong tier is the only one that can answer these; without it the request gets a 503.
STRONG_ONLY: frozenset[str] = frozenset(
    {"images", "state_too_long", "script", "model_alias", "cheap_failed"}
)


class QuestionRoute(msgspec.Struct, frozen=True):
    """The tier that answers (or first answers) a question; ``reason`` says why not the cheap."""

    tier: str
    reason: Reason | None = None


class Gate(msgspec.Struct, frozen=True, kw_only=True):
    """What the confidence gate applies to one request (``Gate.of(policy)``: the policy's own).

    ``confidence`` and ``margin`` are the thresholds the cascade wants (the policy's, or refit
    from labels by ``cascade.control``). ``budget``: per cell a lower cut on the confidence the
    strong tier's budget or capacity affords now; a question the thresholds escalate but whose
    confidence is at or above its cell's cut stays cheap, flagged ``budget`` (a cell without a
    cut: no budget binds). ``escalate=False``: no answer escalates on confidence or margin;
    each that would is flagged ``budget`` (truncation and option collapse still escalate).
    """

    confidence: TypeBands
    margin: TypeBands
    budget: TypeBands = msgspec.field(default_factory=TypeBands)
    escalate: bool = True

    @classmethod
    def of(cls, policy: Policy, *, escalate: bool = True) -> Gate:
        th = policy.thresholds
        return cls(confidence=th.confidence, margin=th.margin, escalate=escalate)

    def live(self, qtype: QuestionType, band: Band) -> float | None:
        """The confidence below which a cell's answers escalate now (None: never on it)."""
        want, cut = self.confidence.of(qtype).get(band), self.budget.of(qtype).get(band)
        return want if cut is None or want is None else min(want, cut)


class GateRead(msgspec.Struct, frozen=True):
    """What the confidence gate read of one cheap answer: its cell (type, option band), the
    confidence (max p, the calibration's view) and its own verdict: None (kept),
    ``low_confidence`` / ``low_margin`` (escalated), or ``budget`` (kept by the live gate
    against its thresholds). Only answers no signal (truncation, option collapse) escalated
    first are read; a ``whole_request`` escalation does not change a read's verdict."""

    type: QuestionType
    band: Band
    confidence: float
    verdict: Reason | None = None

    @property
    def cell(self) -> tuple[QuestionType, Band]:
        return self.type, self.band


class PreRoute(msgspec.Struct, frozen=True):
    mode: Mode
    cheap_checkpoint: str | None  # the Laya checkpoint to run (a ``Checkpoint`` name)
    questions: dict[str, QuestionRoute]  # every question, in the caller's order


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
        if any(
            fnmatch.fnmatchcase(key, name.lower())
            for name in getattr(models, mode)
            if _pattern(name)
        ):
            return mode
    if models.unknown == "cascade":
        return "cascade"
    known = ", ".join(models.cascade + models.cheap_only + models.strong_only)
    raise UnknownModel(f"unknown model `{model}`; this server answers: {known}")


def _pattern(name: str) -> bool:
    return "*" in name or "?" in name


# ---------------------------------------------------------------- pre-routing


def needs_preview(policy: Policy, call: EngineCall) -> bool:
    """Whether the flow's ``preview_steps`` would preview ``call`` at all: a Laya cheap tier,
    a model that may reach it, and no images sending the whole request strong. Cheap: no
    tokenizing."""
    mode = resolve_model(policy, call.model)
    if mode == "strong_only" or not isinstance(policy.cheap_tier(), LayaTier):
        return False
    return not (mode == "cascade" and policy.route.strong is not None and call.images)


def pre_route(policy: Policy, call: EngineCall, preview: CallPreview | None) -> PreRoute:
    """Route every question before any tier runs.

    ``preview`` is what the flow's ``preview_steps`` returned: exact token counts from the cheap
    tier's tokenizer, or None when there is no Laya cheap tier or the mode skips it. Raises
    ``UnknownModel``, or ``ValidationFailed`` when images reach a text-only deployment.
    """
    mode = resolve_model(policy, call.model)
    route = policy.route
    qids = list(call.questions)
    checkpoint = checkpoint_of(policy, preview)
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
        q: QuestionRoute(route.strong, r) if r else QuestionRoute(route.cheap)
        for q, r in reasons.items()
    }
    any_cheap = any(r.tier == route.cheap for r in questions.values())
    return PreRoute(mode, checkpoint if any_cheap else None, questions)


def _pre_reason(policy: Policy, question: Question, row: RowPreview | None) -> Reason | None:
    th = policy.thresholds
    static = static_reason(policy, question)
    if static is not None or row is None:
        return static
    if th.truncated and row.state_tokens_dropped > 0:
        return "state_too_long"
    if th.collapsed and row.collapsed:
        return "options_collapsed"
    return None


def static_reason(policy: Policy, question: Question) -> Reason | None:
    """Rules on the question alone, before any token is counted."""
    route = policy.route
    if question.type in route.strong_types:
        return "type_rule"
    if question.type == "choice" and n_options(question) > route.max_choice_options:
        return "too_many_options"
    return None


def checkpoint_of(policy: Policy, preview: CallPreview | None) -> str | None:
    if preview is not None:
        return preview.checkpoint
    tier = policy.cheap_tier()
    return tier.default_checkpoint if isinstance(tier, LayaTier) else None


def _all(
    mode: Mode, checkpoint: str | None, qids: list[str], tier: str, reason: Reason | None
) -> PreRoute:
    return PreRoute(mode, checkpoint, {q: QuestionRoute(tier, reason) for q in qids})


def _must(tier: str | None) -> str:
    if tier is None:  # validate() rejects policies where a mode's tier is missing
        raise ValueError("the policy has no tier for this mode")
    return tier


def _text_only(policy: Policy, call: EngineCall) -> None:
    if call.images and isinstance(policy.cheap_tier(), LayaTier):
        raise ValidationFailed.at(
            ["images"],
            f"model `{call.model}` is served by a text-only tier; images need the "
            "strong tier (ask for a cascade model)",
        )


# ---------------------------------------------------------------- post-rules


def post_route(
    policy: Policy,
    call: EngineCall,
    pre: PreRoute,
    cheap: EngineAnswer,
    preview: CallPreview | None,
    gate: Gate | None = None,
) -> dict[str, Reason]:
    """Which cheap answers escalate, ``{question id: reason}`` (``judge``'s first value)."""
    return judge(policy, call, pre, cheap, preview, gate)[0]


def judge(
    policy: Policy,
    call: EngineCall,
    pre: PreRoute,
    cheap: EngineAnswer,
    preview: CallPreview | None,
    gate: Gate | None = None,
) -> tuple[dict[str, Reason], dict[str, GateRead]]:
    """Which cheap answers escalate, ``{question id: reason}`` (empty: all are final), with
    those the live ``gate`` keeps although its thresholds would escalate them (``budget``);
    and what the confidence gate read of each answer that reached it (``GateRead``).

    Signals, in order: truncation and option collapse (the cheap tier's usage, or the preview
    ``pre_route`` saw), then ``answer_confidence`` and the top-two margin against the gate's
    (type x option band) thresholds (``gate``: the policy's own when None). With ``escalate =
    "request"`` one escalation takes every cheap question along (``whole_request``), flagged
    ones too. Raises ``EngineFailed`` when ``cheap`` lacks an answer it was asked for (the
    flow hands such an answer to its fallback rules first).
    """
    route = policy.route
    if pre.mode != "cascade" or route.strong is None:
        return {}, {}
    gate = gate or Gate.of(policy)
    cheap_qids = [q for q, r in pre.questions.items() if r.tier == route.cheap]
    rows = preview.rows if preview is not None else {}
    out: dict[str, Reason] = {}
    reads: dict[str, GateRead] = {}
    for qid in cheap_qids:
        result = cheap.results.get(qid)
        if result is None:
            raise EngineFailed(f"tier `{route.cheap}` returned no answer for question `{qid}`")
        signal = _signal(policy, qid, cheap, rows.get(qid))
        if signal is not None:
            out[qid] = signal
            continue
        read = reads[qid] = _read(policy, gate, result)
        if read.verdict is not None:
            out[qid] = read.verdict
    if route.escalate == "request" and any(r != "budget" for r in out.values()):
        out = {
            q: out[q] if out.get(q, "budget") != "budget" else "whole_request" for q in cheap_qids
        }
    order = [q for q in call.questions if q in out]
    return {q: out[q] for q in order}, {q: reads[q] for q in call.questions if q in reads}


def _signal(policy: Policy, qid: str, cheap: EngineAnswer, row: RowPreview | None) -> Reason | None:
    """Truncation or option collapse, which escalate whatever the confidence."""
    th, usage = policy.thresholds, cheap.usage
    truncated = qid in usage.truncated_questions or (
        row is not None and row.state_tokens_dropped > 0
    )
    collapsed = qid in usage.options or (row is not None and row.collapsed)
    if th.truncated and truncated:
        return "truncated"
    if th.collapsed and collapsed:
        return "options_collapsed"
    return None


def _read(policy: Policy, gate: Gate, result: QuestionResult) -> GateRead:
    """The confidence gate on one cheap answer."""
    result = gate_view(policy, result)  # a calibration's temperatures, when the policy has one
    band = option_band(len(result.probabilities))
    confidence = answer_confidence(result)
    floor = gate.confidence.of(result.type).get(band)
    margin = gate.margin.of(result.type).get(band)
    verdict: Reason | None = None
    if floor is not None and confidence < floor:
        verdict = "low_confidence"
    elif margin is not None and top_two_margin(result) < margin:
        verdict = "low_margin"
    cut = gate.budget.of(result.type).get(band)
    if verdict is not None and (not gate.escalate or (cut is not None and confidence >= cut)):
        verdict = "budget"
    return GateRead(type=result.type, band=band, confidence=confidence, verdict=verdict)


# ---------------------------------------------------------------- merge planning


def final_routes(
    policy: Policy, pre: PreRoute, escalated: Mapping[str, Reason]
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


def merge(
    call: EngineCall, routes: Mapping[str, QuestionRoute], answers: Mapping[str, EngineAnswer]
) -> dict[str, QuestionResult]:
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
