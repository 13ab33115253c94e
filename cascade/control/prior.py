"""The pacer's cuts before it has history: the budget held from a replica's first request.

A replica that has answered nothing yet cannot measure its share; left alone it escalates
whatever its thresholds escalate until it has (measured: 49 % strong over the first 150
requests with a budget of 20 %). In a fleet it starts from the gate the others published
(``cascade.control.fleet``); alone, from ``snapshot_cuts``: the water-filling of
``cascade.control.pacer`` on the calibration snapshot's confidences (the fitted data's, per
cell), as if every question reached the gate and none were forced strong. A cell the snapshot
does not cover is cut to 0 (kept cheap, flagged ``budget``) until there is history.
"""

from __future__ import annotations

from collections.abc import Mapping

from cascade.control.pacer import GUARD, water_fill
from cascade.policy.model import ConfidenceHistogram
from cascade.policy.stats import Cell

PER_CELL = 1000  # points a histogram is spread into


def snapshot_cuts(
    snapshot: Mapping[str, ConfidenceHistogram], thresholds: Mapping[Cell, float], budget: float
) -> dict[Cell, float]:
    """Cuts that hold ``budget`` on the confidences of ``snapshot`` (cells ``type:band``)."""
    confs: dict[Cell, list[float]] = {}
    weight: dict[Cell, int] = {}
    for cell in thresholds:
        found = snapshot.get(f"{cell[0]}:{cell[1]}")
        total = sum(found.counts) if found is not None else 0
        if found is not None and total:
            confs[cell], weight[cell] = spread(found), total
    cuts, _ = water_fill(confs, weight, thresholds, (), max(0.0, budget - GUARD))
    return {**{c: 0.0 for c in thresholds if c not in confs}, **cuts}


def spread(histogram: ConfidenceHistogram) -> list[float]:
    """About ``PER_CELL`` values spread evenly over each bin in proportion to its count (the
    open first and last bins end at 0 and 1)."""
    bounds = [0.0, *histogram.edges, 1.0]
    total = sum(histogram.counts)
    out: list[float] = []
    for i, count in enumerate(histogram.counts):
        k = round(count * PER_CELL / total)
        lo, hi = bounds[i], bounds[i + 1]
        out += [lo + (j + 0.5) * (hi - lo) / k for j in range(k)]
    return out
