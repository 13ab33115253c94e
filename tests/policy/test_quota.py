"""A tenant's strong quota in the sans-IO flow: every strong answer is taken from it, the
questions with no cheap answer first; escalations over it stay cheap (``budget``), pre-routed
questions over it are stood in for by the cheap tier (``strong_quota``) or refused with 429."""

from __future__ import annotations

import msgspec
import pytest

from cascade.errors import TenantLimited
from cascade.policy.flow import decide, run
from cascade.policy.model import Degrade
from cascade.policy.quota import StrongQuota
from cascade.policy.routing import QuestionRoute
from tests.policy.test_flow import WIDE, shape, tiers
from tests.policy.test_routing import IMAGE, POLICY, call


def quota(left: int) -> StrongQuota:
    return StrongQuota("acme", 5, left, retry_after_s=12.0)


def test_within_the_quota_every_strong_question_is_answered_strong_and_taken() -> None:
    asked, reply = tiers(low=frozenset({"urgent"}))
    left = quota(3)
    decision = run(decide(POLICY, call(questions=WIDE), previews=True, quota=left), reply)
    assert shape(asked)[-1] == ("clef", ["urgent", "big"])
    assert decision.tiers["urgent"] == decision.tiers["big"] == "clef" and left.left == 1


def test_pre_routed_questions_go_first_and_escalations_over_the_quota_stay_cheap() -> None:
    asked, reply = tiers(low=frozenset({"urgent"}))
    left = quota(1)
    decision = run(decide(POLICY, call(questions=WIDE), previews=True, quota=left), reply)
    assert shape(asked)[-1] == ("clef", ["big"])
    assert decision.routes["urgent"] == QuestionRoute("laya", "budget")
    assert decision.escalated == {} and decision.degraded == {} and left.left == 0


def test_over_the_quota_a_pre_routed_question_is_stood_in_for_and_flagged() -> None:
    asked, reply = tiers(low=frozenset({"urgent"}))
    decision = run(decide(POLICY, call(questions=WIDE), previews=True, quota=quota(0)), reply)
    assert "clef" not in [tier for tier, _ in shape(asked)]
    assert decision.tiers["big"] == "laya" and decision.degraded == {"big": "strong_quota"}
    assert decision.routes["urgent"] == QuestionRoute("laya", "budget")


@pytest.mark.parametrize("case", ["strong_only_model", "image", "no_stand_in"])
def test_over_the_quota_what_only_the_strong_tier_may_answer_is_429(case: str) -> None:
    policy, asked = POLICY, call(questions=WIDE)
    if case == "strong_only_model":
        asked = call("clef-flash")
    elif case == "image":
        asked = call(images=[IMAGE])
    else:
        policy = msgspec.structs.replace(POLICY, degrade=Degrade(cheap_answers=False))
    log, reply = tiers()
    left = quota(0)
    with pytest.raises(TenantLimited, match="strong_questions_per_min") as refused:
        run(decide(policy, asked, previews=True, quota=left, partial=True), reply)
    assert refused.value.retry_after == 12.0
    assert "clef" not in [tier for tier, _ in shape(log)] and left.left == 0


def test_a_request_whose_pre_routed_questions_do_not_all_fit_takes_nothing() -> None:
    two = {"a": WIDE["big"], "b": WIDE["big"]}
    left = quota(1)
    with pytest.raises(TenantLimited):
        run(
            decide(
                msgspec.structs.replace(POLICY, degrade=Degrade(cheap_answers=False)),
                call(questions=two),
                previews=True,
                quota=left,
            ),
            tiers()[1],
        )
    assert left.left == 1  # given back
