"""The gateway driver with fake tiers: breaker accounting, degradation edges, start-up failure,
the cheap tier failing, the strong tier refusing, usage merging, shadow sampling, batches."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, Image, QuestionResult
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.errors import (
    EngineFailed,
    EngineTimeout,
    EngineUnavailable,
    Overloaded,
    PayloadTooLarge,
    ValidationFailed,
)
from cascade.gateway import Gateway
from cascade.http import status
from cascade.http.gauges import registry_of
from cascade.policy.model import (
    Bands,
    BreakerConfig,
    Checkpoints,
    ClefTier,
    LayaTier,
    Policy,
    Route,
    Shadow,
    Thresholds,
    TypeBands,
)
from cascade.schema import ChoiceQuestion, NoulQuestion

CHOICE = ChoiceQuestion(instructions="Which?", criteria=[f"o{i}" for i in range(60)])
NOUL = NoulQuestion(instructions="Urgent?")


def policy(min_calls: int = 100) -> Policy:
    return Policy(
        tiers={
            "laya": LayaTier(checkpoints=Checkpoints(english="x")),
            "clef": ClefTier(release="x"),
        },
        route=Route(cheap="laya", strong="clef"),  # 60 options > 48: pre-routed strong
        breaker={"clef": BreakerConfig(min_calls=min_calls, failure_ratio=0.5)},
    )


def call(*questions: object) -> EngineCall:
    return EngineCall(
        state="s", model="jev-latest", questions={f"q{i}": q for i, q in enumerate(questions)}
    )  # type: ignore[misc]


def test_engine_bugs_degrade_and_count_against_the_breaker() -> None:
    def broken(call: EngineCall) -> EngineAnswer:
        raise ValueError("a bug in the engine")

    gateway = Gateway(
        policy(min_calls=2), {"laya": FakeEngine("laya"), "clef": FakeEngine("clef", broken)}
    )

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


# ---------------------------------------------------------------- the cheap tier failing


def fail_with(exc: Exception):  # noqa: ANN201
    def handler(call: EngineCall) -> EngineAnswer:
        raise exc

    return handler


@pytest.mark.parametrize(
    "exc",
    [
        Overloaded("laya/english: 256 rows queued"),
        EngineFailed("onnxruntime failed"),
        RuntimeError("a bug"),
    ],
)
def test_a_failing_cheap_tier_hands_its_questions_to_the_strong_one(exc: Exception) -> None:
    """No gateway-wide outage: the strong tier answers, and cheap overload never opens the
    cheap tier's breaker."""
    strict = msgspec.structs.replace(policy(), breaker={"laya": BreakerConfig(min_calls=1)})
    gateway = Gateway(
        strict, {"laya": FakeEngine("laya", fail_with(exc)), "clef": FakeEngine("clef")}
    )

    async def run() -> None:
        await gateway.start()
        for _ in range(3):
            outcome = await gateway.systemone(call(NOUL, NOUL))
            assert outcome.label == "ok" and set(outcome.tiers.values()) == {"clef"}
            assert outcome.response.x_cascade["reasons"] == {
                "q0": "cheap_failed",
                "q1": "cheap_failed",
            }
        opened = gateway.breakers["laya"].state(gateway.clock()) == "open"
        assert opened == (not isinstance(exc, Overloaded))
        await gateway.aclose()

    asyncio.run(run())


def test_when_both_tiers_fail_the_request_is_503_and_cheap_only_gets_the_cheap_error() -> None:
    gateway = Gateway(
        policy(),
        {
            "laya": FakeEngine("laya", fail_with(Overloaded("full"))),
            "clef": FakeEngine("clef", fail_with(EngineUnavailable("x"))),
        },
    )
    cheap_only = msgspec.structs.replace(call(NOUL), model="laya")
    gateway.policy = msgspec.structs.replace(
        gateway.policy, models=msgspec.structs.replace(gateway.policy.models, cheap_only=["laya"])
    )

    async def run() -> None:
        await gateway.start()
        with pytest.raises(EngineUnavailable, match="cheap_failed"):
            await gateway.systemone(call(NOUL))
        with pytest.raises(Overloaded, match="full"):
            await gateway.systemone(cheap_only)
        await gateway.aclose()

    asyncio.run(run())


# ---------------------------------------------------------------- the strong tier refusing


def test_a_strong_refusal_degrades_what_the_cheap_tier_answers_and_never_counts() -> None:
    refused = fail_with(PayloadTooLarge("Clef input has 20000 tokens; limit is 16384"))
    gateway = Gateway(
        policy(min_calls=1), {"laya": FakeEngine("laya"), "clef": FakeEngine("clef", refused)}
    )
    image = Image(data=b"png", mime="image/png", width=1, height=1)

    async def run() -> None:
        await gateway.start()
        for _ in range(3):
            outcome = await gateway.systemone(call(CHOICE, NOUL))
            assert outcome.label == "degraded"
            assert outcome.response.x_cascade["degraded"] == {"q0": "strong_refused"}
        assert gateway.breakers["clef"].state(gateway.clock()) == "closed"
        # only the strong tier can serve images: its 4xx is the answer
        with pytest.raises(PayloadTooLarge, match="20000 tokens"):
            await gateway.systemone(msgspec.structs.replace(call(NOUL), images=[image]))
        await gateway.aclose()

    asyncio.run(run())


def test_probes_that_end_without_a_verdict_free_the_half_open_slot() -> None:
    answers = iter([EngineUnavailable("down"), Overloaded("busy"), None])

    def clef(call: EngineCall) -> EngineAnswer:
        exc = next(answers)
        if exc is not None:
            raise exc
        return deterministic_answer(call)

    clock = [0.0]
    gateway = Gateway(
        msgspec.structs.replace(
            policy(),
            breaker={"clef": BreakerConfig(min_calls=1, failure_ratio=0.5, cooldown_s=10.0)},
        ),
        {"laya": FakeEngine("laya"), "clef": FakeEngine("clef", clef)},
        clock=lambda: clock[0],
    )

    gauges = registry_of(gateway)

    def state() -> float | None:
        return gauges.get_sample_value("cascade_breaker_state", {"tier": "clef"})

    async def run() -> None:
        await gateway.start()
        assert (await gateway.systemone(call(CHOICE))).label == "degraded"  # opens it
        assert state() == 2
        clock[0] = 10.5
        assert state() == 1  # half-open once the cooldown passed, without any traffic
        assert (await gateway.systemone(call(CHOICE))).label == "degraded"  # probe: overloaded
        # the overloaded probe released its slot: the next request probes at once and closes it
        assert (await gateway.systemone(call(CHOICE))).label == "ok"
        assert state() == 0
        await gateway.aclose()

    asyncio.run(run())


# ---------------------------------------------------------------- usage, shadow, batches


def test_dropped_tokens_come_from_the_rows_whose_answers_are_returned() -> None:
    def laya(call: EngineCall) -> EngineAnswer:
        answer = deterministic_answer(call)
        answer.results["q0"] = QuestionResult(type="noul", probabilities=[0.05, 0.95])
        answer.results["q1"] = QuestionResult(type="noul", probabilities=[0.5, 0.5])  # escalates
        answer.usage = EngineUsage(
            input_tokens=10,
            state_tokens=300,
            state_tokens_dropped=226,
            truncated_questions=["q0", "q1"],
            dropped={"q0": 12, "q1": 226},
        )
        return answer

    noul_floor = Thresholds(confidence=TypeBands(noul=Bands(two=0.9)), truncated=False)
    gateway = Gateway(
        msgspec.structs.replace(policy(), thresholds=noul_floor),
        {"laya": FakeEngine("laya", laya), "clef": FakeEngine("clef")},
    )

    async def run() -> None:
        await gateway.start()
        both = NoulQuestion(instructions="Urgent?", criteria={"true": "yes, today"})
        outcome = await gateway.systemone(call(NOUL, both))
        assert outcome.tiers == {"q0": "laya", "q1": "clef"}
        usage = outcome.response.usage
        assert usage.state_tokens_dropped == 12 and usage.truncated_questions == ["q0"]
        await gateway.aclose()

    asyncio.run(run())


def test_shadow_sampling_ignores_the_client_id_and_never_touches_the_breaker() -> None:
    def flaky(call: EngineCall) -> EngineAnswer:
        raise EngineTimeout("clef did not answer")

    sampled = msgspec.structs.replace(
        policy(min_calls=1), shadow=Shadow(fraction=0.5, max_concurrent=64)
    )
    gateway = Gateway(sampled, {"laya": FakeEngine("laya"), "clef": FakeEngine("clef", flaky)})
    confident = Thresholds()  # nothing escalates: every request is cheap-final

    async def run() -> int:
        gateway.policy = msgspec.structs.replace(gateway.policy, thresholds=confident)
        await gateway.start()
        for _ in range(40):  # the same client id every time
            await gateway.systemone(msgspec.structs.replace(call(NOUL), request_id="fixed"))
        await gateway.shadows.settled()
        assert gateway.breakers["clef"].state(gateway.clock()) == "closed"
        await gateway.aclose()
        return gateway.engines["clef"].calls  # type: ignore[attr-defined, no-any-return]

    shadowed = asyncio.run(run())
    assert 5 <= shadowed <= 35  # about half, whatever id the client sends


def test_a_failed_state_cancels_its_siblings_in_a_batch() -> None:
    started: list[str] = []
    cancelled: list[str] = []
    hold = asyncio.Event()  # never set: a sibling ends only by being cancelled

    async def laya(call: EngineCall) -> EngineAnswer:
        started.append(str(call.state))
        if call.state == "bad":
            raise ValidationFailed.at(["states", 1], "no")
        if call.state in ("a", "c") and not cancelled:
            try:
                await hold.wait()
            except asyncio.CancelledError:
                cancelled.append(str(call.state))
                raise
        return deterministic_answer(call)

    gateway = Gateway(
        Policy.single_tier("laya", LayaTier(checkpoints=Checkpoints(english="x"))),
        {"laya": FakeEngine("laya", laya)},
    )

    async def run() -> None:
        await gateway.start()
        calls = [msgspec.structs.replace(call(NOUL), state=s) for s in ("a", "bad", "c")]
        with pytest.raises(ValidationFailed):
            await gateway.batch(calls)
        for _ in range(10):  # the cancellations land within a few turns of the loop
            await asyncio.sleep(0)
        assert sorted(started) == ["a", "bad", "c"] and sorted(cancelled) == ["a", "c"]
        ok = await gateway.batch([calls[0], calls[2]])
        assert [o.response.model for o in ok] == ["cascade-fake", "cascade-fake"]
        await gateway.aclose()

    asyncio.run(run())


def test_readiness_follows_the_cheap_tier() -> None:
    class Down(FakeEngine):
        def ready(self) -> bool:
            return False

    gateway = Gateway(policy(), {"laya": FakeEngine("laya"), "clef": Down("clef")})
    gauges = registry_of(gateway)

    async def run() -> None:
        await gateway.start()
        assert status.ready(gateway)  # the strong tier being down only degrades answers
        assert status.health(gateway)["tiers"]["clef"]["ready"] is False
        assert gauges.get_sample_value("cascade_tier_ready", {"tier": "clef"}) == 0
        assert gauges.get_sample_value("cascade_tier_ready", {"tier": "laya"}) == 1
        await gateway.aclose()

    asyncio.run(run())
