"""Judged cheap answers from decision log rows: a row's feedback label, or its shadow answer.

A row becomes evidence only when the cheap tier answered its question (``cheap`` is set, final
or escalated: a label is independent of the gate, so low-confidence answers count too).
``confidence`` is the gate's view under the policy given (its calibration temperature applied,
``gate_view``): the refit moves the thresholds of that policy. Shadow rows (``shadow = 1``: a
random sample of cheap-final requests) take the strong tier's top answer as the label;
escalated rows never do (see ``cascade.eval.from_log``: the gate chose them).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from cascade.calls import QuestionResult
from cascade.control.evidence import Labelled
from cascade.eval.data import answer_label, label_index
from cascade.eval.decision_log import LogRow, read_rows
from cascade.policy.calibration import gate_view
from cascade.policy.model import Policy
from cascade.questions import n_options, option_band
from cascade.schema import Question

Source = Literal["feedback", "shadow"]


def judged(policy: Policy, row: LogRow, source: Source) -> Labelled | None:
    """The row's cheap answer judged by its feedback label or its shadow answer (None: the row
    has no cheap answer, or no judge of that kind)."""
    if row.cheap is None:
        return None
    question = msgspec.convert(row.question, Question)
    if source == "feedback":
        if row.label is None:
            return None
        truth = label_index(question, row.label.value)
    else:
        if not row.shadow or row.strong is None:
            return None
        truth = label_index(question, answer_label(question, row.strong.probabilities))
    cheap = QuestionResult(type=question.type, probabilities=row.cheap.probabilities)
    top = label_index(question, answer_label(question, cheap.probabilities))
    return Labelled(type=question.type, band=option_band(n_options(question)),
                    confidence=max(gate_view(policy, cheap).probabilities),
                    correct=truth is not None and top == truth, source=source, ts=row.ts)


def evidence(policy: Policy, rows: Iterable[LogRow],
             sources: Collection[Source] = ("feedback", "shadow")) -> Iterator[Labelled]:
    """Every judged answer of ``rows``, in row order (a row labelled and shadowed gives two)."""
    for row in rows:
        for source in ("feedback", "shadow"):
            if source in sources and (found := judged(policy, row, source)) is not None:
                yield found


def read_labelled(paths: Sequence[str | Path], policy: Policy,
                  sources: Collection[Source] = ("feedback", "shadow")) -> list[Labelled]:
    """The judged answers of decision log files (oldest first: pass rotated files, ``FILE.2``
    ``FILE.1`` ``FILE``, in that order), for a controller's warm start."""
    return [found for path in paths for found in evidence(policy, read_rows(path), sources)]
