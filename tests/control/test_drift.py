"""Drift without labels: PSI of the cheap tier's gate confidences against a shifted and an
unshifted sample, the calibration snapshot and the boot hour as references, the sliding window,
what reaches the monitor from a decision, and the per-app gauge."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pytest
from prometheus_client import generate_latest

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.control.drift import (
    RESERVOIR,
    DriftMonitor,
    counted,
    histogram,
    psi,
)
from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http.gauges import registry_of
from cascade.policy.files import PolicyError, load_policy
from cascade.policy.flow import Ask, Preview, Reply, decide, run
from cascade.policy.model import Calibration, ConfidenceHistogram, Drift, Policy, TypeBands
from cascade.schema import ChoiceQuestion
from tests.policy.test_flow import WIDE, answered
from tests.policy.test_routing import POLICY, call, preview, row


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def draw(rng: random.Random, a: float, b: float, n: int) -> list[float]:
    """Max p of a two-option question: 0.5 + 0.5 Beta(a, b)."""
    return [0.5 + 0.5 * rng.betavariate(a, b) for _ in range(n)]


def test_histogram_has_equal_count_bins_and_merges_ties() -> None:
    hist = histogram([i / 100 for i in range(100)], 4)
    assert hist.counts == [25, 25, 25, 25]
    assert hist.edges == pytest.approx([0.245, 0.495, 0.745])
    tied = histogram([0.9] * 70 + [0.5, 0.6, 0.7] * 10, 10)
    assert sum(tied.counts) == 100 and tied.counts[-1] == 70  # the ties share one bin
    assert len(tied.edges) < 9
    assert histogram([0.7] * 5, 10) == ConfidenceHistogram(edges=[], counts=[5])


def test_histogram_selects_the_edges_a_full_sort_gives() -> None:
    rng = random.Random(7)
    for n in (1, 5, 9, 10, 11, 1000, 20_000):
        values = [round(rng.random(), 3) for _ in range(n)]  # ties included
        ordered = sorted(values)
        edges: list[float] = []
        for i in range(1, 10):
            k = round(i * n / 10)
            if 0 < k < n and ordered[k - 1] < ordered[k]:
                edge = (ordered[k - 1] + ordered[k]) / 2
                if not edges or edge > edges[-1]:
                    edges.append(edge)
        found = histogram(values, 10)
        assert found.edges == edges
        assert found.counts == [
            sum(lo <= v < hi for v in values)
            for lo, hi in zip([-1.0, *edges], [*edges, 2.0], strict=True)
        ]


def test_psi_stays_low_on_an_unshifted_sample_and_crosses_025_on_a_shifted_one() -> None:
    rng = random.Random(1)
    reference = histogram(draw(rng, 5, 2, 2000), 10)

    def against(a: float, b: float, n: int) -> float:
        return psi(reference.counts, counted(reference.edges, draw(rng, a, b, n)))

    # measured (docs/live-control.md, Drift): 0.0074, 0.42, 1.08; at 300 questions 0.033 and 0.55
    assert against(5, 2, 1000) < 0.05
    assert against(3, 2, 1000) > 0.25
    assert against(2, 2, 1000) > 0.9
    assert against(5, 2, 300) < 0.1
    assert against(3, 2, 300) > 0.25
    assert psi(reference.counts, reference.counts) == 0.0
    # No share is 0: an empty bin gives a large, finite PSI.
    assert 1 < psi([100, 100, 0], [0, 100, 100]) < float("inf")


def _calibrated(snapshot: dict[str, ConfidenceHistogram], **drift: object) -> Policy:
    return msgspec.structs.replace(
        POLICY,
        calibration=Calibration(snapshot=snapshot),
        drift=Drift(**{"window_s": 120.0, "min_count": 300, **drift}),
    )  # type: ignore[arg-type]


def test_the_calibration_snapshot_is_the_reference_and_the_window_slides() -> None:
    rng, clock = random.Random(2), Clock()
    reference = histogram(draw(rng, 5, 2, 2000), 10)
    monitor = DriftMonitor(_calibrated({"noul:2": reference}), clock=clock)
    cell = ("noul", "2")
    for value in draw(rng, 5, 2, 299):
        monitor.add(cell, value)
    assert monitor.psi() == {}  # fewer than min_count in the window
    monitor.add(cell, 0.9)
    assert monitor.psi()[cell] < 0.1
    clock.now += 130  # the whole window is past: the counts age out
    assert monitor.psi() == {}
    for value in draw(rng, 2, 2, 600):
        monitor.add(cell, value)
    assert monitor.psi()[cell] > 0.25


def test_a_cell_too_small_in_the_snapshot_or_boot_reference_falls_back_to_the_boot_hour() -> None:
    rng, clock = random.Random(3), Clock()
    small = histogram(draw(rng, 5, 2, 50), 10)  # 50 < min_count
    policy = _calibrated({"noul:2": small}, reference_s=600.0)
    monitor = DriftMonitor(policy, clock=clock)
    cell = ("noul", "2")
    for value in draw(rng, 5, 2, 400):
        monitor.add(cell, value)
    assert monitor.cells[cell].reference is None  # the boot hour is still running
    clock.now += 600
    monitor.add(cell, 0.8)  # the hour is over and the cell has min_count: the reference closes
    boot = monitor.cells[cell].reference
    assert boot is not None and sum(boot.counts) == 401 and len(boot.counts) == 10
    assert monitor.psi() == {}  # the window counts only what came after it
    for value in draw(rng, 5, 2, 400):
        monitor.add(cell, value)
    assert monitor.psi()[cell] < 0.1
    forced = DriftMonitor(
        _calibrated({"noul:2": histogram(draw(rng, 5, 2, 900), 10)}, reference="boot"), clock=clock
    )
    forced.add(cell, 0.8)
    assert forced.cells[cell].reference is None  # reference = "boot" ignores the snapshot


def test_the_boot_reference_keeps_a_bounded_uniform_sample() -> None:
    clock = Clock()
    monitor = DriftMonitor(_calibrated({}, reference_s=10.0), clock=clock)
    cell = ("choice", "3-5")
    for i in range(RESERVOIR * 2):
        monitor.add(cell, 0.2 + 0.8 * i / (RESERVOIR * 2))
    sample = monitor.cells[cell].sample
    assert len(sample) == RESERVOIR
    late = sum(v > 0.6 for v in sample) / RESERVOIR  # the later half of the values
    assert 0.45 < late < 0.55


def test_only_questions_that_reached_the_gate_count_with_the_tempered_confidence() -> None:
    temperatures = msgspec.convert({"noul": {"2": 2.0}}, TypeBands)
    policy = msgspec.structs.replace(POLICY, calibration=Calibration(temperatures=temperatures))

    def reply(ask: Ask) -> Reply:
        if isinstance(ask, Preview):
            return preview({q: row(60 if q == "big" else 3) for q in ask.call.questions})
        answer = answered(ask.tier, ask.call)
        if ask.tier == "laya":  # the cheap tier says it truncated mood's row
            answer.usage.truncated_questions = ["mood"]
        return answer

    decision = run(decide(policy, call(questions=WIDE), previews=True), reply)
    assert decision.escalated == {"mood": "truncated"}  # big was pre-routed strong
    found = {r.cell: r.confidence for r in decision.gate.values()}
    # urgent: [0.9, 0.1] tempered by T = 2 -> 0.75; intent untempered; mood and big never gated
    assert set(found) == {("choice", "3-5"), ("noul", "2")}
    assert found[("noul", "2")] == pytest.approx(0.75)
    assert found[("choice", "3-5")] == pytest.approx(0.9)
    cheap_only = run(decide(policy, call(model="laya"), previews=True), reply)
    assert cheap_only.gate == {}  # no cascade: no gate


def test_a_new_drift_table_or_snapshot_starts_over() -> None:
    clock = Clock()
    policy = _calibrated({}, reference_s=1.0, min_count=1)
    monitor = DriftMonitor(policy, clock=clock)
    urgent = call(questions={"urgent": WIDE["urgent"]})
    answer = EngineAnswer(
        model="m",
        usage=EngineUsage(input_tokens=1),
        results={"urgent": QuestionResult(type="noul", probabilities=[0.2, 0.8])},
    )
    decision = run(decide(policy, urgent, previews=False), lambda ask: answer)
    monitor.observe(policy, decision)
    assert list(monitor.cells) == [("noul", "2")]
    monitor.observe(msgspec.structs.replace(policy), decision)  # equal: nothing resets
    assert monitor.cells[("noul", "2")].seen == 2
    monitor.observe(_calibrated({}, reference_s=2.0, min_count=1), decision)
    assert monitor.cells[("noul", "2")].seen == 1


def test_the_gateway_feeds_the_monitor_and_its_app_exports_the_psi() -> None:
    clock = Clock()
    policy = msgspec.structs.replace(
        POLICY, drift=Drift(window_s=60.0, reference_s=5.0, min_count=20, bins=5)
    )
    choice = ChoiceQuestion(criteria=["a", "b", "c"])

    def cheap(c: EngineCall) -> EngineAnswer:
        return answered("laya", c)

    gateway = Gateway(
        policy, {"laya": FakeEngine("laya", cheap), "clef": FakeEngine("clef")}, clock=clock
    )

    async def ask(n: int, state: str) -> None:
        for i in range(n):
            c = EngineCall(state=f"{state} {i}", model="jev-latest", questions={"q": choice})
            await gateway.systemone(c)

    asyncio.run(ask(20, "boot"))
    clock.now += 5
    asyncio.run(ask(21, "after"))  # the first closes the reference
    assert ("choice", "3-5") in gateway.drift.psi()
    text = generate_latest(registry_of(gateway)).decode()
    assert 'cascade_confidence_psi{band="3-5",type="choice"} 0.0' in text


def test_the_drift_table_is_checked_with_file_and_line(tmp_path: Path) -> None:
    good = (Path(__file__).parents[2] / "policies" / "default.toml").read_text()
    path = tmp_path / "p.toml"
    path.write_text(
        good + '\n[drift]\nwindow_s = 600.0\nbins = 1\nmin_count = 0\nreference = "boot"\n'
    )
    lines = good.count("\n") + 1
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.messages == [
        f"{path}:{lines + 3}: error: `drift.bins`: Expected `int` >= 2",
        f"{path}:{lines + 4}: error: `drift.min_count`: Expected `int` >= 1",
    ]
    path.write_text(good + '\n[drift]\nwindow_s = 600.0\nreference = "boot"\n')
    assert load_policy(path).drift == Drift(window_s=600.0, reference="boot")
    path.write_text(good + "\n[drift]\nwindow = 600.0\n")
    with pytest.raises(PolicyError, match=r"unknown key `window` \(known: bins, min_count"):
        load_policy(path)


def test_a_snapshot_written_into_a_policy_is_checked_too(tmp_path: Path) -> None:
    good = (Path(__file__).parents[2] / "policies" / "default.toml").read_text()
    path = tmp_path / "p.toml"
    path.write_text(
        good + '\n[calibration.snapshot."noul:2"]\nedges = [0.9, 0.6]\ncounts = [1, 2, 3]\n'
    )
    with pytest.raises(
        PolicyError,
        match=r"p.toml:\d+: error: snapshot noul:2: edges must be "
        "finite and strictly ascending",
    ):
        load_policy(path)
