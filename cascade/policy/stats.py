"""The statistics of a threshold fit, shared by ``cascade calibrate`` (``cascade.eval.fit``) and
the live refit (``cascade.control.refit``): escalation quantiles, the one-sided Clopper-Pearson
bound on the accuracy of the answers a threshold keeps, and the pooling rule for a cell with too
little data.

Cells are (question type, option band). A cell with fewer than ``min_cell`` (default 30)
members is too small to fit alone: it gets the pool of its option band (every question type of
the band: they share a range of max p), and when that is small too, of everything. 30 answers
that are all right give a one-sided 95 % lower bound of 0.905: fewer could not certify 0.9 even
when perfect.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from cascade.questions import BANDS

ALPHA = 0.05
MIN_CELL = 30
Cell = tuple[str, str]
ALL_CELLS: tuple[Cell, ...] = (*((t, b) for t in ("choice", "score") for b in BANDS), ("noul", "2"))
T = TypeVar("T")


def quantile_threshold(confidences: Sequence[float], rate: float) -> float:
    """A threshold under which a share ``rate`` of ``confidences`` falls: midway between the
    k-th and the (k+1)-th smallest (selected in linear time, not sorted)."""
    k = round(rate * len(confidences))
    if k <= 0 or not confidences:
        return 0.0
    if k >= len(confidences):
        return 1.0
    c = np.partition(np.asarray(confidences, dtype=np.float64), (k - 1, k))
    return (float(c[k - 1]) + float(c[k])) / 2


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1) / (a + b + 2):
        return 1.0 - betainc(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return front * h / a


def lower_bound(correct: int, n: int, alpha: float = ALPHA) -> float:
    """One-sided (1 - alpha) Clopper-Pearson lower bound of a binomial proportion: the p at
    which P(X >= correct) = alpha (0 when nothing is correct)."""
    if correct <= 0 or n <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if betainc(correct, n - correct + 1, mid) > alpha:
            hi = mid
        else:
            lo = mid
    return lo


def upper_bound(correct: int, n: int, alpha: float = ALPHA) -> float:
    """One-sided (1 - alpha) Clopper-Pearson upper bound of a binomial proportion: the lower
    bound of the failures, mirrored (1 when nothing was seen)."""
    return 1.0 - lower_bound(n - correct, n, alpha)


def accuracy_threshold(
    scored: Sequence[tuple[float, bool]], target: float
) -> tuple[float, int, int]:
    """``(threshold, accepted, correct accepted)``: the lowest threshold whose accepted answers
    (confidence at or above it) reach ``target`` at the 95 % lower bound; ``(1.0, 0, 0)`` when
    none does. Answers of equal confidence are kept or escalated together, so the candidates lie
    between distinct confidences (their midpoint) and the fit does not depend on the order of
    the labels."""
    ranked = sorted(scored, key=lambda s: -s[0])
    correct = [0]
    for _, ok in ranked:
        correct.append(correct[-1] + ok)
    for j in range(len(ranked), 0, -1):  # accept the j most confident
        if j < len(ranked) and ranked[j - 1][0] == ranked[j][0]:
            continue  # a cut inside a tie: the threshold would keep both sides
        # I_A(k, j-k+1) <= alpha  <=>  the lower bound is at least A
        if correct[j] > 0 and betainc(correct[j], j - correct[j] + 1, target) <= ALPHA:
            return _cut(ranked, j), j, correct[j]
    return 1.0, 0, 0


def _cut(ranked: Sequence[tuple[float, bool]], j: int) -> float:
    """A threshold that keeps exactly the ``j`` first of ``ranked`` (descending, no tie across
    ``j``): the midpoint of its neighbours, or the lower kept one where floats have no room."""
    if j == len(ranked):
        return 0.0
    low, high = ranked[j][0], ranked[j - 1][0]
    mid = (low + high) / 2
    return mid if mid > low else high


def pool_of(
    cells: Mapping[Cell, Sequence[T]],
    cell: Cell,
    enough: Callable[[Sequence[T]], bool],
    *,
    across_bands: bool = True,
) -> tuple[list[T], bool]:
    """The members to fit ``cell`` on, and whether they were pooled: the cell's own when
    ``enough``, else its band's (every type), else (``across_bands``) everything."""
    members = list(cells.get(cell, ()))
    if enough(members):
        return members, False
    band = [m for (_, b), ms in cells.items() if b == cell[1] for m in ms]
    if enough(band) or not across_bands:
        return band, True
    return [m for ms in cells.values() for m in ms], True
