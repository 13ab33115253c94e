"""The gateway with fake tiers and a [control] budget: reasons show ``budget``, the metrics move,
``Gateway.decide(escalate=False)`` keeps confidence escalations cheap, and shadow answers teach
the refit when the policy lets them."""

from __future__ import annotations

import asyncio

import msgspec

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http.gauges import registry_of
from cascade.policy.model import Shadow
from cascade.schema import ChoiceQuestion
from tests.control.load import Clock, policy

YES_NO = ChoiceQuestion(criteria=["yes", "no"])


def unsure(call: EngineCall) -> EngineAnswer:
    """max p from the state (a number in [0.5, 1]): the confidence the test asks for."""
    c = float(str(call.state))
    return EngineAnswer(
        model="laya-fake",
        usage=EngineUsage(input_tokens=1),
        results={
            q: QuestionResult(type="choice", probabilities=[c, 1 - c]) for q in call.questions
        },
    )


def ask(gateway: Gateway, confidence: float, **kw: object):  # type: ignore[no-untyped-def]
    call = EngineCall(state=str(confidence), model="jev-latest", questions={"q": YES_NO})
    return gateway.decide(call, **kw)  # type: ignore[arg-type]


def test_a_binding_budget_flags_answers_budget_and_moves_the_metrics() -> None:
    clock = Clock()
    gateway = Gateway(
        policy(max_strong_share=0.2),
        {"laya": FakeEngine("laya", unsure), "clef": FakeEngine("clef")},
        clock=clock,
    )
    flagged = metrics.BUDGET_FLAGGED.labels(type="choice")
    escalations = metrics.ESCALATIONS.labels(reason="budget", type="choice")
    before, before_esc = flagged._value.get(), escalations._value.get()

    async def run() -> list[dict[str, str]]:
        await gateway.start()
        reasons = []
        for i in range(600):  # 10 requests a second for a minute; 60 % under 0.8
            clock.now = i / 10
            outcome = await ask(gateway, 0.5 + (i * 7 % 50) / 100)
            reasons.append(outcome.response.x_cascade["reasons"])
        await gateway.aclose()
        return reasons

    reasons = asyncio.run(run())
    late = reasons[-200:]
    assert any(r == {"q": "budget"} for r in late)
    strong = sum(r == {"q": "low_confidence"} for r in late) / len(late)
    assert strong < 0.3  # unpaced: 60 %
    assert flagged._value.get() - before == sum(r == {"q": "budget"} for r in reasons)
    assert escalations._value.get() == before_esc  # never counted as escalations
    exported = registry_of(gateway)  # as its app's /metrics reads them
    assert exported.get_sample_value("cascade_strong_share") < 0.3
    cell = {"type": "choice", "band": "2"}
    assert exported.get_sample_value("cascade_gate_threshold", cell) < 0.75


def test_escalate_false_keeps_the_answer_cheap_without_a_control_table() -> None:
    plain = msgspec.structs.replace(policy(), control=None)
    clef = FakeEngine("clef")
    gateway = Gateway(plain, {"laya": FakeEngine("laya", unsure), "clef": clef})

    async def run() -> tuple[dict[str, str], dict[str, str]]:
        await gateway.start()
        kept = await ask(gateway, 0.55, escalate=False)
        sent = await ask(gateway, 0.55)
        await gateway.aclose()
        return kept.response.x_cascade["reasons"], sent.response.x_cascade["reasons"]

    kept, sent = asyncio.run(run())
    assert kept == {"q": "budget"} and sent == {"q": "low_confidence"}
    assert clef.calls == 1


def test_shadow_answers_teach_the_refit_with_a_strong_teacher() -> None:
    teach = msgspec.structs.replace(
        policy(target_accuracy=0.9, teacher="feedback+shadow", min_labels=5),
        shadow=Shadow(fraction=1.0, max_concurrent=64),
    )
    gateway = Gateway(teach, {"laya": FakeEngine("laya", unsure), "clef": FakeEngine("clef")})

    async def run() -> None:
        await gateway.start()
        for _ in range(10):
            await ask(gateway, 0.95)
        await gateway.shadows.settled()  # the shadow calls run in the background
        await gateway.aclose()

    asyncio.run(run())
    assert gateway.control.refit is not None
    assert gateway.control.refit.labels(("choice", "2")) == 10
