"""The figures of ``cascade bench fleet`` from what its runs recorded (``cascade.bench.fleet``):
per scope and phase, the table and the JSON.

- Strong share: questions another tier than ``laya`` answered over answered questions, the
  fleet's (every replica's answers together) and each replica's. Windows of ``window_s`` slide
  in steps of a twentieth of it inside the phase (a phase shorter than the window is one
  window; a window of fewer than ``MIN_WINDOW`` questions is not judged); the worst is judged
  against the budget + 0.02 (issue 32's tolerance).
- Kept accuracy: the yes/no answers the cheap tier gave as final, against their labels.
- Threshold spread: the largest difference of one cell's threshold across live replicas, at the
  phase's end and the most over the samples.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from cascade.bench.fleet import FleetOptions, ObservedAnswer, Record

TOLERANCE = 0.02
MIN_WINDOW = 20  # questions a window needs to be judged (the pacer's own minimum)


def worst_window(
    answers: Sequence[ObservedAnswer], start: float, end: float, window_s: float
) -> float | None:
    """The highest strong share over windows of ``window_s`` in [start, end] with at least
    ``MIN_WINDOW`` questions (else over the whole span)."""
    if end - start <= window_s:
        spans = [(start, end)]
    else:
        step = window_s / 20
        count = int((end - start - window_s) / step + 1e-9) + 1
        spans = [(start + i * step, start + i * step + window_s) for i in range(count)]
    shares = []
    for lo, hi in spans:
        inside = [a.strong for a in answers if lo <= a.t <= hi]
        if len(inside) >= MIN_WINDOW:
            shares.append(sum(inside) / len(inside))
    return max(shares, default=_share([a for a in answers if start <= a.t <= end]))


def _share(answers: Sequence[ObservedAnswer]) -> float | None:
    return sum(a.strong for a in answers) / len(answers) if answers else None


def _ms(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": statistics.median(values) if values else None,
        "max": max(values, default=None),
    }


def summarize(records: Sequence[Record], opts: FleetOptions) -> dict[str, Any]:
    scopes = {}
    for record in records:
        phases = []
        for phase in record.phases:
            answers = [a for a in record.answers if a.phase == phase.name]
            kept = [a.correct for a in answers if a.correct is not None]
            worst = worst_window(answers, phase.start, phase.end, opts.window_s)
            phases.append(
                {
                    "phase": phase.name,
                    "questions": len(answers),
                    "hard": sum(a.hard for a in answers),
                    "strong_share": _share(answers),
                    "worst_window": worst,
                    "over_budget": worst is not None and worst > opts.budget + TOLERANCE,
                    "replicas": {
                        name: _share([a for a in answers if a.replica == name])
                        for name in record.replicas
                        if any(a.replica == name for a in answers)
                    },
                    "kept": {"n": len(kept), "accuracy": sum(kept) / len(kept) if kept else None},
                    "spread": {
                        "end": phase.spreads[-1] if phase.spreads else None,
                        "max": max(phase.spreads, default=None),
                    },
                    "pacing": phase.pacing,
                    "thresholds": phase.thresholds,
                    "refit": phase.refits,
                    "feedback": phase.feedback,
                    "labels": {
                        "stored_ms": _ms(phase.stored_ms),
                        "refit_s": phase.refit_s,
                        "refit_grew": phase.refit_grew,
                    },
                    "reload": {"ms": phase.reload_ms, **phase.reload},
                    "joined_s": phase.joined_s,
                }
            )
        scopes[record.scope] = {
            "replicas": record.replicas,
            "failures": record.failures,
            "phases": phases,
        }
    return {
        "bench": "fleet",
        "replicas": opts.replicas,
        "budget": opts.budget,
        "target": opts.target,
        "phase_s": opts.phase_s,
        "window_s": opts.window_s,
        "refit_interval_s": opts.refit_s,
        "clients": opts.clients,
        "feedback_share": opts.feedback_share,
        "scopes": scopes,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _fleet_paced(phase: dict[str, Any]) -> float | None:
    total = sum(phase["pacing"].values())
    return phase["pacing"].get("fleet", 0) / total if total else None


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['replicas']} demo replicas, {result['clients']} clients, phases of "
        f"{result['phase_s']:g} s (a: one replica 70 % + most hard items; b: the mix changes; "
        "c: it is killed, one joins)",
        f"budget {result['budget']:g} (+{TOLERANCE:g}) over {result['window_s']:g} s windows; "
        f"target {result['target']:g} for kept answers; refit every "
        f"{result['refit_interval_s']:g} s; feedback on {result['feedback_share']:.0%}",
        f"{'phase':<6}{'scope':<9}{'questions':>10}{'share':>7}{'worst':>7}{'hot':>6}"
        f"{'paced':>7}{'kept acc':>9}{'spread':>13}{'label ms':>9}{'refit s':>9}"
        f"{'reload ms':>14}",
    ]
    for name in ("a", "b", "c"):
        for scope, run in result["scopes"].items():
            p = next((x for x in run["phases"] if x["phase"] == name), None)
            if p is None:
                continue
            hot = max(p["replicas"].values(), default=None, key=lambda s: s or 0)
            spread = f"{_num(p['spread']['end'], '.3f')}/{_num(p['spread']['max'], '.3f')}"
            labels, reload = p["labels"], p["reload"]
            grew = len(labels["refit_grew"])
            live = len(p["thresholds"]) or grew
            refit = (
                _num(labels["refit_s"], ".1f")
                if labels["refit_s"] is not None
                else f"{grew}/{live}"
            )
            seen = len(reload.get("answered", []))
            asked = seen + len(reload.get("not_answered", []))
            lines.append(
                f"{name:<6}{scope:<9}{p['questions']:>10}{_pct(p['strong_share']):>7}"
                f"{_pct(p['worst_window']):>7}{_pct(hot):>6}{_pct(_fleet_paced(p)):>7}"
                f"{_pct(p['kept']['accuracy']):>9}"
                f"{spread:>13}{_num(labels['stored_ms']['p50'], '.0f'):>9}{refit:>9}"
                f"{_num(reload['ms'], '.0f'):>8} {seen}/{asked}"
            )
    lines += [
        "share: the fleet's strong share; worst: its worst window; hot: the highest replica's "
        "share; paced: share of 2 s samples a replica paced on the fleet's counts; spread: "
        "threshold difference across replicas, end/max; label ms: feedback "
        "posted until read in PostgreSQL (p50); refit s: until every replica's gate has them "
        "(refit n grew, or a fleet fit published after; k/n: only k replicas'); "
        "reload ms: fleet reload round trip, replicas answered/seen",
    ]
    joins = [
        f"{scope}: {p['joined_s']:.1f} s"
        for scope, run in result["scopes"].items()
        for p in run["phases"]
        if p["joined_s"] is not None
    ]
    if joins:
        lines.append("phase c: the new replica ready after " + ", ".join(joins))
    return "\n".join(lines)
