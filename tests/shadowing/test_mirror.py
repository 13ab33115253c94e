"""Shadow calls against the strong tier's breaker on the gateway's fake clock: skipped while the
breaker is open, still skipped once ``cooldown_s`` of the clock made it half-open (a shadow
never takes the probe a real request needs), sent again once a probe closed it."""

from __future__ import annotations

import asyncio

import msgspec

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.errors import EngineUnavailable
from cascade.gateway import Gateway
from cascade.policy.model import BreakerConfig, Shadow
from tests.control.load import Clock, policy
from tests.control.test_gateway_control import ask, unsure

COOLDOWN_S = 10.0
SURE, UNSURE = 0.95, 0.55  # cheap-final (shadowed), escalated to the strong tier


def test_shadows_wait_for_the_breaker_to_close_on_the_gateways_clock() -> None:
    down = [True]

    def clef(call: EngineCall) -> EngineAnswer:
        if down[0]:
            raise EngineUnavailable("clef is down")
        return deterministic_answer(call)

    served = msgspec.structs.replace(
        policy(),
        shadow=Shadow(fraction=1.0, max_concurrent=64),
        breaker={"clef": BreakerConfig(min_calls=1, failure_ratio=0.5, cooldown_s=COOLDOWN_S)},
    )
    strong, clock = FakeEngine("clef", clef), Clock()
    gateway = Gateway(served, {"laya": FakeEngine("laya", unsure), "clef": strong}, clock=clock)
    skipped = metrics.SHADOW.labels(outcome="skipped_busy")
    sent = metrics.SHADOW.labels(outcome="sent")

    async def shadowed(at: float) -> None:
        clock.now = at
        await ask(gateway, SURE)
        await gateway.shadows.settled()

    async def run() -> None:
        await gateway.start()
        try:
            await ask(gateway, UNSURE)  # escalated, failed: the breaker opens at 0
            assert strong.calls == 1
            before = skipped._value.get(), sent._value.get()
            for at in (0.0, COOLDOWN_S / 2, COOLDOWN_S - 0.01, COOLDOWN_S):  # open, half-open
                await shadowed(at)
            assert strong.calls == 1
            assert (skipped._value.get(), sent._value.get()) == (before[0] + 4, before[1])
            down[0] = False
            await ask(gateway, UNSURE)  # the probe, a real request's: closes it
            assert strong.calls == 2
            await shadowed(COOLDOWN_S)
            assert strong.calls == 3 and sent._value.get() == before[1] + 1
        finally:
            await gateway.aclose()

    asyncio.run(run())
