"""The cascade's decision on each question, computed from the tiers' outputs exactly as the
gateway decides: ``cascade.policy.routing``'s ``pre_route``, ``post_route`` and
``final_routes`` (calibration temperatures included), not a re-implementation.

It yields the lines of ``items.jsonl``: one per question, with each tier's answer and the
cascade's. ``cascade`` is null when the gateway would have refused the whole request (pre-routing
refused it, or a tier it needed refused or failed on it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import msgspec

from cascade.calls import EngineAnswer, QuestionResult
from cascade.errors import ClientError, EngineFailed
from cascade.eval.data import Item, Label, answer_label, label_index
from cascade.eval.runner import Outputs
from cascade.policy.calibration import gate_view, returned_results
from cascade.policy.model import Policy
from cascade.policy.routing import final_routes, post_route, pre_route
from cascade.questions import n_options, option_band
from cascade.schema import Question

# Reasons the gate gives; the deferral sweep moves only questions with these (or none).
CONFIDENCE_REASONS = frozenset({"low_confidence", "low_margin"})


class TierOut(msgspec.Struct, kw_only=True):
    answer: Label
    probabilities: list[float]
    confidence: float  # max p as the confidence gate reads it (calibration temperatures applied)


class CascadeOut(msgspec.Struct, kw_only=True):
    answer: Label
    tier: Literal["cheap", "strong"]
    reason: str | None
    pre_routed: bool  # sent to the strong tier before the cheap tier ran


class ItemRow(msgspec.Struct, kw_only=True):
    """One line of ``items.jsonl``."""

    id: str
    question: str
    type: str
    band: str
    gold: Any  # the label, or None when the data has none for this question
    gold_index: int | None  # the gold label's option index (None: no gold, or not an option)
    cheap: TierOut | None
    strong: TierOut | None
    cascade: CascadeOut | None
    tokens: dict[str, float]  # per tier: the item's input tokens split evenly over its questions


def rows_of(policy: Policy, item: Item, out: Outputs) -> Iterator[ItemRow]:
    """The ``items.jsonl`` lines of one item."""
    call = item.call
    cheap = out.cheap.answer if out.cheap is not None else None
    strong = out.strong.answer if out.strong is not None else None
    cascade = _cascade(policy, item, out, cheap, strong)
    for qid, question in call.questions.items():
        cheap_result = cheap.results.get(qid) if cheap is not None else None
        strong_result = strong.results.get(qid) if strong is not None else None
        gated = gate_view(policy, cheap_result) if cheap_result is not None else None
        yield ItemRow(
            id=item.id, question=qid, type=question.type,
            band=option_band(n_options(question)), gold=item.gold.get(qid),
            gold_index=label_index(question, item.gold[qid]) if qid in item.gold else None,
            cheap=_out(question, _returned(policy, qid, cheap_result), gated),
            strong=_out(question, strong_result, strong_result),
            cascade=cascade.get(qid) if cascade else None,
            tokens={slot: a.usage.input_tokens / len(a.results)
                    for slot, a in (("cheap", cheap), ("strong", strong))
                    if a is not None and a.results},
        )


def _returned(policy: Policy, qid: str, result: QuestionResult | None) -> QuestionResult | None:
    if result is None:
        return None
    return returned_results(policy, {qid: result}, {qid: policy.route.cheap or ""})[qid]


def _out(question: Question, result: QuestionResult | None,
         gated: QuestionResult | None) -> TierOut | None:
    if result is None or gated is None:
        return None
    return TierOut(answer=answer_label(question, result.probabilities),
                   probabilities=result.probabilities, confidence=max(gated.probabilities))


def _cascade(policy: Policy, item: Item, out: Outputs, cheap: EngineAnswer | None,
             strong: EngineAnswer | None) -> dict[str, CascadeOut] | None:
    """Each question's cascade answer, or None when the gateway would refuse the request."""
    call = item.call
    route = policy.route
    try:
        pre = pre_route(policy, call, out.preview)
        escalated: dict[str, str] = {}
        if any(r.tier == route.cheap for r in pre.questions.values()):
            if cheap is None:
                return None
            escalated = post_route(policy, call, pre, cheap, out.preview)
        routes = final_routes(policy, pre, escalated)
    except (ClientError, EngineFailed):
        return None
    answers = {name: a for name, a in ((route.cheap, cheap), (route.strong, strong))
               if name is not None and a is not None}
    found: dict[str, CascadeOut] = {}
    for qid, question in call.questions.items():
        tier = routes[qid].tier
        result = answers[tier].results.get(qid) if tier in answers else None
        if result is None:
            return None  # the tier the gateway needs refused or failed: the request fails
        probabilities = _returned(policy, qid, result) if tier == route.cheap else result
        assert probabilities is not None
        found[qid] = CascadeOut(
            answer=answer_label(question, probabilities.probabilities),
            tier="cheap" if tier == route.cheap else "strong",
            reason=routes[qid].reason,
            pre_routed=tier != route.cheap and qid not in escalated,
        )
    return found


def reaches_gate(row: ItemRow) -> bool:
    """The cheap tier answered it in the cascade and only the confidence gate could escalate
    it (no pre-routing, truncation, option collapse or whole-request rule did)."""
    c = row.cascade
    return (row.cheap is not None and c is not None and not c.pre_routed
            and (c.reason is None or c.reason in CONFIDENCE_REASONS))


def cascade_probabilities(row: ItemRow) -> list[float] | None:
    """The probabilities the cascade returned for ``row`` (its tier's)."""
    if row.cascade is None:
        return None
    chosen = row.cheap if row.cascade.tier == "cheap" else row.strong
    return chosen.probabilities if chosen is not None else None
