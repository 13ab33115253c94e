"""The fleet's confidence histograms on a real Redis: replicas whose clocks disagree fill the same
buckets, counts a failed sync could not add are added by the next one, and two replicas' drift
monitors read one fleet PSI over their merged counts, kept with its age while Redis is down."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from cascade import metrics
from cascade.calls import EngineAnswer, EngineUsage, QuestionResult
from cascade.control.drift import DriftMonitor, histogram, psi
from cascade.control.fleet import FleetLink
from cascade.control.live import LiveControl
from cascade.fleet import client, histograms
from cascade.fleet.histograms import ConfidenceTally
from cascade.policy.flow import decide, run
from cascade.policy.model import Calibration, Drift, Policy
from tests.control.load import Clock, policy
from tests.control.test_drift import draw
from tests.policy.test_flow import WIDE
from tests.policy.test_routing import call
from tests.servers import run_redis

BINS = {"choice:2": 4, "noul:2": 3}


def test_replicas_with_skewed_clocks_fill_the_same_buckets() -> None:
    with run_redis() as (url, _):

        async def run() -> tuple[histograms.Merged, histograms.Merged]:
            redis = client.connect(url, 1.0)
            a = ConfidenceTally(60.0, "ref", BINS)
            b = ConfidenceTally(60.0, "ref", BINS)
            other = ConfidenceTally(60.0, "another", BINS)  # another snapshot: its own buckets
            # a's clock reads 5000 s, b's 2 s: their own clocks, one Redis clock
            for _ in range(3):
                a.add(4998.0, "choice:2", 1)
            a.add(4990.0, "noul:2", 2)
            b.add(2.0, "choice:2", 1)
            b.add(1.0, "choice:2", 3)
            other.add(2.0, "choice:2", 0)
            first = await histograms.sync(redis, a, 5000.0)
            await histograms.sync(redis, other, 2.0)
            second = await histograms.sync(redis, b, 2.0)
            await redis.aclose()
            return first, second

        first, second = asyncio.run(run())
    assert first == {"choice:2": [0, 3, 0, 0], "noul:2": [0, 0, 1]}
    assert second == {"choice:2": [0, 4, 0, 1], "noul:2": [0, 0, 1]}


def test_a_failed_sync_keeps_its_tally_for_the_next() -> None:
    with run_redis() as (url, proc):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        tally = ConfidenceTally(60.0, "ref", BINS)
        tally.add(10.0, "choice:2", 2)
        tally.add(10.0, "choice:2", 2)
        proc.terminate()
        proc.wait(10)

        async def fails() -> None:
            redis = client.connect(url, 0.2)
            try:
                await histograms.sync(redis, tally, 11.0)
            finally:
                await redis.aclose()

        with pytest.raises(client.errors()):
            asyncio.run(fails())
        tally.add(11.5, "choice:2", 0)  # seen while Redis was down
        with run_redis(port=port) as (again, _):

            async def adds() -> histograms.Merged:
                redis = client.connect(again, 1.0)
                try:
                    return await histograms.sync(redis, tally, 12.0)
                finally:
                    await redis.aclose()

            found = asyncio.run(adds())
    assert found["choice:2"] == [1, 0, 2, 0]


def calibrated(url: str, reference: list[float]) -> Policy:
    return msgspec.structs.replace(
        policy(max_strong_share=0.5, window_s=60.0, scope="fleet", url=url, timeout_s=0.2),
        calibration=Calibration(snapshot={"choice:2": histogram(reference, 10)}),
        drift=Drift(window_s=120.0, min_count=300),
    )


def test_two_replicas_read_one_fleet_psi_over_their_merged_counts() -> None:
    asyncio.run(_two_replicas())


async def _two_replicas() -> None:
    rng, cell = random.Random(8), ("choice", "2")
    errors = metrics.FLEET_SYNC_ERRORS
    with run_redis() as (url, proc):
        served = calibrated(url, draw(rng, 5, 2, 2000))
        clocks = [Clock(), Clock()]
        clocks[1].now = 700.0  # another process, another monotonic clock
        monitors = [DriftMonitor(served, clock=c) for c in clocks]
        links = [
            FleetLink(LiveControl(served, clock=c), drift=m, replica=f"r{i}", clock=c)
            for i, (c, m) in enumerate(zip(clocks, monitors, strict=True))
        ]
        steady, shifted = draw(rng, 5, 2, 600), draw(rng, 2, 2, 400)
        for value in steady:
            monitors[0].add(cell, value)
        for value in shifted:  # the bad pod
            monitors[1].add(cell, value)
        assert all([await link.sync() for link in links])
        assert await links[0].sync()  # the first one reads what the second added
        fleet = [m.fleet_psi()[cell] for m in monitors]
        alone = [m.psi()[cell] for m in monitors]
        merged = monitors[0].cells[cell].window(monitors[0]._slice(clocks[0].now))
        assert merged is not None
        mine = monitors[1].cells[cell].window(monitors[1]._slice(clocks[1].now))
        assert mine is not None
        reference = served.calibration.snapshot["choice:2"].counts
        assert fleet[0] == pytest.approx(psi(reference, merged + mine))
        assert fleet[0] == pytest.approx(fleet[1])
        assert alone[0] < fleet[0] < alone[1]
        scraped = registry_of_psi(monitors[0])
        assert scraped == pytest.approx(fleet[0])
        status = links[1].status()
        assert status is not None and status["drift"]["psi"] == {"choice:2": round(fleet[1], 4)}

        # Redis down: the last fleet PSI is kept, its age grows, the failure is counted
        before = errors._value.get()
        proc.terminate()
        proc.wait(10)
        clocks[0].now += 30
        assert not await links[0].sync()
        assert errors._value.get() == before + 1
        assert monitors[0].fleet_psi()[cell] == fleet[0]
        status = links[0].status()
        assert status is not None and status["drift"]["age_s"] == 30.0
        clocks[0].now += 91  # older than the [drift] window: dropped
        status = links[0].status()
        assert monitors[0].fleet_psi() == {} and status is not None and status["drift"] is None
        for link in links:
            await link.aclose()


def registry_of_psi(monitor: DriftMonitor) -> float:
    """``cascade_fleet_confidence_psi{type="choice",band="2"}`` as the app's gauges export it."""
    registry = CollectorRegistry()
    registry.register(metrics.DriftGauges(monitor.psi, monitor.fleet_psi))
    value = registry.get_sample_value(
        "cascade_fleet_confidence_psi", {"type": "choice", "band": "2"}
    )
    assert value is not None
    return value


def test_without_a_snapshot_or_outside_the_fleet_scope_there_is_no_tally() -> None:
    url = "redis://127.0.0.1:1/0"
    served = calibrated(url, [i / 1000 for i in range(500, 1000)])
    assert DriftMonitor(served).tally is not None
    bare = msgspec.structs.replace(served, calibration=Calibration())
    assert DriftMonitor(bare).tally is None  # a boot reference differs per replica
    alone = msgspec.structs.replace(
        served, control=msgspec.structs.replace(served.control, scope="replica")
    )
    assert DriftMonitor(alone).tally is None


def test_switching_to_the_fleet_scope_tallies_from_then_on_and_keeps_the_window() -> None:
    clock = Clock()
    fleet = calibrated("redis://127.0.0.1:1/0", [0.5 + i / 1000 for i in range(500)])
    alone = msgspec.structs.replace(
        fleet, control=msgspec.structs.replace(fleet.control, scope="replica")
    )
    monitor = DriftMonitor(alone, clock=clock)
    question = call(questions={"urgent": WIDE["urgent"]})
    answer = EngineAnswer(
        model="m",
        usage=EngineUsage(input_tokens=1),
        results={"urgent": QuestionResult(type="noul", probabilities=[0.2, 0.8])},
    )
    decision = run(decide(alone, question, previews=False), lambda ask: answer)
    noul = {"noul:2": histogram([0.5 + i / 1000 for i in range(500)], 10)}
    alone = msgspec.structs.replace(alone, calibration=Calibration(snapshot=noul))
    fleet = msgspec.structs.replace(fleet, calibration=Calibration(snapshot=noul))
    monitor.observe(alone, decision)
    assert monitor.tally is None
    monitor.observe(fleet, decision)  # the scope changed: the window stays, the tally starts
    window = monitor.cells[("noul", "2")].window(monitor._slice(clock.now))
    assert window is not None and int(window.sum()) == 2
    assert monitor.tally is not None
    assert sum(sum(c["noul:2"]) for c in monitor.tally.taken(clock.now).values()) == 1
