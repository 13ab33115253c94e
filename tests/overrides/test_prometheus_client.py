"""cascade.overrides.prometheus_client against the installed library: a child is looked up once
per label set, and one that was removed is forgotten (its successor is the one exported)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from cascade.metrics import Counter, Gauge


def test_a_child_is_looked_up_once_per_label_set() -> None:
    counter = Counter("t_calls_total", "calls", ["tier"], registry=CollectorRegistry())
    assert counter.labels("laya") is counter.labels("laya")
    assert counter.labels(tier="laya") is counter.labels(tier="laya")
    assert counter.labels("laya") is not counter.labels("clef")


@pytest.mark.parametrize("forget", ["remove", "remove_by_labels", "clear"])
def test_a_removed_child_is_forgotten(forget: str) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("t_share", "share", ["tier"], registry=registry)
    gauge.labels("laya").set(1)
    {
        "remove": lambda: gauge.remove("laya"),
        "remove_by_labels": lambda: gauge.remove_by_labels({"tier": "laya"}),
        "clear": gauge.clear,
    }[forget]()
    assert registry.get_sample_value("t_share", {"tier": "laya"}) is None
    gauge.labels("laya").set(2)  # a stale child would take this and export nothing
    assert registry.get_sample_value("t_share", {"tier": "laya"}) == 2
