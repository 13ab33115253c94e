"""Judged cheap answers read back from decision logs (a live controller's warm start at boot).

A row's feedback label (``labels``) judges its cheap answer with source ``feedback``; a shadow
row (``shadow = 1``: a random sample of cheap-final requests) takes the strong tier's top answer
as the label, source ``shadow``. Escalated rows are never shadow evidence: the gate chose them
(see ``cascade.eval.from_log``). Judging is ``cascade.control.labels.judged``, as for feedback
arriving live.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path

import msgspec

from cascade.control.evidence import Labelled
from cascade.control.labels import Source, asked_key, judged
from cascade.policy.model import Policy
from cascade.questions import answer_label
from cascade.schema import Question
from cascade.store import LogRow, read_rows

SOURCES: tuple[Source, ...] = ("feedback", "shadow")


def row_evidence(policy: Policy, row: LogRow, source: Source) -> Labelled | None:
    """The row's cheap answer judged by its label or its shadow answer (None: it has no cheap
    answer or no judge of that kind)."""
    if row.cheap is None:
        return None
    question = msgspec.convert(row.question, Question)
    if source == "feedback" and row.label is not None:
        return judged(policy, question, row.cheap.probabilities, row.label.value, source,
                      row.ts, tenant=row.label.tenant, asked=asked_key(row.id, row.ts))
    if source == "shadow" and row.shadow and row.strong is not None:
        truth = answer_label(question, row.strong.probabilities)
        return judged(policy, question, row.cheap.probabilities, truth, source, row.ts)
    return None


def evidence(policy: Policy, rows: Iterable[LogRow],
             sources: Collection[Source] = SOURCES) -> Iterator[Labelled]:
    """Every judged answer of ``rows``, in row order (a row labelled and shadowed gives two)."""
    for row in rows:
        for source in SOURCES:
            if source in sources and (found := row_evidence(policy, row, source)) is not None:
                yield found


def read_labelled(paths: Sequence[str | Path], policy: Policy,
                  sources: Collection[Source] = SOURCES) -> list[Labelled]:
    """The judged answers of decision log files, oldest first (pass rotated files oldest
    first: ``FILE.2``, ``FILE.1``, ``FILE``)."""
    return [found for path in paths for found in evidence(policy, read_rows(path), sources)]
