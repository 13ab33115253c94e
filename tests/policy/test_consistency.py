"""The option-order check: narrow keeps asked again in other orders, escalated when the winner
moves, bounded in rows, cut by the budget like a low confidence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.errors import EngineUnavailable
from cascade.policy.consistency import OrderCheck, order_id, orders
from cascade.policy.files import PolicyError, load_policy
from cascade.policy.flow import Ask, Decision, Failure, Reply, TierCall, decide, run
from cascade.policy.model import Consistency, LayaTier
from cascade.policy.routing import Gate
from cascade.schema import ChoiceQuestion, Question, ScoreQuestion
from tests.policy.test_routing import POLICY, call

CHECKED = msgspec.structs.replace(POLICY, consistency=Consistency(margin=0.1, orders=2))
NARROW = [0.65, 0.3, 0.05]  # clears choice 3-5's 0.6 by 0.05 (and its 0.2 top-two margin)


def by_slot(q: Question) -> list[float]:
    """A tier that favours the first slot shown, whatever option sits there."""
    n = len(q.criteria)  # type: ignore[union-attr]
    shown = q.option_order or list(range(n))
    slots = NARROW if n == 3 else [0.9, *[0.1 / (n - 1)] * (n - 1)]
    out = [0.0] * n
    for s, option in enumerate(shown):
        out[option] = slots[s]
    return out


def by_content(q: Question) -> list[float]:
    """A tier that favours option 0 wherever it is shown."""
    n = len(q.criteria)  # type: ignore[union-attr]
    return NARROW if n == 3 else [0.9, *[0.1 / (n - 1)] * (n - 1)]


def tier(
    answer: Callable[[Question], list[float]], *, fail_again: bool = False
) -> tuple[list[EngineCall], Callable[[Ask], Reply]]:
    calls: list[EngineCall] = []

    def reply(ask: Ask) -> Reply:
        assert isinstance(ask, TierCall)
        calls.append(ask.call)
        if fail_again and len(calls) == 2:
            return Failure(EngineUnavailable("laya is busy"))
        return EngineAnswer(
            model=ask.tier,
            usage=EngineUsage(input_tokens=len(ask.call.questions)),
            results={
                q: QuestionResult(type=v.type, probabilities=answer(v))
                for q, v in ask.call.questions.items()
            },
        )

    return calls, reply


def intent(**kw: object) -> dict[str, Question]:
    return {"intent": ChoiceQuestion(criteria=["billing", "tech", "account"], **kw)}  # type: ignore[arg-type]


def test_orders_are_reversed_then_seeded_shuffles_distinct_and_never_the_identity() -> None:
    five = orders(5, 4, seed=7)
    assert five[0] == [4, 3, 2, 1, 0] and len(five) == 4
    assert len({tuple(o) for o in five}) == 4 and [0, 1, 2, 3, 4] not in five
    assert orders(5, 4, seed=7) == five and orders(5, 4, seed=8) != five
    assert orders(2, 3, seed=0) == [[1, 0]]  # two options have one other order


def test_a_winner_that_moves_under_reordering_escalates_order_unstable() -> None:
    calls, reply = tier(by_slot)
    decision = run(decide(CHECKED, call(questions=intent()), previews=False), reply)
    assert isinstance(decision, Decision)
    assert list(calls[1].questions) == [order_id("intent", 1), order_id("intent", 2)]
    assert calls[1].questions[order_id("intent", 1)].option_order == [2, 1, 0]
    assert decision.escalated == {"intent": "order_unstable"}
    assert decision.routes["intent"].tier == "clef"
    assert decision.orders == {"intent": OrderCheck(rows=2, stable=False)}
    assert decision.usage.input_tokens == 1 + 2 + 1  # the extra rows are paid for


def test_a_stable_winner_stays_cheap_and_is_recorded_stable() -> None:
    calls, reply = tier(by_content)
    decision = run(decide(CHECKED, call(questions=intent()), previews=False), reply)
    assert len(calls) == 2 and decision.escalated == {}
    assert decision.tiers == {"intent": "laya"}
    assert decision.orders == {"intent": OrderCheck(rows=2, stable=True)}


def test_off_or_a_wide_clearance_asks_nothing_more() -> None:
    for policy in (POLICY, msgspec.structs.replace(CHECKED, consistency=Consistency(margin=0.01))):
        calls, reply = tier(by_slot)
        decision = run(decide(policy, call(questions=intent()), previews=False), reply)
        assert len(calls) == 1 and decision.escalated == {} and decision.orders == {}


def test_the_clients_own_order_is_composed_with_the_check() -> None:
    calls, reply = tier(by_slot)
    run(decide(CHECKED, call(questions=intent(option_order=[1, 2, 0])), previews=False), reply)
    assert calls[1].questions[order_id("intent", 1)].option_order == [0, 2, 1]


def test_the_budget_cuts_order_unstable_like_low_confidence() -> None:
    calls, reply = tier(by_slot)
    gate = Gate.of(CHECKED, escalate=False)
    decision = run(decide(CHECKED, call(questions=intent()), previews=False, gate=gate), reply)
    assert decision.escalated == {} and decision.routes["intent"].reason == "budget"
    assert decision.tiers == {"intent": "laya"}


def test_a_failed_extra_call_checks_nothing() -> None:
    calls, reply = tier(by_slot, fail_again=True)
    decision = run(decide(CHECKED, call(questions=intent()), previews=False), reply)
    assert len(calls) == 2 and decision.escalated == {} and decision.orders == {}


def test_255_options_never_add_more_rows_than_the_bounds() -> None:
    laya = msgspec.structs.replace(POLICY.tiers["laya"], max_batch_size=3)
    assert isinstance(laya, LayaTier)
    wide: dict[str, Question] = {
        f"s{i}": ScoreQuestion(criteria=[f"l{j}" for j in range(255)]) for i in range(3)
    }
    for max_rows, want in ((2, 2), (8, 3)):  # max_extra_rows binds, then the tier's batch
        policy = msgspec.structs.replace(
            POLICY,
            tiers={**POLICY.tiers, "laya": laya},
            consistency=Consistency(margin=1.0, orders=5, max_extra_rows=max_rows),
        )
        calls, reply = tier(by_content)
        decision = run(decide(policy, call(questions=wide), previews=False), reply)
        assert len(calls[1].questions) == want
        assert sum(c.rows for c in decision.orders.values()) == want


def test_request_escalation_takes_the_other_cheap_questions_along() -> None:
    policy = msgspec.structs.replace(
        CHECKED, route=msgspec.structs.replace(CHECKED.route, escalate="request")
    )
    questions = {**intent(), "mood": ScoreQuestion(criteria=["calm", "angry"])}
    calls, reply = tier(by_slot)
    decision = run(decide(policy, call(questions=questions), previews=False), reply)
    assert decision.escalated == {"intent": "order_unstable", "mood": "whole_request"}


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("[consistency]\norders = 0", "consistency.orders"),
        ("[consistency]\nmax_extra_rows = 0", "consistency.max_extra_rows"),
        ("[consistency]\nmargin = 1.5", "consistency.margin"),
        ("[novelty]\nmax_reference = 50000", "novelty.max_reference"),
        ("[novelty]\nmax_flag_rate = 0", "novelty.max_flag_rate"),
    ],
)
def test_policy_files_reject_out_of_bounds_signal_settings(
    tmp_path: Path, table: str, key: str
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(Path("policies/default.toml").read_text() + "\n" + table + "\n")
    with pytest.raises(PolicyError, match=key):
        load_policy(path)
