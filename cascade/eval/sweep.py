"""The offline threshold sweep (deferral curve) and the cost model.

The sweep moves only the questions the confidence gate decides: the cheap tier answered them,
nothing else (pre-routing, truncation, option collapse, a whole-request escalation) sent them
strong, and both tiers have an answer. Ordered by the gate's confidence (lowest first, ties in
file order), the k least confident go to the strong tier; every other question keeps the
cascade's decision. k = 0 is the cheap tier with pre-routing; k = all escalates every gated
question. ``escalation_rate`` is then, as in the summary, the share of all questions the strong
tier answers (pre-routed included).

Cost model (``cascade.policy.costs``, shared with the spend counters): each tier costs a price
per 1000 input tokens (``[cost]`` in the policy or ``--cost TIER=PRICE``; defaults by kind,
relative units: Laya 1, Clef or an upstream 20). A question costs its
share of its item's tokens on each tier that ran it: the cheap tier's when the cheap tier ran
(escalated questions too: Laya ran first), the strong tier's when it answered. Item tokens are
split evenly over the item's questions (the strong tier reads the state once per call, so a
split item costs it a little more than this count says).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from cascade.eval.decide import CascadeOut, ItemRow, reaches_gate

CURVE_POINTS = 11  # escalation fractions 0.0, 0.1, ..., 1.0 of the gated questions


class Point(msgspec.Struct, kw_only=True):
    escalation_rate: float
    accuracy: float | None
    cost: float


def decided(rows: Iterable[ItemRow]) -> list[tuple[ItemRow, CascadeOut]]:
    """The rows the cascade answered, each with its decision."""
    return [(r, r.cascade) for r in rows if r.cascade is not None]


def _gated(row: ItemRow) -> bool:
    return reaches_gate(row) and row.strong is not None


def _gate_confidence(row: ItemRow) -> float:
    assert row.cheap is not None, "a row that reached the gate has the cheap tier's answer"
    return row.cheap.confidence


def question_cost(row: ItemRow, price: Mapping[str, float], *, cheap: bool, strong: bool) -> float:
    total = 0.0
    for slot, ran in (("cheap", cheap), ("strong", strong)):
        if ran:
            total += row.tokens.get(slot, 0.0) * price.get(slot, 0.0) / 1000
    return total


def cascade_cost(row: ItemRow, decision: CascadeOut, price: Mapping[str, float]) -> float:
    """What the cascade's ``decision`` on ``row`` cost: the cheap tier unless it was pre-routed,
    the strong tier when it answered."""
    return question_cost(
        row, price, cheap=not decision.pre_routed, strong=decision.tier == "strong"
    )


def _correct(row: ItemRow, slot: str) -> int:
    out = row.cheap if slot == "cheap" else row.strong
    return int(row.gold_index is not None and out is not None and out.answer == row.gold)


class Sweep:
    """Every point k = 0..m of the sweep over ``rows`` (those with a cascade answer)."""

    def __init__(self, rows: Sequence[ItemRow], price: Mapping[str, float]) -> None:
        answered = decided(rows)
        population = [r for r, _ in answered]
        gated = sorted((r for r in population if _gated(r)), key=_gate_confidence)
        fixed = [(r, c) for r, c in answered if not _gated(r)]
        self.n = len(population)
        self.n_scored = sum(r.gold_index is not None for r in population)
        self.m = len(gated)
        base_strong = sum(c.tier == "strong" for _, c in fixed)
        base_correct = sum(_correct(r, c.tier) for r, c in fixed)
        base_cost = sum(cascade_cost(r, c, price) for r, c in fixed)
        correct = base_correct + sum(_correct(r, "cheap") for r in gated)
        cost = base_cost + sum(question_cost(r, price, cheap=True, strong=False) for r in gated)
        self.points = [self._point(base_strong, correct, cost)]
        for k, r in enumerate(gated, 1):
            correct += _correct(r, "strong") - _correct(r, "cheap")
            cost += question_cost(r, price, cheap=False, strong=True)
            self.points.append(self._point(base_strong + k, correct, cost))
        self.strong_only_cost = sum(
            question_cost(r, price, cheap=False, strong=True) for r in population
        )

    def _point(self, strong: int, correct: int, cost: float) -> Point:
        return Point(
            escalation_rate=strong / self.n if self.n else 0.0,
            accuracy=correct / self.n_scored if self.n_scored else None,
            cost=cost,
        )

    def curve(self) -> list[Point]:
        """``CURVE_POINTS`` points at even escalation fractions of the gated questions."""
        steps = CURVE_POINTS - 1
        return [self.points[(2 * i * self.m + steps) // (2 * steps)] for i in range(CURVE_POINTS)]

    def cheapest_reaching(self, accuracy: float | None) -> Point | None:
        """The cheapest point whose accuracy is at least ``accuracy`` (None: none is)."""
        if accuracy is None:
            return None
        reaching = [p for p in self.points if p.accuracy is not None and p.accuracy >= accuracy]
        return min(reaching, key=lambda p: p.cost) if reaching else None


def cost_summary(
    sweep: Sweep, operating: Point, strong_accuracy: float | None, price: Mapping[str, float]
) -> dict[str, Any]:
    """The cost block of ``summary.json``."""
    at = sweep.cheapest_reaching(strong_accuracy)
    base = sweep.strong_only_cost

    def saved(cost: float) -> float | None:
        return 1.0 - cost / base if base > 0 else None

    return {
        "per_1k_tokens": dict(price),
        "strong_only": base,
        "cascade": operating.cost,
        "saved": saved(operating.cost),
        "at_strong_accuracy": None
        if at is None
        else {
            "strong_accuracy": strong_accuracy,
            "escalation_rate": at.escalation_rate,
            "accuracy": at.accuracy,
            "cost": at.cost,
            "saved": saved(at.cost),
        },
    }
