"""The budget from the first request after boot: before the pacer has history of its own its
cuts come from the calibration snapshot's confidences (or, without one, keep every question the
gate decides cheap), never none."""

from __future__ import annotations

import random

import msgspec

from cascade.control.drift import histogram
from cascade.control.live import LiveControl
from cascade.control.prior import snapshot_cuts
from cascade.policy.model import Calibration
from tests.control.load import Clock, decided, policy


def _first(control: LiveControl, clock: Clock, confidences: list[float]) -> float:
    """The strong share of requests arriving a millisecond apart right after boot."""
    strong = 0
    for i, confidence in enumerate(confidences):
        clock.now = i / 1000
        strong += decided(control, "choice", confidence).tiers["q"] == "clef"
    return strong / len(confidences)


def test_the_snapshot_cuts_hold_the_budget_from_the_first_request() -> None:
    rng = random.Random(3)
    traffic = [rng.uniform(0.5, 0.82) for _ in range(150)]  # the thresholds send 99 % strong
    snapshot = {"choice:2": histogram([rng.uniform(0.5, 0.82) for _ in range(2000)], 10)}
    calibrated = msgspec.structs.replace(
        policy(max_strong_share=0.2), calibration=Calibration(snapshot=snapshot)
    )
    clock = Clock()
    share = _first(LiveControl(calibrated, clock=clock), clock, traffic)
    assert 0.1 <= share <= 0.22  # unpaced: 0.99
    cuts = snapshot_cuts(snapshot, {("choice", "2"): 0.8, ("noul", "2"): 0.7}, 0.2)
    assert 0.55 < cuts[("choice", "2")] < 0.6 and cuts[("noul", "2")] == 0.0


def test_without_a_snapshot_the_gate_keeps_answers_cheap_until_it_has_history() -> None:
    rng, clock = random.Random(4), Clock()
    control = LiveControl(policy(max_strong_share=0.2), clock=clock)
    assert _first(control, clock, [rng.uniform(0.5, 0.82) for _ in range(150)]) <= 0.2
    clock.now = 2.0  # the next pace: history of its own, the prior gone
    decided(control, "choice", 0.6)
    assert control.pacer is not None and control.pacer.has_history
    assert control.status()["thresholds"]["choice:2"] > 0.0
