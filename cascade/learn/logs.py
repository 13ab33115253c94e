"""Items from decision logs: the questions the strong tier answered, weighted back to traffic.

The population distil learns for is every question the cheap tier answered (``cheap`` set, not
degraded): those it kept and those its gate escalated. A log holds the strong tier's answer for
two parts of it, sampled very differently:

- **escalations** (``shadow = 0``, final tier not the cheap one): every escalated question, so
  each stands for itself: weight 1. They are not a random sample (the gate chose them for low
  confidence), which is why they cannot be used alone;
- **shadow samples** (``shadow = 1``): a random share of the requests the cheap tier answered
  alone. Each stands for ``N_cheap_final / N_shadow`` questions, the measured inverse sampling
  rate over every cheap-final question in the logs (skipped shadows and requests that could not
  be shadowed, because one of their questions escalated, are counted in ``N_cheap_final``).

With these inverse-probability weights the training loss and the held-back figures estimate
their value over all the questions the cheap tier answered, not over the hard ones only. The
estimate assumes the cheap-final questions no shadow could reach resemble the shadowed ones.
Weights are scaled to average 1. Left out: questions pre-routed to the strong tier (the cheap
tier never answers them), rows without the state text (``state_mode`` hash or none) and
degraded answers.
"""

from __future__ import annotations

import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from cascade.calls import EngineCall
from cascade.eval.data import Item
from cascade.learn.source import SourceError
from cascade.schema import Question
from cascade.store import LogRow, read_rows


def escalated(row: LogRow) -> bool:
    return row.cheap is not None and row.final_tier != row.cheap.tier


class ShadowRate:
    """``N_cheap_final / N_shadow`` over the cheap-final rows seen (1.0 when there is no
    shadow), counted row by row: the rows need not be kept."""

    def __init__(self) -> None:
        self.final = self.shadowed = 0

    def see(self, row: LogRow) -> None:
        if row.cheap is not None and not row.degraded and not escalated(row):
            self.final += 1
            self.shadowed += row.shadow and row.strong is not None

    @property
    def inverse(self) -> float:
        return self.final / self.shadowed if self.shadowed else 1.0


def _usable(row: LogRow, left_out: Counter[str]) -> bool:
    if row.strong is None or row.degraded:
        return False
    if row.cheap is None:
        left_out["pre_routed"] += 1
    elif row.state_mode != "text" or row.state is None:
        left_out["no_state_text"] += 1
    else:
        return True
    return False


def read_log(
    paths: Iterable[str | Path], *, since: float | None = None, tenant: str | None = None
) -> tuple[list[Item], dict[str, Any], dict[str, Any]]:
    """The items of decision logs (rotated files included, each passed), what was left out,
    and the teacher's identity (its tier names and weight hashes, as the log recorded them).
    Rows stream past; only the usable ones (a strong answer and the state text) are kept."""
    rate = ShadowRate()
    left_out: Counter[str] = Counter()
    groups: dict[tuple[str, bool], list[LogRow]] = defaultdict(list)
    for path in paths:
        try:
            for row in read_rows(path, since=since, tenant=tenant):
                rate.see(row)
                if _usable(row, left_out):
                    groups[(row.request_id, row.shadow)].append(row)
        except (OSError, ValueError, sqlite3.Error) as exc:
            raise SourceError(f"{path}: {exc}") from exc
    shadow_weight = rate.inverse
    items = [
        _item(group, shadow_weight if shadow else 1.0) for (_, shadow), group in groups.items()
    ]
    if not items:
        raise SourceError(
            "no usable rows: the logs hold no strong answers to questions the "
            "cheap tier answered, with the state text stored (state_mode text)"
        )
    mean = sum(i.weight * len(i.call.questions) for i in items) / sum(
        len(i.call.questions) for i in items
    )
    items = [msgspec.structs.replace(i, weight=i.weight / mean) for i in items]
    counts = Counter("shadow" if r.shadow else "escalation" for g in groups.values() for r in g)
    about = {
        "source": "decision log",
        "tiers": sorted({r.strong.tier for g in groups.values() for r in g if r.strong}),
        "checkpoints": {k: v for g in groups.values() for r in g for k, v in r.checkpoints.items()},
        "rows": dict(counts),
        "shadow_weight": round(shadow_weight / mean, 6),
        "escalation_weight": round(1.0 / mean, 6),
    }
    return items, dict(left_out), about


def _item(rows: list[LogRow], weight: float) -> Item:
    questions: dict[str, Question] = {}
    teacher: dict[str, list[float]] = {}
    for row in rows:  # the latest row wins if a request repeats a question id
        assert row.strong is not None
        questions[row.question_id] = msgspec.convert(row.question, Question)
        teacher[row.question_id] = row.strong.probabilities
    first = rows[0]
    call = EngineCall(
        state=first.state, questions=questions, model=first.model, request_id=first.request_id
    )
    return Item(id=first.request_id, call=call, weight=weight, teacher=teacher)
