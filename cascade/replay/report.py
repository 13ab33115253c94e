"""A replay's report: the candidate against what was served, on the questions it could judge.

Shares and changes are over the judged questions. Accuracy is over those with a judge: a
feedback label (``labelled``) or, separately, the strong tier's shadow answer (``shadow``,
strong as teacher: a strong answer is right by definition there). Kept-answer accuracy is over
the judged answers each version kept on the cheap tier. Cost is ``cascade eval``'s model: each
question's share of its tier calls' input tokens at a price per 1000 (shadow calls left out on
both sides).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from html import escape
from typing import Any

from cascade.replay.judge import REASONS, Judged, Side

EXAMPLES = 20  # changed questions listed in the report


def summarize(
    judged: list[Judged],
    unjudged: Mapping[str, int],
    *,
    requests: int,
    prices: Mapping[str, float],
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """The report as one JSON-able object (``meta``: what was replayed, first)."""
    answered = [j for j in judged if j.candidate.tier is not None]
    changed = [j for j in judged if _changed(j)]
    moves = Counter(f"{j.served.tier}_to_{j.candidate.tier}" for j in answered)
    return {
        **meta,
        "requests": requests,
        "questions": len(judged) + sum(unjudged.values()),
        "judged": len(judged),
        "not_judged": {reason: unjudged.get(reason, 0) for reason in REASONS},
        "candidate_refused": len(judged) - len(answered),
        "strong_share": {
            "served": _share(judged, "served"),
            "candidate": _share(answered, "candidate"),
        },
        "tier_changes": {
            change: moves[change] for change in ("cheap_to_strong", "strong_to_cheap")
        },
        "answers_changed": sum(j.served.answer != j.candidate.answer for j in answered),
        "called": {
            slot: sum(slot in j.candidate.called for j in answered) for slot in ("cheap", "strong")
        },
        "labelled": _accuracy([(j, j.label) for j in answered if j.label is not None]),
        "shadow": {
            "teacher": "strong",
            **_accuracy([(j, j.teacher) for j in answered if j.teacher is not None]),
        },
        "cost": _cost(answered, prices),
        "changed": [_example(j) for j in changed[:EXAMPLES]],
    }


def _changed(j: Judged) -> bool:
    return j.served.tier != j.candidate.tier or j.served.answer != j.candidate.answer


def _share(judged: list[Judged], side: str) -> float | None:
    if not judged:
        return None
    return sum(getattr(j, side).tier == "strong" for j in judged) / len(judged)


def _rate(pairs: Iterable[tuple[Side, Any]]) -> tuple[int, float | None]:
    found = [side.answer == truth for side, truth in pairs]
    return len(found), (sum(found) / len(found) if found else None)


def _accuracy(judged: list[tuple[Judged, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"questions": len(judged)}
    for side in ("served", "candidate"):

        def pick(j: Judged, s: str = side) -> Side:
            return getattr(j, s)

        _, accuracy = _rate((pick(j), truth) for j, truth in judged)
        kept, kept_accuracy = _rate(
            (pick(j), truth) for j, truth in judged if pick(j).tier == "cheap"
        )
        out[side] = {"accuracy": accuracy, "kept": kept, "kept_accuracy": kept_accuracy}
    return out


def _cost(judged: list[Judged], prices: Mapping[str, float]) -> dict[str, Any]:
    def total(side: Callable[[Judged], Side]) -> float:
        return sum(
            tokens * prices.get(slot, 0.0) / 1000
            for j in judged
            for slot, tokens in side(j).tokens.items()
        )

    served, candidate = total(lambda j: j.served), total(lambda j: j.candidate)
    return {
        "per_1k_tokens": dict(prices),
        "served": served,
        "candidate": candidate,
        "change": None if not served else candidate / served - 1,
    }


def _example(j: Judged) -> dict[str, Any]:
    return {
        "request": j.request,
        "tenant": j.tenant,
        "question": j.question,
        "served": {"tier": j.served.tier, "answer": j.served.answer},
        "candidate": {"tier": j.candidate.tier, "answer": j.candidate.answer},
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def lines(report: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The report's figures as (figure, served, candidate) rows, for the table and the HTML."""
    share, cost = report["strong_share"], report["cost"]
    rows = [("strong share", _pct(share["served"]), _pct(share["candidate"]))]
    for key, title in (("labelled", "labelled"), ("shadow", "shadow (strong as teacher)")):
        part = report[key]
        served, candidate = part["served"], part["candidate"]
        rows += [
            (
                f"accuracy, {title} (n={part['questions']})",
                _pct(served["accuracy"]),
                _pct(candidate["accuracy"]),
            ),
            (
                f"kept-answer accuracy, {title}",
                f"{_pct(served['kept_accuracy'])} of {served['kept']}",
                f"{_pct(candidate['kept_accuracy'])} of {candidate['kept']}",
            ),
        ]
    rows.append(
        (
            "cost ("
            + ", ".join(f"{s} {p:g}" for s, p in cost["per_1k_tokens"].items())
            + " per 1k tokens)",
            f"{cost['served']:.4f}",
            f"{cost['candidate']:.4f}",
        )
    )
    return rows


def headline(report: Mapping[str, Any]) -> list[str]:
    changes, called = report["tier_changes"], report["called"]
    skipped = ", ".join(f"{n} {reason}" for reason, n in report["not_judged"].items() if n)
    return [
        f"{report['requests']} requests, {report['questions']} questions: {report['judged']} "
        f"judged, {report['questions'] - report['judged']} not judged"
        + (f" ({skipped})" if skipped else "")
        + (" (--limit cut the log short)" if report.get("truncated") else ""),
        f"tier changes: {changes['cheap_to_strong']} cheap->strong, "
        f"{changes['strong_to_cheap']} strong->cheap; answers changed: "
        f"{report['answers_changed']}; refused by the candidate: {report['candidate_refused']}",
        *(
            [
                f"asked live (--call-tiers): {called['cheap']} cheap, {called['strong']} strong "
                "answers"
            ]
            if any(called.values())
            else []
        ),
    ]


def table(report: Mapping[str, Any]) -> str:
    """The report as text: the headline lines, then the figures side by side."""
    rows = lines(report)
    width = max(len(r[0]) for r in rows)
    out = [*headline(report), f"{'':<{width}}  {'served':>16}  {'candidate':>16}"]
    out += [f"{name:<{width}}  {served:>16}  {candidate:>16}" for name, served, candidate in rows]
    return "\n".join(out)


def html(report: Mapping[str, Any]) -> str:
    """A small self-contained HTML page of the report."""
    cells = "".join(
        f"<tr><td>{escape(a)}</td><td>{escape(b)}</td><td>{escape(c)}</td></tr>"
        for a, b, c in lines(report)
    )
    changed = "".join(
        f"<tr><td>{escape(c['request'])}</td><td>{escape(c['question'])}</td>"
        f"<td>{escape(str(c['served']['tier']))}: {escape(str(c['served']['answer']))}</td>"
        f"<td>{escape(str(c['candidate']['tier']))}: {escape(str(c['candidate']['answer']))}"
        "</td></tr>"
        for c in report["changed"]
    )
    heads = "".join(f"<p>{escape(line)}</p>" for line in headline(report))
    return (
        "<!doctype html><meta charset=utf-8><title>cascade replay</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}</style>"
        f"<h1>cascade replay: {escape(str(report.get('candidate', {}).get('policy', '')))}</h1>"
        f"{heads}<table><tr><th></th><th>served</th><th>candidate</th></tr>{cells}</table>"
        f"<h2>Changed questions (first {EXAMPLES})</h2><table><tr><th>request</th>"
        f"<th>question</th><th>served</th><th>candidate</th></tr>{changed}</table>\n"
    )
