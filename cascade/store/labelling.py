"""Storing a feedback call's labels, whichever backend holds the rows: all or none."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from cascade.control.labels import LabelOutcome, Logged, label_problem
from cascade.schema import Question
from cascade.store.rows import LogRow


def store_labels(
    rows: Mapping[str, LogRow], labels: Mapping[str, Any], upsert: Callable[[LogRow, Any], object]
) -> LabelOutcome:
    """Label ``rows`` (the latest row of each question of one tenant's request, by question
    id; empty: no such request) with ``labels`` through ``upsert(row, label)``: every label,
    or none when one names a question not asked or does not fit its question."""
    if not rows:
        return LabelOutcome(found=False)
    outcome = LabelOutcome(found=True, unknown=[q for q in labels if q not in rows])
    questions = {q: msgspec.convert(rows[q].question, Question) for q in labels if q in rows}
    for qid, question in questions.items():
        if (why := label_problem(question, labels[qid])) is not None:
            outcome.invalid[qid] = why
    if outcome.unknown or outcome.invalid:
        return outcome
    for qid, value in labels.items():
        row = rows[qid]
        upsert(row, value)
        if row.label is not None:
            outcome.relabelled.append(qid)
        outcome.labelled.append(
            Logged(
                question=questions[qid],
                label=value,
                ts=row.ts,
                cheap=(None if row.cheap is None else row.cheap.probabilities),
                decision=row.id,
            )
        )
    return outcome
