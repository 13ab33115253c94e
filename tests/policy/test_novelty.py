"""The novelty gate as a flow rule: rows unlike the reference escalate ``novel`` whatever their
confidence, the budget cuts them only when budgeted, and the boot check names both hashes."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np
import pytest

from cascade.calls import EngineAnswer, EngineUsage, QuestionResult
from cascade.novelty.reference import ReferenceSet, cell_of, fit
from cascade.policy.calibration import CalibrationMismatch
from cascade.policy.flow import Ask, Decision, Reply, TierCall, decide, run
from cascade.policy.model import Calibration, Novelty, Policy, Reference
from cascade.policy.novelty import check_reference
from cascade.policy.routing import Gate
from cascade.schema import ChoiceQuestion, NoulQuestion, Question
from tests.policy.test_routing import POLICY, call

RNG = np.random.default_rng(0)
CENTRE = RNG.standard_normal(24)


def vector(foreign: bool) -> bytes:
    """A row like the reference's (around CENTRE), or unlike it."""
    centre = -CENTRE if foreign else CENTRE
    return (centre + 0.1 * RNG.standard_normal(24)).astype("<f2").tobytes()


def reference() -> ReferenceSet:
    rows = [vector(False) for _ in range(200)]
    return fit(
        {cell_of("english", "noul", "2"): rows, cell_of("english", "choice", "3-5"): rows},
        weights="w-cheap",
        k=5,
        dims=8,
        max_reference=500,
        max_flag_rate=0.02,
        min_rows=30,
    )


def tier(unsure: frozenset[str] = frozenset()) -> Callable[[Ask], Reply]:
    """Confident answers (``unsure``: a coin flip); ids starting ``far`` read foreign rows."""

    def reply(ask: Ask) -> Reply:
        assert isinstance(ask, TierCall)
        results = {}
        for qid, q in ask.call.questions.items():
            n = 2 if q.type == "noul" else len(q.criteria)  # type: ignore[union-attr]
            p = [1 / n] * n if qid in unsure else [0.95, *[0.05 / (n - 1)] * (n - 1)]
            results[qid] = QuestionResult(
                type=q.type, probabilities=p, vector=vector(qid.startswith("far"))
            )
        return EngineAnswer(model=ask.tier, results=results, usage=EngineUsage(input_tokens=1))

    return reply


QUESTIONS: dict[str, Question] = {
    "near": NoulQuestion(),
    "far": NoulQuestion(),
    "far_team": ChoiceQuestion(criteria=["billing", "tech", "sales"]),
    "far_unsure": NoulQuestion(),
}


def decided(policy: Policy = POLICY, gate: Gate | None = None) -> Decision:
    return run(
        decide(policy, call(questions=QUESTIONS), previews=False, gate=gate, reference=reference()),
        tier(frozenset({"far_unsure"})),
    )


def test_foreign_rows_escalate_novel_whatever_their_confidence() -> None:
    decision = decided()
    assert decision.escalated == {
        "far": "novel",
        "far_team": "novel",
        "far_unsure": "low_confidence",
    }  # an earlier reason stands
    assert decision.tiers["near"] == "laya"
    assert decision.novelty["near"] <= 1 < decision.novelty["far"]
    assert decision.novelty["far_unsure"] > 1  # judged, and counted, all the same


def test_the_budget_cuts_novel_only_when_budgeted() -> None:
    closed = Gate.of(POLICY, escalate=False)  # the live budget keeps every escalation cheap
    # a low confidence the budget kept cheap goes novel too: the budget never cuts novelty
    assert decided(gate=closed).escalated == {
        "far": "novel",
        "far_team": "novel",
        "far_unsure": "novel",
    }
    budgeted = msgspec.structs.replace(POLICY, novelty=Novelty(budgeted=True))
    decision = decided(budgeted, gate=closed)
    assert decision.escalated == {} and decision.routes["far"].reason == "budget"


def test_off_without_a_reference_set_or_when_disabled() -> None:
    plain = run(decide(POLICY, call(questions=QUESTIONS), previews=False), tier())
    assert plain.escalated == {} and plain.novelty == {}
    off = decided(msgspec.structs.replace(POLICY, novelty=Novelty(enabled=False)))
    assert off.escalated == {"far_unsure": "low_confidence"} and off.novelty == {}


def test_a_reference_set_for_other_weights_is_refused_with_both_hashes() -> None:
    policy = msgspec.structs.replace(
        POLICY,
        calibration=Calibration(
            file="cal.toml", reference=Reference(file="cal.novelty.npz", sha256="x")
        ),
    )
    check_reference(policy, reference(), {"laya": "w-cheap"})  # its own weights: fine
    with pytest.raises(CalibrationMismatch) as info:
        check_reference(policy, reference(), {"laya": "w-other"})
    assert "w-cheap" in str(info.value) and "w-other" in str(info.value)
