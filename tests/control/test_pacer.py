"""The pacer against scripted load on a fake clock: the mix changes between two phases, the
budget binds and holds the 5-minute share, then load falls and the gate relaxes to the
configured thresholds; the strong tier's predicted wait tightens and relaxes it the same way."""

from __future__ import annotations

import msgspec

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.control.live import LiveControl
from cascade.control.pacer import Pacer
from cascade.policy.flow import decide, run
from cascade.policy.model import Models
from tests.control.load import CONFIGURED, KINDS, Clock, max_window_share, policy, replay

BUDGET = 0.25
HARD = {"wide": (0.10, 0.5, 0.5), "choice": (0.60, 0.5, 1.0), "noul": (0.30, 0.5, 1.0)}
MIXED = {"wide": (0.02, 0.5, 0.5), "noul": (0.50, 0.5, 1.0), "choice": (0.48, 0.5, 1.0)}
EASY = {"wide": (0.02, 0.5, 0.5), "noul": (0.68, 0.75, 1.0), "choice": (0.30, 0.7, 1.0)}


def test_the_budget_holds_over_every_five_minutes_through_a_mix_change_then_relaxes() -> None:
    clock = Clock()
    control = LiveControl(policy(max_strong_share=BUDGET), clock=clock)
    # unpaced, HARD sends 10 % + 60 % x 60 % + 30 % x 40 % = 58 % strong, MIXED 2 % + 38 %
    events = replay(control, clock, [(600, 10, HARD), (600, 20, MIXED)])
    binding = control.gate()
    assert binding.live("choice", "2") < 0.8 and binding.live("noul", "2") < 0.7
    assert control.strong_share <= BUDGET + 0.02
    events += replay(control, clock, [(600, 4, EASY)], seed=1)  # load falls: 2 % + ~12 %
    worst = max_window_share(events)
    print(f"max 5-minute strong share {worst:.4f} for a budget of {BUDGET}")
    assert worst <= BUDGET + 0.02
    assert control.gate().confidence == CONFIGURED and control.gate().budget.choice.two is None
    assert control.gate().live("choice", "2") == 0.8 and control.gate().live("noul", "2") == 0.7
    assert control.thresholds()[("choice", "2")] == 0.8


def test_only_the_least_confident_escalate_when_it_binds() -> None:
    clock = Clock()
    control = LiveControl(policy(max_strong_share=BUDGET), clock=clock)
    events = replay(control, clock, [(400, 10, {"choice": (1.0, 0.5, 1.0)})])
    cut = control.gate().live("choice", "2")
    assert cut is not None and 0.55 < cut < 0.7  # ~25 % of U(0.5, 1) under the cut
    late = [strong for t, strong in events if t > 330]
    assert abs(sum(late) / len(late) - BUDGET) < 0.03


def test_capacity_tightens_on_a_long_predicted_wait_and_relaxes_when_it_clears() -> None:
    clock = Clock()
    wait = {"s": 0.0}

    class Strong:
        def expected_wait(self) -> float:
            return wait["s"]

    control = LiveControl(policy(), {"clef": Strong()}, clock=clock, deadline_s=8.0)
    mix = {"choice": (1.0, 0.5, 1.0)}
    replay(control, clock, [(60, 10, mix)])
    assert control.gate().live("choice", "2") == 0.8  # no budget, no pressure: configured
    wait["s"] = 6.0  # 75 % of the admission deadline
    events = replay(control, clock, [(30, 10, mix)], seed=2)
    tight = control.gate().live("choice", "2")
    assert tight is not None and tight < 0.7
    assert control.status()["capacity_binds"] is True
    late = [s for t, s in events if t > clock.now - 10]
    assert sum(late) / len(late) < 0.3  # unpaced: 60 %
    wait["s"] = 0.5
    replay(control, clock, [(120, 10, mix)], seed=3)
    assert control.gate().live("choice", "2") == 0.8


def test_overload_counts_like_a_long_wait_and_protected_cells_are_never_cut() -> None:
    pacer = Pacer(budget=None, window_s=300.0)
    now = 0.0
    for i in range(600):
        now = i * 0.1
        pacer.record(
            now,
            answered=1,
            strong=int(i % 2 == 0),
            forced=0,
            gated=[(("choice", "2"), 0.5 + (i % 50) / 100)],
        )
    assert pacer.pace(now, {("choice", "2"): 0.8}).cuts == {}
    pacer.overloaded(now)
    assert ("choice", "2") in pacer.pace(now, {("choice", "2"): 0.8}).cuts
    pacer.overloaded(now + 3)
    held = pacer.pace(now + 3, {("choice", "2"): 0.8}, protected={("choice", "2")})
    assert held.cuts == {} and held.conflict and held.capped


def test_answers_of_a_cheap_only_model_are_not_gated_traffic() -> None:
    cheap_only = policy(max_strong_share=BUDGET)
    cheap_only = msgspec.structs.replace(cheap_only, models=Models(cheap_only=["laya"]))
    control = LiveControl(cheap_only, clock=Clock())
    call = EngineCall(state="s", model="laya", questions={"q": KINDS["choice"]})

    def reply(ask: object) -> EngineAnswer:
        return EngineAnswer(
            model="laya",
            usage=EngineUsage(input_tokens=1),
            results={"q": QuestionResult(type="choice", probabilities=[0.5, 0.5])},
        )

    control.decided(call, run(decide(cheap_only, call, previews=False, gate=control.gate()), reply))
    assert control.pacer is not None
    (only,) = control.pacer._bins
    assert (only.answered, only.strong, only.gated) == (1, 0, 0)
