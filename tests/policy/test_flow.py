"""The cascade as one sans-IO procedure: what it asks for, in what order, and what it decides
when a tier fails, driven by canned replies (no event loop, no engine)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.errors import CascadeError, EngineUnavailable, PayloadTooLarge, ValidationFailed
from cascade.policy import flow as flow_module
from cascade.policy.flow import Ask, Decision, Failure, Preview, Reply, TierCall, decide, run
from cascade.policy.model import Shadow
from cascade.schema import ChoiceQuestion, Question
from tests.policy.test_routing import IMAGE, POLICY, QUESTIONS, call, preview, row

WIDE: dict[str, Question] = {
    **QUESTIONS,
    "big": ChoiceQuestion(criteria=[f"o{i}" for i in range(60)]),
}  # 60 options > 48: pre-routed strong


def answered(tier: str, c: EngineCall, low: frozenset[str] = frozenset()) -> EngineAnswer:
    """Every question of ``c``: confident, except ``low`` (a coin flip)."""
    results = {}
    for qid, q in c.questions.items():
        n = {"noul": 2}.get(q.type) or len(q.criteria)  # type: ignore[union-attr]
        p = [1 / n] * n if qid in low else [0.9, *[0.1 / (n - 1)] * (n - 1)]
        results[qid] = QuestionResult(type=q.type, probabilities=p)
    return EngineAnswer(
        model=f"{tier}-model", results=results, usage=EngineUsage(input_tokens=len(c.questions))
    )


def tiers(
    *, strong: Callable[[EngineCall], Reply] | None = None, low: frozenset[str] = frozenset()
) -> tuple[list[Ask], Callable[[Ask], Reply]]:
    """A log of asks, and replies: previews that read the text, a cheap tier answering (``low``
    unsure), and the strong tier answering or ``strong``'s reply."""
    asked: list[Ask] = []

    def reply(ask: Ask) -> Reply:
        asked.append(ask)
        if isinstance(ask, Preview):
            return preview(
                {q: row(60 if q == "big" else 3) for q in ask.call.questions},
                checkpoint=ask.checkpoint or "english",
            )
        if ask.tier == "clef" and strong is not None:
            return strong(ask.call)
        return answered(ask.tier, ask.call, low)

    return asked, reply


def shape(asked: list[Ask]) -> list[tuple[str, list[str]]]:
    return [
        ("preview" if isinstance(a, Preview) else a.tier, list(a.call.questions)) for a in asked
    ]


def test_one_cheap_call_then_one_strong_call_for_pre_routed_and_escalated() -> None:
    asked, reply = tiers(low=frozenset({"urgent"}))
    decision = run(decide(POLICY, call(questions=WIDE), previews=True), reply)
    assert shape(asked) == [
        ("preview", ["intent", "urgent", "mood"]),
        ("laya", ["intent", "urgent", "mood"]),
        ("clef", ["urgent", "big"]),
    ]
    assert isinstance(decision, Decision)
    assert decision.tiers == {"intent": "laya", "urgent": "clef", "mood": "laya", "big": "clef"}
    assert {q: r.reason for q, r in decision.routes.items() if r.reason} == {
        "urgent": "low_confidence",
        "big": "too_many_options",
    }
    assert decision.escalated == {"urgent": "low_confidence"} and decision.degraded == {}
    assert decision.model == "laya-model+clef-model" and decision.usage.input_tokens == 5
    assert list(decision.results) == ["intent", "urgent", "mood", "big"]
    assert decision.shadow is None


def test_a_failed_strong_tier_degrades_as_a_value_not_an_exception() -> None:
    asked, reply = tiers(
        low=frozenset({"urgent"}), strong=lambda c: Failure(EngineUnavailable("clef is down"))
    )
    decision = run(decide(POLICY, call(questions=WIDE), previews=True), reply)
    # the cheap tier stands in for the question it had not run: previewed, then answered
    assert shape(asked)[2:] == [
        ("clef", ["urgent", "big"]),
        ("preview", ["big"]),
        ("laya", ["big"]),
    ]
    assert decision.tiers == dict.fromkeys(WIDE, "laya")
    assert decision.degraded == {"urgent": "strong_failed", "big": "strong_failed"}
    assert {q: r.reason for q, r in decision.routes.items() if r.reason} == {
        "urgent": "low_confidence",
        "big": "too_many_options",
    }
    assert set(decision.answers["laya"].results) == set(WIDE)
    assert decision.model == "laya-model"


@pytest.mark.parametrize(
    ("failure", "raised"),
    [
        (EngineUnavailable("clef is down", retry_after=2.0), EngineUnavailable),
        (PayloadTooLarge("the image is too large"), PayloadTooLarge),
    ],
)
def test_what_only_the_strong_tier_can_serve_ends_the_flow_with_the_clients_error(
    failure: CascadeError, raised: type[CascadeError]
) -> None:
    asked, reply = tiers(strong=lambda c: Failure(failure))
    with pytest.raises(raised) as info:
        run(decide(POLICY, call(images=[IMAGE]), previews=True), reply)
    assert shape(asked) == [("clef", list(QUESTIONS))]  # images: no preview, no cheap call
    if raised is EngineUnavailable:  # a 503 keeps the tier's Retry-After
        assert "needs it (images)" in info.value.message and info.value.retry_after == 2.0
    else:  # the strong tier's own 4xx on the client's content stands
        assert info.value is failure


def test_a_failed_cheap_tier_hands_its_questions_to_the_strong_tier() -> None:
    asked: list[Ask] = []

    def reply(ask: Ask) -> Reply:
        asked.append(ask)
        assert isinstance(ask, TierCall)
        if ask.tier == "laya":
            return Failure(EngineUnavailable("laya is down"))
        return answered(ask.tier, ask.call)

    decision = run(decide(POLICY, call(), previews=False), reply)
    assert [a.tier for a in asked if isinstance(a, TierCall)] == ["laya", "clef"]
    assert {r.reason for r in decision.routes.values()} == {"cheap_failed"}
    assert decision.tiers == dict.fromkeys(QUESTIONS, "clef") and decision.shadow is None


def test_the_flow_does_no_io_and_reads_no_clock() -> None:
    tree = ast.parse(Path(flow_module.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported.isdisjoint({"asyncio", "time", "os", "socket", "random", "threading"})
    assert not any(isinstance(node, ast.AsyncFunctionDef | ast.Await) for node in ast.walk(tree))


def test_shadow_choice_is_part_of_the_decision() -> None:
    sampled = msgspec.structs.replace(POLICY, shadow=Shadow(fraction=1.0))
    _, reply = tiers()
    decision = run(decide(sampled, call(), previews=True, shadow_key="r1"), reply)
    assert decision.shadow is not None and decision.shadow.tier == "clef"
    assert decision.shadow.call.questions == call().questions  # the whole request, mirrored
    assert decision.shadow.cheap is decision.answers["laya"]
    _, reply = tiers(low=frozenset({"urgent"}))  # an escalation: nothing left to compare
    assert run(decide(sampled, call(), previews=True, shadow_key="r1"), reply).shadow is None
    unsampled = msgspec.structs.replace(POLICY, shadow=Shadow(fraction=0.0))
    assert run(decide(unsampled, call(), previews=True), tiers()[1]).shadow is None


def test_partial_refuses_only_what_the_downed_strong_tier_alone_reads() -> None:
    """``mood``'s row would drop state tokens (only the strong tier reads it whole); ``big``
    has too many options for the policy but the cheap tier can stand in."""

    def reply(ask: Ask) -> Reply:
        if isinstance(ask, Preview):
            return preview(
                {
                    q: row(60 if q == "big" else 3, dropped=8 if q == "mood" else 0)
                    for q in ask.call.questions
                },
                checkpoint=ask.checkpoint or "english",
            )
        if ask.tier == "clef":
            return Failure(EngineUnavailable("clef is down", retry_after=2.0))
        return answered(ask.tier, ask.call)

    with pytest.raises(EngineUnavailable) as info:  # System One: the whole request fails
        run(decide(POLICY, call(questions=WIDE), previews=True), reply)
    assert "needs it (state_too_long)" in info.value.message
    decision = run(decide(POLICY, call(questions=WIDE), previews=True, partial=True), reply)
    assert list(decision.refused) == ["mood"]
    assert decision.refused["mood"].message == info.value.message
    assert decision.refused["mood"].retry_after == 2.0
    assert list(decision.results) == ["intent", "urgent", "big"]
    assert decision.tiers == {"intent": "laya", "urgent": "laya", "big": "laya"}
    assert decision.degraded == {"big": "strong_failed"}
    # Every question refused: the flow ends with System One's error.
    only = {"mood": WIDE["mood"]}
    with pytest.raises(EngineUnavailable) as every:
        run(decide(POLICY, call(questions=only), previews=True, partial=True), reply)
    assert every.value.message == info.value.message


def test_partial_refuses_the_question_the_standing_in_cheap_tier_names() -> None:
    """The cheap tier refuses a stand-in call naming ``huge`` (as Laya names a question whose
    options do not fit its head): ``huge`` is refused, ``big`` asked again and answered."""
    questions = {**WIDE, "huge": ChoiceQuestion(criteria=[f"o{i}" for i in range(70)])}
    asked: list[Ask] = []

    def reply(ask: Ask) -> Reply:
        asked.append(ask)
        assert isinstance(ask, TierCall)
        if ask.tier == "clef":
            return Failure(EngineUnavailable("clef is down"))
        if "huge" in ask.call.questions:
            return Failure(ValidationFailed.at(["questions", "huge"], "options do not fit"))
        return answered(ask.tier, ask.call)

    with pytest.raises(EngineUnavailable, match="cannot stand in"):
        run(decide(POLICY, call(questions=questions), previews=False), reply)
    asked.clear()
    decision = run(decide(POLICY, call(questions=questions), previews=False, partial=True), reply)
    assert shape(asked)[2:] == [("laya", ["big", "huge"]), ("laya", ["big"])]
    assert list(decision.refused) == ["huge"]
    assert "cannot stand in (options do not fit)" in decision.refused["huge"].message
    assert decision.tiers == dict.fromkeys(WIDE, "laya")
    assert decision.degraded == {"big": "strong_failed"}


def test_a_cheap_answer_missing_a_question_is_the_cheap_tier_failing() -> None:
    asked, good = tiers()

    def reply(ask: Ask) -> Reply:
        answer = good(ask)
        if isinstance(ask, TierCall) and ask.tier == "laya" and isinstance(answer, EngineAnswer):
            return msgspec.structs.replace(
                answer, results={q: r for q, r in answer.results.items() if q != "urgent"}
            )
        return answer

    decision = run(decide(POLICY, call(), previews=True), reply)
    assert decision.tiers == dict.fromkeys(QUESTIONS, "clef")
    assert decision.escalated == dict.fromkeys(QUESTIONS, "cheap_failed")
    assert decision.gate == {} and "laya" not in decision.answers


def test_a_strong_answer_of_another_type_is_the_strong_tier_failing() -> None:
    def wrong(c: EngineCall) -> Reply:
        return EngineAnswer(
            model="clef-model",
            usage=EngineUsage(input_tokens=1),
            results={q: QuestionResult(type="noul", probabilities=[0.5, 0.5]) for q in c.questions},
        )

    _, reply = tiers(low=frozenset({"intent"}), strong=wrong)
    decision = run(decide(POLICY, call(), previews=True), reply)
    assert decision.tiers == dict.fromkeys(QUESTIONS, "laya")
    assert decision.degraded == {"intent": "strong_failed"}


def test_the_decision_says_which_answers_reached_the_gate_and_what_it_read() -> None:
    _, reply = tiers(
        low=frozenset({"urgent"}), strong=lambda c: Failure(EngineUnavailable("clef is down"))
    )
    decision = run(decide(POLICY, call(questions=WIDE), previews=True), reply)
    # "big" was pre-routed (never read); "urgent" was read, escalated, then degraded: still read
    assert list(decision.gate) == ["intent", "urgent", "mood"]
    urgent = decision.gate["urgent"]
    assert (urgent.cell, urgent.verdict) == (("noul", "2"), "low_confidence")
    assert urgent.confidence == 0.5 and decision.gate["intent"].verdict is None


def test_a_stand_in_adds_to_the_cheap_tiers_answer_and_its_tokens() -> None:
    _, reply = tiers(strong=lambda c: Failure(EngineUnavailable("clef is down")))
    decision = run(decide(POLICY, call(questions=WIDE), previews=True), reply)
    cheap = decision.answers["laya"]
    assert set(cheap.results) == set(WIDE)
    assert cheap.usage.input_tokens == decision.usage.input_tokens == 4  # 3 + the stand-in's 1
