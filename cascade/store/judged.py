"""Judged cheap answers of the store's rows: what a refit learns from.

A row's feedback label (``labels``) judges its cheap answer with source ``feedback``; a shadow
row (``shadow = 1``: a random sample of cheap-final requests) takes the strong tier's top answer
as the label, source ``shadow``. Escalated rows are never shadow evidence: the gate chose them
(see ``cascade.eval.from_log``). Judging is ``cascade.control.labels.judged``, as for feedback
arriving live. ``shared_evidence`` reads a fleet's store for its refit
(``cascade.control.fleetrefit``); ``cascade.eval.labelled`` reads log files.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

import msgspec

from cascade.control.evidence import Labelled
from cascade.control.labels import Source, asked_key, judged
from cascade.control.refit import LABELS
from cascade.policy.model import Policy
from cascade.questions import answer_label
from cascade.schema import Question
from cascade.store.rows import LogRow

SOURCES: tuple[Source, ...] = ("feedback", "shadow")


def row_evidence(policy: Policy, row: LogRow, source: Source) -> Labelled | None:
    """The row's cheap answer judged by its label or its shadow answer (None: it has no cheap
    answer or no judge of that kind)."""
    if row.cheap is None:
        return None
    question = msgspec.convert(row.question, Question)
    if source == "feedback" and row.label is not None:
        return judged(
            policy,
            question,
            row.cheap.probabilities,
            row.label.value,
            source,
            row.ts,
            tenant=row.label.tenant,
            asked=asked_key(row.id, row.ts),
        )
    if source == "shadow" and row.shadow and row.strong is not None:
        truth = answer_label(question, row.strong.probabilities)
        return judged(policy, question, row.cheap.probabilities, truth, source, row.ts)
    return None


def evidence(
    policy: Policy, rows: Iterable[LogRow], sources: Collection[Source] = SOURCES
) -> Iterator[Labelled]:
    """Every judged answer of ``rows``, in row order (a row labelled and shadowed gives two)."""
    for row in rows:
        for source in SOURCES:
            if source in sources and (found := row_evidence(policy, row, source)) is not None:
                yield found


def shared_evidence(url: str, policy: Policy) -> list[Labelled]:
    """The judged answers ``policy``'s refit learns from in the PostgreSQL store at ``url``:
    per cell the ``LABELS`` most recent labelled rows (and shadow rows, where its teacher
    counts them), oldest first, judged under ``policy`` (blocking: a thread's)."""
    from cascade.store import postgres

    control = policy.control
    shadow = control is not None and control.teacher != "feedback"
    rows = postgres.read_judged(url, per_cell=LABELS, shadow=shadow)
    return list(evidence(policy, rows, SOURCES if shadow else ("feedback",)))
