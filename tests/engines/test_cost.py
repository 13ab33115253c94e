"""CostModel: the learnt cost of a tier's batches that admission decisions read."""

from __future__ import annotations

import pytest

from cascade.engines.cost import CostModel


def test_nothing_is_predicted_before_any_batch() -> None:
    assert CostModel().seconds([100]) is None


def test_fixed_linear_and_square_costs_are_told_apart() -> None:
    model = CostModel()

    def truth(costs: list[int]) -> float:
        return 0.002 * len(costs) + 1e-5 * sum(costs) + 2e-8 * sum(c * c for c in costs)

    for costs in ([16], [128], [512], [64] * 8, [1024, 900], [2048]):
        model.observe(costs, truth(costs))
    for costs in ([300] * 4, [4096], [10] * 32):
        assert model.seconds(costs) == pytest.approx(truth(costs), rel=1e-3)


def test_a_cost_rate_alone_when_the_terms_cannot_be_told_apart() -> None:
    model = CostModel()
    model.observe([100], 0.01)
    model.observe([100], 0.01)  # no spread at all
    assert model.seconds([100]) == pytest.approx(0.01, rel=1e-3)
    assert model.seconds([]) == 0.0


def test_the_past_is_forgotten_when_the_machine_slows_down() -> None:
    model = CostModel()
    for _ in range(20):
        model.observe([100], 0.01)
    for _ in range(40):
        model.observe([100], 0.03)  # three times slower now
    assert model.seconds([100]) == pytest.approx(0.03, rel=0.05)


def test_warm_up_runs_together_count_as_one_batch() -> None:
    """Three warm-up runs on an idle machine (10 ms a row), then one batch under traffic (30
    ms): the traffic outweighs them (counted as three batches, the prediction would be 15.8 ms)."""
    model = CostModel()
    model.warm_up([([1], 0.01)] * 3)
    assert model.seconds([1]) == pytest.approx(0.01, rel=1e-3)
    model.observe([1], 0.03)
    warm = 0.9 * (0.81 + 0.9 + 1) / 3  # the warm-up's weight, forgotten once
    assert model.seconds([1]) == pytest.approx((warm * 0.01 + 0.03) / (warm + 1), rel=1e-3)
    assert model.seconds([1]) > 0.02
