"""The gateway driver with fake tiers: breaker accounting, degradation edges, start-up failure."""

from __future__ import annotations

import asyncio

import pytest

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.errors import EngineUnavailable, ValidationFailed
from cascade.gateway import Gateway
from cascade.policy.model import BreakerConfig, Checkpoints, ClefTier, LayaTier, Policy, Route
from cascade.schema import ChoiceQuestion, NoulQuestion

CHOICE = ChoiceQuestion(instructions="Which?", criteria=[f"o{i}" for i in range(60)])
NOUL = NoulQuestion(instructions="Urgent?")


def policy(min_calls: int = 100) -> Policy:
    return Policy(
        tiers={"laya": LayaTier(checkpoints=Checkpoints(english="x")),
               "clef": ClefTier(release="x")},
        route=Route(cheap="laya", strong="clef"),  # 60 options > 48: pre-routed strong
        breaker={"clef": BreakerConfig(min_calls=min_calls, failure_ratio=0.5)},
    )


def call(*questions: object) -> EngineCall:
    return EngineCall(state="s", model="jev-latest",
                      questions={f"q{i}": q for i, q in enumerate(questions)})  # type: ignore[misc]


def test_engine_bugs_degrade_and_count_against_the_breaker() -> None:
    def broken(call: EngineCall) -> EngineAnswer:
        raise ValueError("a bug in the engine")

    gateway = Gateway(policy(min_calls=2), {"laya": FakeEngine("laya"),
                                            "clef": FakeEngine("clef", broken)})

    async def run() -> None:
        await gateway.start()
        for _ in range(2):
            outcome = await gateway.systemone(call(CHOICE))  # not a 500: the cheap tier stands in
            assert outcome.label == "degraded"
            assert outcome.response.x_cascade["degraded"] == {"q0": "strong_failed"}
        assert gateway.breakers["clef"].state(gateway.clock()) == "open"

    asyncio.run(run())


def test_cheap_stand_in_refusing_is_503_not_422() -> None:
    def laya(call: EngineCall) -> EngineAnswer:
        if any(isinstance(q, ChoiceQuestion) for q in call.questions.values()):
            raise ValidationFailed.at(["questions"], "options do not fit the head budget")
        return deterministic_answer(call)

    def down(call: EngineCall) -> EngineAnswer:
        raise EngineUnavailable("clef is down")

    engines = {"laya": FakeEngine("laya", laya), "clef": FakeEngine("clef", down)}
    gateway = Gateway(policy(), engines)

    async def run() -> None:
        await gateway.start()
        with pytest.raises(EngineUnavailable, match="cannot stand in") as info:
            await gateway.systemone(call(CHOICE, NOUL))
        assert info.value.retry_after == gateway.policy.degrade.retry_after_s

    asyncio.run(run())


def test_a_failed_start_closes_every_engine() -> None:
    class Failing(FakeEngine):
        async def start(self) -> None:
            raise RuntimeError("no weights")

    good = FakeEngine("laya")
    gateway = Gateway(policy(), {"laya": good, "clef": Failing("clef")})

    async def run() -> None:
        with pytest.raises(RuntimeError, match="no weights"):
            await gateway.start()

    asyncio.run(run())
    assert not good.ready()
