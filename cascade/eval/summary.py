"""``summary.json``: every figure computed from the ``items.jsonl`` rows alone.

``tiers.cheap`` and ``tiers.strong`` score each tier on the questions it answered;
``tiers.cascade`` scores the cascade's answers and adds ``escalation_rate`` (share of the
questions the strong tier answered, pre-routed included), ``confidence_escalation_rate`` (share
of the questions whose cheap answer reached the confidence gate that it escalated, on
confidence or margin: the flow's own record, ``Decision.gate``, as ``cascade calibrate
--target-escalation`` counts them; ``gated_questions`` counts them), ``fixed`` / ``broke``
(over questions with a cheap answer and a gold label: cheap wrong and cascade right, and the
reverse), the ``deferral_curve``
(``cascade.eval.sweep``) with its ``operating_point``, and ``cost``. A tier that is not
configured is null. ``agreement`` needs no gold: over the questions both tiers answered, the
share where the cheap tier's answer equals the strong tier's (what ``cascade distill`` raises),
overall and per question type. ``signals``: per escalation signal of the cheap answers
(``low_confidence``, ``low_margin``, ``order_unstable``, ``novel``; ``kept`` for the answers
none escalated), how many questions it took and the accuracy of their cheap answers against
gold (a signal earns its escalations when that accuracy is below the kept ones').
``order_check``: the option-order check's questions, the share whose winner moved, the cheap
accuracy of moved and stable answers, and its added cheap-tier rows and input tokens per item
(null without ``[consistency]`` or when it checked nothing). ``novelty``: the questions the
novelty gate judged and the share it flagged (above its cell's threshold, whatever rule sent
them), overall and per item ``source`` (null without a reference set).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from cascade.eval.decide import ItemRow, cascade_probabilities, gate_escalated, reaches_gate
from cascade.eval.scores import Scored, breakdown
from cascade.eval.sweep import Point, Sweep, cascade_cost, cost_summary, decided


def scored(rows: Sequence[ItemRow], slot: str) -> list[Scored]:
    """The answers of ``slot`` (cheap, strong or cascade) that have a gold label."""
    out = []
    for row in rows:
        if row.gold_index is None:
            continue
        if slot == "cascade":
            answer = row.cascade.answer if row.cascade is not None else None
            probabilities = cascade_probabilities(row)
        else:
            tier = row.cheap if slot == "cheap" else row.strong
            answer = tier.answer if tier is not None else None
            probabilities = tier.probabilities if tier is not None else None
        if probabilities is None:
            continue
        out.append(
            Scored(
                type=row.type,
                band=row.band,
                question=row.question,
                gold=row.gold,
                answer=answer,
                gold_index=row.gold_index,
                probabilities=probabilities,
            )
        )
    return out


def summarize(
    rows: Sequence[ItemRow],
    *,
    slots: Sequence[str],
    price: Mapping[str, float],
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """The summary of ``rows``; ``slots``: the configured tiers (cheap, strong)."""
    tiers: dict[str, Any] = {
        slot: breakdown(scored(rows, slot)) if slot in slots else None
        for slot in ("cheap", "strong")
    }
    answered = decided(rows)
    population = [r for r, _ in answered]
    cascade = breakdown(scored(rows, "cascade"))
    gated = [r for r in population if reaches_gate(r)]
    judged = [(r, c) for r, c in answered if r.cheap is not None and r.gold_index is not None]
    sweep = Sweep(rows, price)
    operating = Point(
        escalation_rate=_share(population, lambda r: r.cascade.tier == "strong") or 0.0,
        accuracy=cascade["accuracy"],
        cost=sum(cascade_cost(r, c, price) for r, c in answered),
    )
    strong_accuracy = tiers["strong"]["accuracy"] if tiers["strong"] else None
    tiers["cascade"] = {
        **cascade,
        "questions": len(population),
        "escalation_rate": operating.escalation_rate,
        "gated_questions": len(gated),
        "confidence_escalation_rate": _share(gated, gate_escalated),
        "fixed": sum(not _right(r, r.cheap) and c.answer == r.gold for r, c in judged),
        "broke": sum(_right(r, r.cheap) and c.answer != r.gold for r, c in judged),
        "deferral_curve": msgspec.to_builtins(sweep.curve()),
        "operating_point": msgspec.to_builtins(operating),
        "cost": cost_summary(sweep, operating, strong_accuracy, price),
        "signals": signals(population),
        "order_check": order_check(rows),
        "novelty": novelty(rows),
    }
    return {
        **meta,
        "items": len({r.id for r in rows}),
        "questions": len(rows),
        "tiers": tiers,
        "agreement": agreement(rows),
    }


SIGNALS = ("low_confidence", "low_margin", "order_unstable", "novel")


def signals(rows: Sequence[ItemRow]) -> dict[str, Any]:
    """Per signal (and ``kept``): questions it escalated, and their cheap answers' accuracy."""
    cheap = [
        (r, c)
        for r in rows
        if r.cheap is not None and (c := r.cascade) is not None and not c.pre_routed
    ]
    out = {}
    for name in (*SIGNALS, "kept"):
        took = [r for r, c in cheap if c.reason == (None if name == "kept" else name)]
        if took:
            out[name] = {"questions": len(took), "cheap_accuracy": _accuracy(took)}
    return out


def order_check(rows: Sequence[ItemRow]) -> dict[str, Any] | None:
    """The option-order check's figures (see the module docstring)."""
    pairs = [(r, c) for r in rows if (c := r.cascade) is not None and c.order_stable is not None]
    if not pairs:
        return None
    checked = [r for r, _ in pairs]
    moved = [r for r, c in pairs if not c.order_stable]
    stable = [r for r, c in pairs if c.order_stable]
    items = len({r.id for r in rows}) or 1
    extra = sum(r.tokens.get("orders", 0.0) for r in rows)
    cheap = sum(r.tokens.get("cheap", 0.0) for r in rows)
    return {
        "checked": len(checked),
        "moved": len(moved),
        "flip_rate": len(moved) / len(checked),
        "cheap_accuracy_moved": _accuracy(moved),
        "cheap_accuracy_stable": _accuracy(stable),
        "extra_rows_per_item": sum(c.order_rows for _, c in pairs) / items,
        "extra_tokens_per_item": extra / items,
        "extra_token_share": extra / cheap if cheap else None,
    }


def novelty(rows: Sequence[ItemRow]) -> dict[str, Any] | None:
    """The novelty gate's flag rate, overall and per source (see the module docstring)."""
    judged = [
        (r, c.novelty) for r in rows if (c := r.cascade) is not None and c.novelty is not None
    ]
    if not judged:
        return None

    def rate(group: list[tuple[ItemRow, float]]) -> dict[str, Any]:
        flagged = sum(score > 1 for _, score in group)
        return {"judged": len(group), "flagged": flagged, "flag_rate": flagged / len(group)}

    sources = sorted({r.source for r, _ in judged})
    return {
        **rate(judged),
        "by_source": {s: rate([(r, x) for r, x in judged if r.source == s]) for s in sources},
    }


def _accuracy(rows: Sequence[ItemRow]) -> float | None:
    """The cheap answers' accuracy over ``rows`` with a gold label."""
    gold = [r for r in rows if r.gold_index is not None]
    return _share(gold, lambda r: _right(r, r.cheap))


def agreement(rows: Sequence[ItemRow]) -> dict[str, Any]:
    """Cheap-strong agreement (same answer) over the questions both tiers answered."""
    both = [r for r in rows if r.cheap is not None and r.strong is not None]

    def share(group: Sequence[ItemRow]) -> float | None:
        return _share(group, lambda r: r.cheap.answer == r.strong.answer)

    types = sorted({r.type for r in both})
    return {
        "questions": len(both),
        "cheap_strong": share(both),
        "by_type": {t: share([r for r in both if r.type == t]) for t in types},
    }


def _right(row: ItemRow, out: Any) -> bool:
    return out is not None and out.answer == row.gold


def _share(rows: Sequence[ItemRow], test: Any) -> float | None:
    return sum(bool(test(r)) for r in rows) / len(rows) if rows else None
