"""One replica's link to the fleet's Redis, in process on a real Redis: a replica without
history starts from the gate another published; Redis stopped, then started, then hung:
the replica paces on its own counts, says so and counts it, and the fleet view resumes."""

from __future__ import annotations

import asyncio
import random
import signal

from cascade import metrics
from cascade.control.fleet import FleetLink
from cascade.control.live import LiveControl
from tests.control.load import Clock, decided, policy
from tests.servers import run_redis


def fleet_control(url: str, clock: Clock) -> LiveControl:
    return LiveControl(
        policy(max_strong_share=0.2, window_s=60.0, scope="fleet", url=url, timeout_s=0.2),
        clock=clock,
    )


def test_a_replica_without_history_starts_from_the_fleets_gate() -> None:
    rng = random.Random(5)
    with run_redis() as (url, _):
        old_clock, new_clock = Clock(), Clock()
        old, new = fleet_control(url, old_clock), fleet_control(url, new_clock)

        async def run() -> dict[str, float]:
            first, second = FleetLink(old, replica="old"), FleetLink(new, replica="new")
            for i in range(600):  # ten a second for a minute
                old_clock.now = i / 10
                decided(old, "choice", rng.uniform(0.5, 0.82))
            assert await first.sync()
            assert await second.sync()
            decided(new, "choice", 0.6)
            await first.aclose()
            await second.aclose()
            return new.status()["thresholds"]

        thresholds = asyncio.run(run())
    paced = old.status()["thresholds"]["choice:2"]
    assert 0.5 < paced < 0.8 and thresholds["choice:2"] == paced


def test_redis_stopped_started_and_hung() -> None:
    asyncio.run(_stopped_started_and_hung())


async def _stopped_started_and_hung() -> None:
    clock = Clock()
    errors = metrics.FLEET_SYNC_ERRORS
    with run_redis() as (url, proc):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        control = fleet_control(url, clock)
        link = FleetLink(control, replica="r1", clock=clock)

        async def up() -> bool:
            decided(control, "choice", 0.6)
            return await link.sync()

        assert await up()
        assert control.pacing_on_fleet() and link.status()["connected"]  # type: ignore[index]
        before = errors._value.get()
        proc.terminate()
        proc.wait(10)
        assert not await up()
        clock.now += 5  # three syncs on: the fleet's counts are stale
        status = link.status()
        assert status is not None and not status["connected"] and status["down_since"]
        assert status["pacing"] == "replica" and errors._value.get() == before + 1
        assert metrics.FLEET_CONNECTED._value.get() == 0
        with run_redis(port=port) as (_, again):
            assert await up()
            assert control.pacing_on_fleet() and metrics.FLEET_CONNECTED._value.get() == 1
            again.send_signal(signal.SIGSTOP)  # hung: every call waits out its timeout
            try:
                assert not await link.sync()
            finally:
                again.send_signal(signal.SIGCONT)
            assert errors._value.get() == before + 2
            assert await up()
            await link.aclose()
