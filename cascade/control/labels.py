"""Labels of logged answers: whether a label fits its question, what storing a call's labels
found (``LabelOutcome``), and the judged cheap answer (``Labelled``) a label makes.

A label is judged against the cheap tier's answer whether the gate kept it or escalated it: a
label is independent of the gate, so low-confidence answers count too. ``confidence`` is the
gate's view under the policy given (its calibration temperature applied, ``gate_view``): the
refit moves that policy's thresholds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from cascade.calls import QuestionResult
from cascade.control.evidence import Labelled
from cascade.policy.calibration import gate_view
from cascade.policy.model import Policy
from cascade.questions import answer_label, label_index, n_options, option_band, option_names
from cascade.schema import Label, Question

Source = Literal["feedback", "shadow"]


class Logged(msgspec.Struct, frozen=True, kw_only=True):
    """One logged question, labelled: the question, the cheap tier's probabilities (None: it
    did not answer it), the label, the request's time, and the question's row in the log
    (``decisions.id``: which asked question it is)."""

    question: Question
    cheap: list[float] | None
    label: Label
    ts: float
    decision: int


class LabelOutcome(msgspec.Struct, kw_only=True):
    """What storing a call's labels did. ``found``: the request id has rows; ``unknown``:
    labelled question ids it did not ask; ``invalid``: question id -> why its label does not fit
    (nothing is stored unless both are empty); ``labelled``: the questions labelled;
    ``relabelled``: the ids of those that had a label already (the latest wins)."""

    found: bool
    unknown: list[str] = msgspec.field(default_factory=list)
    invalid: dict[str, str] = msgspec.field(default_factory=dict)
    labelled: list[Logged] = msgspec.field(default_factory=list)
    relabelled: list[str] = msgspec.field(default_factory=list)


def label_problem(question: Question, label: object) -> str | None:
    """Why ``label`` does not fit ``question`` (None: it fits)."""
    if label_index(question, label) is not None:
        return None
    if question.type == "noul":
        return "a noul label is true or false"
    if question.type == "score":
        return f"a score label is a level index, 0 to {n_options(question) - 1}"
    names = option_names(question)
    shown = ", ".join(map(repr, names[:10])) + (", ..." if len(names) > 10 else "")
    return f"a choice label is one of its options: {shown}"


def asked_key(decision: int, ts: float) -> str:
    """``Labelled.asked`` of a logged question: its row and its request's time (row ids start
    again in a rotated log's new file)."""
    return f"{decision}@{ts!r}"


def judged(
    policy: Policy,
    question: Question,
    cheap: Sequence[float] | None,
    truth: Label,
    source: Source,
    ts: float,
    *,
    tenant: str = "",
    asked: str | None = None,
) -> Labelled | None:
    """The cheap answer ``cheap`` judged by the label ``truth`` (None: no cheap answer), given
    by ``tenant``, of the asked question ``asked`` (``Labelled``)."""
    if cheap is None:
        return None
    result = QuestionResult(type=question.type, probabilities=list(cheap))
    right = label_index(question, truth)
    top = label_index(question, answer_label(question, cheap))
    return Labelled(
        type=question.type,
        band=option_band(n_options(question)),
        confidence=max(gate_view(policy, result).probabilities),
        correct=right is not None and top == right,
        source=source,
        ts=ts,
        tenant=tenant,
        asked=asked,
    )
