"""``call_tier`` on a fake clock: the breaker it keeps opens on a tier's failures, refuses every
call until ``cooldown_s`` of that clock has passed, then lets one probe through, whose outcome
closes it or opens it again for another ``cooldown_s``; a probe that ends in overload frees its
slot at once. No sleeping: the clock is advanced by hand."""

from __future__ import annotations

import asyncio

import pytest

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.errors import BreakerOpen, EngineFailed, Overloaded
from cascade.policy.breaker import CircuitBreaker
from cascade.policy.model import BreakerConfig, UpstreamTier
from cascade.schema import NoulQuestion
from cascade.tiercall import call_tier

COOLDOWN_S = 5.0
CONFIG = BreakerConfig(
    window_s=10.0, min_calls=2, failure_ratio=0.5, cooldown_s=COOLDOWN_S, half_open_probes=1
)
TIER = UpstreamTier(urls=["http://127.0.0.1:1"], timeout_s=60.0)
CALL = EngineCall(
    state="charged twice",
    model="jev-latest",
    questions={"q": NoulQuestion(instructions="refund?", criteria="asks for a refund")},
)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Tier:
    """A tier that fails with ``fault`` (None: answers), or waits for ``gate`` when set."""

    def __init__(self) -> None:
        self.fault: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.engine = FakeEngine("clef", self._answer)

    async def _answer(self, call: EngineCall) -> EngineAnswer:
        if self.gate is not None:
            self.entered.set()
            await self.gate.wait()
        if self.fault is not None:
            raise self.fault
        return deterministic_answer(call)


async def ask(tier: Tier, breaker: CircuitBreaker, clock: Clock) -> EngineAnswer:
    return await call_tier("clef", tier.engine, TIER, breaker, CALL, {}, clock=clock)


async def opened(tier: Tier, breaker: CircuitBreaker, clock: Clock) -> None:
    """Two failures on ``clock``: the breaker opens at ``clock.now``."""
    tier.fault = EngineFailed("clef: 500")
    for _ in range(2):
        with pytest.raises(EngineFailed):
            await ask(tier, breaker, clock)
    assert breaker.state(clock()) == "open"


def test_refused_until_cooldown_on_the_clock_then_one_probe_closes_it() -> None:
    async def run() -> None:
        tier, clock, breaker = Tier(), Clock(), CircuitBreaker(CONFIG)
        await opened(tier, breaker, clock)
        tier.fault = None  # the tier is back, but the breaker does not know yet
        calls = tier.engine.calls
        for waited, left in ((0.0, 5.0), (3.0, 2.0), (COOLDOWN_S - 0.01, 0.01)):
            clock.now = 1000.0 + waited
            with pytest.raises(BreakerOpen) as refused:
                await ask(tier, breaker, clock)
            assert refused.value.retry_after == pytest.approx(left)
        assert tier.engine.calls == calls  # nothing reached the tier while open

        clock.now = 1000.0 + COOLDOWN_S  # half-open: one probe, the next refused meanwhile
        tier.gate = asyncio.Event()
        probe = asyncio.create_task(ask(tier, breaker, clock))
        await tier.entered.wait()  # the probe is in the tier now
        with pytest.raises(BreakerOpen):
            await ask(tier, breaker, clock)
        assert tier.engine.calls == calls + 1
        tier.gate.set()
        await probe  # it succeeded: closed, every call goes through
        tier.gate = None
        assert breaker.state(clock()) == "closed"
        for _ in range(3):
            await ask(tier, breaker, clock)
        assert tier.engine.calls == calls + 4

    asyncio.run(run())


def test_a_failed_probe_opens_it_again_for_a_whole_cooldown_from_the_probe() -> None:
    async def run() -> None:
        tier, clock, breaker = Tier(), Clock(), CircuitBreaker(CONFIG)
        await opened(tier, breaker, clock)
        clock.now += COOLDOWN_S + 2.0
        with pytest.raises(EngineFailed):  # the probe went through and failed
            await ask(tier, breaker, clock)
        probed = clock.now
        tier.fault = None
        clock.now = probed + COOLDOWN_S - 0.01
        with pytest.raises(BreakerOpen):
            await ask(tier, breaker, clock)
        clock.now = probed + COOLDOWN_S
        await ask(tier, breaker, clock)
        assert breaker.state(clock()) == "closed"

    asyncio.run(run())


def test_an_overloaded_probe_frees_its_slot_at_once() -> None:
    """Back-pressure says nothing about the tier's health: the next call, at the same instant
    of the clock, is the probe instead."""

    async def run() -> None:
        tier, clock, breaker = Tier(), Clock(), CircuitBreaker(CONFIG)
        await opened(tier, breaker, clock)
        clock.now += COOLDOWN_S
        tier.fault = Overloaded("clef: queue full")
        with pytest.raises(Overloaded):
            await ask(tier, breaker, clock)
        assert breaker.state(clock()) == "half_open"
        tier.fault = None
        await ask(tier, breaker, clock)
        assert breaker.state(clock()) == "closed"

    asyncio.run(run())
