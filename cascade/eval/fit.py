"""Fitting a calibration: temperatures by NLL, thresholds for an escalation or accuracy target.

All per (question type x option band) cell, over the questions that reach the confidence gate
(the cheap tier answered them and nothing else sent them strong). A cell with fewer than
``min_cell`` questions (default 30) is too small to fit alone: it gets the pooled fit of its
option band (all question types of the band, which share a range of max p), or of everything
when the band is small too (a temperature needs ``min_cell`` labels somewhere, else it stays
1.0) — except an escalation quantile, which stays within the band however small: max p of
eight options and of two are not comparable. A cell the data lacks gets its band's fit (no
threshold, so no confidence escalation, when the whole band is missing). For an accuracy
target, 30 answers that are all right give a one-sided 95 % lower bound of 0.905: fewer could
not certify 0.9 even when perfect.

- Temperature: the T in Laya's range [0.5, 5] (``cascade.laya.config.clamp_temperature``) that
  minimizes the negative log-likelihood of the gold labels under ``p^(1/T)`` (golden-section
  search on 1/T, where the NLL is convex). Labels needed.
- ``--target-escalation R`` (RouteLLM-style quantiles): the threshold below which a share R of
  the cell's tempered confidences fall (midway between the two neighbouring confidences). No
  labels needed.
- ``--target-accuracy A``: the lowest threshold (so the lowest escalation) whose accepted
  answers (confidence at or above it) have a one-sided 95 % Clopper-Pearson lower bound on
  their accuracy of at least A; 1.0 (escalate everything) when no threshold does.

The statistics (quantiles, the bound, pooling) are ``cascade.policy.stats``'s, which the live
refit shares.

``snapshot``: the gated confidences per cell, tempered with the fitted temperatures and binned
(``cascade.control.drift.histogram``): the reference the gateway's drift monitor compares with.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Literal

from cascade.control.drift import histogram
from cascade.eval.decide import ItemRow, TierOut, reaches_gate
from cascade.laya.config import TEMP_MAX, TEMP_MIN, clamp_temperature
from cascade.policy.calibration import CellFit, temper
from cascade.policy.model import ConfidenceHistogram
from cascade.policy.stats import (
    ALL_CELLS,
    MIN_CELL,
    Cell,
    accuracy_threshold,
    lower_bound,
    pool_of,
    quantile_threshold,
)

Target = Literal["escalation", "accuracy"]


# ---------------------------------------------------------------- temperatures


def nll(pairs: Sequence[tuple[Sequence[float], int]], temperature: float) -> float:
    """Mean negative log-likelihood of the gold indices under ``p^(1/T)``."""
    total = 0.0
    for p, gold in pairs:
        q = temper(p, temperature)
        total -= math.log(max(q[gold], 1e-300))
    return total / len(pairs)


def fit_temperature(pairs: Sequence[tuple[Sequence[float], int]]) -> float:
    """The NLL-minimizing temperature in [0.5, 5] (1.0 without data)."""
    if not pairs:
        return 1.0
    lo, hi = 1.0 / TEMP_MAX, 1.0 / TEMP_MIN  # over beta = 1/T
    golden = (math.sqrt(5) - 1) / 2
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    fa, fb = nll(pairs, 1 / a), nll(pairs, 1 / b)
    for _ in range(48):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - golden * (hi - lo)
            fa = nll(pairs, 1 / a)
        else:
            lo, a, fa = a, b, fb
            b = lo + golden * (hi - lo)
            fb = nll(pairs, 1 / b)
    return clamp_temperature(round(2 / (lo + hi), 4))


# ---------------------------------------------------------------- thresholds


# ---------------------------------------------------------------- a whole fit


def fit(
    rows: Sequence[ItemRow], target: Target, value: float, *, min_cell: int = MIN_CELL
) -> tuple[dict[Cell, float], dict[Cell, float], dict[str, CellFit]]:
    """``(thresholds, temperatures, diagnostics)`` per (type, band) cell of the gated rows.

    A cell with too little data is fitted on its option band (every type: the same range of
    max p), and a band with too little on everything. Temperatures need gold labels (rows
    without one count for escalation quantiles only)."""
    cells: dict[Cell, list[ItemRow]] = defaultdict(list)
    for row in rows:
        if reaches_gate(row):
            cells[(row.type, row.band)].append(row)
    seen_bands = {band for _, band in cells}
    for cell in ALL_CELLS:  # a cell the data lacks gets its band's fit, when the band has data
        if cell[1] in seen_bands:
            cells.setdefault(cell, [])

    def pool(
        cell: Cell, enough: Callable[[Sequence[ItemRow]], bool], *, across_bands: bool = True
    ) -> tuple[list[ItemRow], bool]:
        return pool_of(cells, cell, enough, across_bands=across_bands)

    def labelled_enough(members: Sequence[ItemRow]) -> bool:
        return len(_labelled(members)) >= min_cell

    temperatures = {}
    for cell in cells:  # no temperature (1.0) unless some pool has enough labels
        labelled = _labelled(pool(cell, labelled_enough)[0])
        temperatures[cell] = fit_temperature(labelled) if len(labelled) >= min_cell else 1.0

    def gate(row: ItemRow, t: float) -> float:
        return max(temper(_cheap(row).probabilities, t))

    thresholds, diagnostics = {}, {}
    for cell in sorted(cells):
        if target == "escalation":
            members, pooled = pool(cell, lambda m: len(m) >= min_cell, across_bands=False)
            t = quantile_threshold(
                [gate(r, temperatures[(r.type, r.band)]) for r in members], value
            )
        else:
            members, pooled = pool(cell, labelled_enough)
            pairs = [
                (gate(r, temperatures[(r.type, r.band)]), _cheap(r).answer == r.gold)
                for r in members
                if r.gold_index is not None
            ]
            t = accuracy_threshold(pairs, value)[0]
        thresholds[cell] = t
        diagnostics[f"{cell[0]}:{cell[1]}"] = _diagnose(
            cells[cell], t, temperatures[cell], pooled, gate
        )
    return thresholds, temperatures, diagnostics


def snapshot(
    rows: Sequence[ItemRow], temperatures: dict[Cell, float], bins: int
) -> dict[str, ConfidenceHistogram]:
    """``"type:band"`` -> the gate confidences of the rows that reached the gate, tempered
    with the cell's fitted temperature, on ``bins`` equal-count bins."""
    cells: dict[Cell, list[float]] = defaultdict(list)
    for row in rows:
        if reaches_gate(row):
            t = temperatures.get((row.type, row.band), 1.0)
            cells[(row.type, row.band)].append(max(temper(_cheap(row).probabilities, t)))
    return {f"{t}:{b}": histogram(confs, bins) for (t, b), confs in sorted(cells.items())}


def _cheap(row: ItemRow) -> TierOut:
    """The cheap tier's output of a row that reached the gate (every row fitted on)."""
    assert row.cheap is not None, "a row that reached the gate has the cheap tier's answer"
    return row.cheap


def _labelled(rows: Sequence[ItemRow]) -> list[tuple[Sequence[float], int]]:
    return [(_cheap(r).probabilities, r.gold_index) for r in rows if r.gold_index is not None]


def _diagnose(
    members: Sequence[ItemRow],
    threshold: float,
    temperature: float,
    pooled: bool,
    gate: Callable[[ItemRow, float], float],
) -> CellFit:
    confs = [gate(r, temperature) for r in members]
    kept = [r for r, c in zip(members, confs, strict=True) if c >= threshold]
    judged = [r for r in kept if r.gold_index is not None]
    right = sum(_cheap(r).answer == r.gold for r in judged)
    return CellFit(
        n=len(members),
        pooled=pooled,
        temperature=temperature,
        threshold=threshold,
        escalation=1 - len(kept) / len(members) if members else 0.0,
        accepted_accuracy=right / len(judged) if judged else None,
        lower_bound=round(lower_bound(right, len(judged)), 6) if judged else None,
    )
