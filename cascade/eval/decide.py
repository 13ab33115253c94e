"""The cascade's decision on each question, computed from the tiers' outputs by the very flow
the gateway drives (``cascade.policy.flow.decide``: pre-routing, the confidence gate with its
calibration view, fallback and degradation), its tier calls answered from the cached outputs.

It yields the lines of ``items.jsonl``: one per question, with each tier's answer and the
cascade's. ``cascade`` is null when the gateway would have refused the whole request (pre-routing
refused it, or a tier it needed refused or failed on it and nothing could stand in); its
``degraded`` is true when the cheap tier's answer stands in for a strong tier that failed.
``strong_down`` decides as if the strong tier were unavailable (``cascade eval --strong-down``);
``canned_strong`` as if it answered every call (``cascade calibrate``, which never runs it:
the questions that reach the gate are those of a cascade whose strong tier serves).
The option-order check's extra call is answered from the runner's reordered rows
(``Outputs.orders``; without them the check finds no rows and checks nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import msgspec

from cascade.calls import QuestionResult
from cascade.engines.base import Previewing
from cascade.errors import CascadeError, ClientError, EngineFailed, EngineUnavailable
from cascade.eval.data import Item
from cascade.eval.runner import Outputs, TierRun
from cascade.novelty.reference import ReferenceSet
from cascade.policy.calibration import gate_view, returned_results
from cascade.policy.canned import certain
from cascade.policy.consistency import MARK
from cascade.policy.flow import Ask, Decision, Failure, Preview, Reply, decide, run
from cascade.policy.model import Policy
from cascade.policy.routing import checkpoint_of
from cascade.questions import answer_label, label_index, n_options, option_band
from cascade.schema import Label, Question

# The confidence gate's escalations (its other verdicts: kept, budget).
CONFIDENCE_REASONS = frozenset({"low_confidence", "low_margin"})


class TierOut(msgspec.Struct, kw_only=True):
    answer: Label
    probabilities: list[float]
    confidence: float  # max p as the confidence gate reads it (calibration temperatures applied)
    vector: bytes | None = None  # the cheap tier's pooled vector (what calibrate's novelty fits)


class CascadeOut(msgspec.Struct, kw_only=True):
    answer: Label
    tier: Literal["cheap", "strong"]
    reason: str | None
    pre_routed: bool  # sent to the strong tier before the cheap tier ran
    degraded: bool = False  # the cheap tier's answer, standing in for a strong tier that failed
    # the confidence gate's verdict on the cheap answer (``Decision.gate``): "kept",
    # "low_confidence", "low_margin" or "budget"; None: it never reached the gate
    gate: str | None = None
    # the option-order check: its extra rows, and whether the winner held (None: not checked)
    order_rows: int = 0
    order_stable: bool | None = None
    novelty: float | None = None  # over the cell's threshold (above 1: novel; None: not judged)


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
    checkpoint: str | None = None  # the Laya checkpoint the cheap tier ran
    source: str = ""  # the item's ``source``


def rows_of(
    policy: Policy,
    item: Item,
    out: Outputs,
    *,
    strong_down: bool = False,
    canned_strong: bool = False,
    previewer: Previewing | None = None,
    reference: ReferenceSet | None = None,
) -> Iterator[ItemRow]:
    """The ``items.jsonl`` lines of one item (``replay``'s arguments)."""
    call = item.call
    cheap = out.cheap.answer if out.cheap is not None else None
    strong = out.strong.answer if out.strong is not None else None
    cascade = _cascade(
        policy,
        item,
        replay(
            policy,
            item,
            out,
            strong_down=strong_down,
            canned_strong=canned_strong,
            previewer=previewer,
            reference=reference,
        ),
    )
    for qid, question in call.questions.items():
        cheap_result = cheap.results.get(qid) if cheap is not None else None
        strong_result = strong.results.get(qid) if strong is not None else None
        gated = gate_view(policy, cheap_result) if cheap_result is not None else None
        yield ItemRow(
            id=item.id,
            question=qid,
            type=question.type,
            band=option_band(n_options(question)),
            gold=item.gold.get(qid),
            gold_index=label_index(question, item.gold[qid]) if qid in item.gold else None,
            cheap=_out(question, _returned(policy, qid, cheap_result), gated),
            strong=_out(question, strong_result, strong_result),
            cascade=cascade.get(qid) if cascade else None,
            tokens={
                slot: a.usage.input_tokens / len(a.results)
                for slot, a in (("cheap", cheap), ("strong", strong))
                if a is not None and a.results
            }
            | _order_tokens(cascade, qid, out),
            checkpoint=checkpoint_of(policy, out.preview),
            source=item.source,
        )


def _order_tokens(
    cascade: dict[str, CascadeOut] | None, qid: str, out: Outputs
) -> dict[str, float]:
    """``{"orders": tokens}``: the option-order check's rows of ``qid`` (each row its share of
    the reordered run's tokens); empty when it was not checked."""
    checked = cascade.get(qid) if cascade else None
    run = out.orders.answer if out.orders is not None else None
    if checked is None or not checked.order_rows or run is None or not run.results:
        return {}
    return {"orders": checked.order_rows * run.usage.input_tokens / len(run.results)}


def _returned(policy: Policy, qid: str, result: QuestionResult | None) -> QuestionResult | None:
    if result is None:
        return None
    return returned_results(policy, {qid: result}, {qid: policy.route.cheap or ""})[qid]


def _out(
    question: Question, result: QuestionResult | None, gated: QuestionResult | None
) -> TierOut | None:
    if result is None or gated is None:
        return None
    return TierOut(
        answer=answer_label(question, result.probabilities),
        probabilities=result.probabilities,
        confidence=max(gated.probabilities),
        vector=result.vector,
    )


def replay(
    policy: Policy,
    item: Item,
    out: Outputs,
    *,
    strong_down: bool = False,
    canned_strong: bool = False,
    previewer: Previewing | None = None,
    reference: ReferenceSet | None = None,
) -> Decision | None:
    """The gateway's decision on ``item``, or None where it would refuse the request.

    Tier calls are answered from ``out`` (a question the tier refused refuses the call, as the
    tier itself would; a tier with no output failed), and the strong tier's with a failure when
    ``strong_down`` (``canned_strong``: with a ``canned.certain`` answer). Previews before any
    tier ran are ``out.preview`` (what the runner previewed for pre-routing); the cheap tier
    standing in for the strong one previews with ``previewer`` (the cheap engine; without one,
    ``out.preview`` again), as the gateway does.
    """
    strong = policy.route.strong
    asked: list[Ask] = []  # the tier calls so far

    def reply(ask: Ask) -> Reply:
        if isinstance(ask, Preview):
            found = (
                previewer.preview(ask.call, checkpoint=ask.checkpoint)
                if (asked and previewer is not None)
                else out.preview
            )
            if found is None:
                raise EngineFailed(out.error or "no preview of this item")
            return found
        asked.append(ask)
        if strong_down and ask.tier == strong:
            return Failure(EngineUnavailable(f"the strong tier `{strong}` is down"))
        if canned_strong and ask.tier == strong:
            return certain(ask.call, strong)
        qids = list(ask.call.questions)
        if ask.tier == policy.route.cheap and all(MARK in q for q in qids):
            return _answer(out.orders, qids, out.error)  # the option-order check's rows
        return _answer(out.cheap if ask.tier == policy.route.cheap else out.strong, qids, out.error)

    previews = previewer is not None or out.preview is not None
    try:
        return run(decide(policy, item.call, previews=previews, reference=reference), reply)
    except CascadeError:
        return None


def _answer(tier_run: TierRun | None, qids: list[str], error: str | None) -> Reply:
    """A cached tier run as the tier's answer to a call of ``qids``."""
    refused = [q for q in qids if tier_run is not None and q in tier_run.refused]
    if refused and tier_run is not None:
        return Failure(ClientError(tier_run.refused[refused[0]]))
    if tier_run is None or tier_run.answer is None:
        return Failure(EngineFailed(error or "the tier has no output for this item"))
    answer = tier_run.answer
    return msgspec.structs.replace(
        answer, results={q: answer.results[q] for q in qids if q in answer.results}
    )


def _cascade(policy: Policy, item: Item, decision: Decision | None) -> dict[str, CascadeOut] | None:
    """Each question's cascade answer, or None when the gateway would refuse the request."""
    if decision is None:
        return None
    cheap, strong = policy.route.cheap, policy.route.strong
    return {
        qid: CascadeOut(
            answer=answer_label(item.call.questions[qid], decision.results[qid].probabilities),
            tier="cheap" if route.tier == cheap else "strong",
            reason=route.reason,
            pre_routed=decision.pre.questions[qid].tier == strong,
            degraded=qid in decision.degraded,
            gate=_verdict(decision, qid),
            order_rows=check.rows if (check := decision.orders.get(qid)) else 0,
            order_stable=check.stable if check else None,
            novelty=decision.novelty.get(qid),
        )
        for qid, route in decision.routes.items()
    }


def _verdict(decision: Decision, qid: str) -> str | None:
    read = decision.gate.get(qid)
    return None if read is None else read.verdict or "kept"


def reaches_gate(row: ItemRow) -> bool:
    """The confidence gate read its cheap answer (``Decision.gate``: the cascade pre-routed it
    cheap, the cheap tier answered, and no truncation or option collapse escalated it)."""
    return row.cascade is not None and row.cascade.gate is not None


def gate_escalated(row: ItemRow) -> bool:
    """The confidence gate escalated it on its own confidence or margin."""
    return row.cascade is not None and row.cascade.gate in CONFIDENCE_REASONS


def cascade_probabilities(row: ItemRow) -> list[float] | None:
    """The probabilities the cascade returned for ``row`` (its tier's)."""
    if row.cascade is None:
        return None
    chosen = row.cheap if row.cascade.tier == "cheap" else row.strong
    return chosen.probabilities if chosen is not None else None
