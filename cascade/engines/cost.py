"""How long a tier's work takes, learnt from the batches it ran: what admission decisions use.

``CostModel`` predicts the compute seconds of a set of rows from their costs (whatever unit the
batcher's ``cost`` function counts: tokens for Laya and Clef) as

    seconds = per_row * rows + per_cost * sum(cost) + per_cost2 * sum(cost**2)

fitted by non-negative least squares with exponential forgetting over the batches observed, so
it follows a machine whose load changes. Three terms, because a batch of many short rows pays a
fixed price per row (launches, the head) that a rate per token would spread wrongly, and full
attention over a long row grows with its square: a linear rate fitted on short rows would
promise a long one far too soon. Terms the data cannot tell apart, or that come out negative,
are dropped. Not thread-safe: use it from the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FORGET = 0.9  # weight of the past at each new batch: about the last ten batches count
_SCALE = 1000.0  # costs in thousands keep the normal equations well conditioned


def features(costs: Sequence[int]) -> np.ndarray:
    """``[rows, sum(cost), sum(cost**2)]`` of ``costs``, scaled."""
    scaled = np.asarray(costs, dtype=np.float64) / _SCALE
    return np.array([len(costs), scaled.sum(), (scaled * scaled).sum()])


class CostModel:
    """See the module docstring. ``seconds`` is None until a batch has been observed."""

    def __init__(self, forget: float = FORGET) -> None:
        self.forget = forget
        self._a = np.zeros((3, 3))  # forgetful sums of x x^T and x t: the normal equations
        self._b = np.zeros(3)
        self.weights: np.ndarray | None = None  # per_row, per_cost, per_cost2 (scaled units)

    def observe(self, costs: Sequence[int], seconds: float, weight: float = 1.0) -> None:
        """One batch of rows with these ``costs`` took ``seconds`` of compute; ``weight`` is
        how much it counts against a batch observed under traffic (1)."""
        x = features(costs)
        self._a = self.forget * self._a + weight * np.outer(x, x)
        self._b = self.forget * self._b + weight * x * max(seconds, 0.0)
        self.weights = self._fit()

    def warm_up(self, runs: Sequence[tuple[Sequence[int], float]]) -> None:
        """Observe runs made before serving, ``(costs, seconds)`` each. They were timed on an
        idle machine: together they count as one batch, so the first batches under traffic
        soon outweigh them."""
        for costs, seconds in runs:
            self.observe(costs, seconds, weight=1 / len(runs))

    def seconds(self, costs: Sequence[int]) -> float | None:
        """Predicted compute seconds of rows with these ``costs`` (None: no data yet)."""
        if self.weights is None:
            return None
        return float(features(costs) @ self.weights) if costs else 0.0

    def _fit(self) -> np.ndarray:
        active = [0, 1, 2]
        while active:
            a = self._a[np.ix_(active, active)]
            b = self._b[active]
            ridge = 1e-12 * (np.trace(a) + 1e-30)
            try:
                w = np.linalg.solve(a + ridge * np.eye(len(active)), b)
            except np.linalg.LinAlgError:
                w = None
            if w is not None and np.all(np.isfinite(w)) and np.all(w >= 0):
                out = np.zeros(3)
                out[active] = w
                return out
            # Drop the most negative term (or, for a singular system, the last one) and refit.
            drop = int(np.argmin(w)) if w is not None and np.all(np.isfinite(w)) else -1
            active.pop(drop)
        return np.zeros(3)
