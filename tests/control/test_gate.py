"""The live gate the flow is given: answers it keeps against its thresholds are cheap and
flagged ``budget`` (never escalations); ``escalate=False`` keeps every confidence escalation
cheap while pre-routed questions still go strong."""

from __future__ import annotations

import msgspec

from cascade.policy.flow import TierCall, decide, run
from cascade.policy.model import Bands, Shadow, TypeBands
from cascade.policy.routing import Gate
from tests.policy.test_flow import WIDE, shape, tiers
from tests.policy.test_routing import IMAGE, POLICY, QUESTIONS, call, with_

LOW = frozenset({"intent", "urgent"})  # coin flips: max p 1/3 (choice of 3) and 1/2 (noul)


def _cut(**cells: Bands) -> Gate:
    return msgspec.structs.replace(Gate.of(POLICY), budget=TypeBands(**cells))


def test_a_cut_under_the_confidence_keeps_it_cheap_flagged_budget() -> None:
    gate = _cut(noul=Bands(two=0.4), choice=Bands(three_five=0.2))  # 0.5 and 1/3 are kept
    asked, reply = tiers(low=LOW)
    decision = run(decide(POLICY, call(), previews=True, gate=gate), reply)
    assert not any(isinstance(a, TierCall) and a.tier == "clef" for a in asked)
    assert decision.tiers == dict.fromkeys(QUESTIONS, "laya")
    assert {q: r.reason for q, r in decision.routes.items() if r.reason} == {
        "intent": "budget",
        "urgent": "budget",
    }
    assert decision.escalated == {} and decision.degraded == {}


def test_a_cut_above_the_confidence_still_escalates() -> None:
    gate = _cut(noul=Bands(two=0.6), choice=Bands(three_five=0.2))  # 0.5 < 0.6 escalates
    asked, reply = tiers(low=LOW)
    decision = run(decide(POLICY, call(), previews=True, gate=gate), reply)
    assert shape(asked)[-1] == ("clef", ["urgent"])
    assert decision.escalated == {"urgent": "low_confidence"}
    assert decision.routes["intent"].reason == "budget" and decision.tiers["intent"] == "laya"
    assert gate.live("noul", "2") == 0.6 and gate.live("choice", "3-5") == 0.2
    assert gate.live("choice", "2") == 0.8 and gate.live("score", "2") is None


def test_without_a_gate_the_policy_thresholds_decide_as_before() -> None:
    for gate in (None, Gate.of(POLICY)):
        _, reply = tiers(low=LOW)
        decision = run(decide(POLICY, call(questions=WIDE), previews=True, gate=gate), reply)
        assert decision.escalated == {"intent": "low_confidence", "urgent": "low_confidence"}
        assert "budget" not in {r.reason for r in decision.routes.values()}


def test_escalate_false_keeps_every_gate_escalation_but_not_pre_routed_ones() -> None:
    gate = Gate.of(POLICY, escalate=False)
    asked, reply = tiers(low=LOW)
    decision = run(decide(POLICY, call(questions=WIDE), previews=True, gate=gate), reply)
    assert shape(asked)[-1] == ("clef", ["big"])  # too many options: still strong
    assert decision.tiers == {"intent": "laya", "urgent": "laya", "mood": "laya", "big": "clef"}
    assert {q: r.reason for q, r in decision.routes.items() if r.reason} == {
        "intent": "budget",
        "urgent": "budget",
        "big": "too_many_options",
    }
    assert decision.escalated == {}
    _, reply = tiers(low=LOW)
    images = run(decide(POLICY, call(images=[IMAGE]), previews=True, gate=gate), reply)
    assert images.tiers == dict.fromkeys(QUESTIONS, "clef")  # images go strong regardless


def test_a_whole_request_escalation_takes_the_flagged_answers_along() -> None:
    policy = with_(escalate="request")
    gate = msgspec.structs.replace(
        Gate.of(policy), budget=TypeBands(noul=Bands(two=0.6), choice=Bands(three_five=0.2))
    )
    _, reply = tiers(low=LOW)
    decision = run(decide(policy, call(), previews=True, gate=gate), reply)
    assert decision.escalated == {
        "intent": "whole_request",
        "urgent": "low_confidence",
        "mood": "whole_request",
    }
    _, reply = tiers(low=LOW)
    kept = run(decide(policy, call(), previews=True, gate=Gate.of(policy, escalate=False)), reply)
    assert kept.escalated == {} and kept.tiers == dict.fromkeys(QUESTIONS, "laya")


def test_a_request_kept_by_the_budget_can_still_be_shadowed() -> None:
    policy = msgspec.structs.replace(POLICY, shadow=Shadow(fraction=1.0))
    _, reply = tiers(low=LOW)
    decision = run(
        decide(policy, call(), previews=True, gate=Gate.of(policy, escalate=False)), reply
    )
    assert decision.shadow is not None and decision.shadow.tier == "clef"
