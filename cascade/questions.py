"""Small facts about a wire question that every layer shares: option bands, option counts,
the keys clients see, how a criterion renders as text, and labels (the shapes of ``cascade eval``
data and ``POST /v1/feedback``: the choice key, true/false for a noul, the level index)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from cascade.schema import ChoiceQuestion, Label, NoulQuestion, Question, ScoreQuestion

Band = Literal["2", "3-5", "6-10", "11+"]
BANDS: tuple[Band, ...] = ("2", "3-5", "6-10", "11+")
# The largest option count of each band. max p >= 1/n, so a confidence threshold at or below
# 1/n_max can never be undercut by any question of that band.
BAND_MAX_OPTIONS: dict[Band, int | None] = {"2": 2, "3-5": 5, "6-10": 10, "11+": None}


def option_band(n_options: int) -> Band:
    """Laya's temperature bucket for a question with ``n_options`` options (noul: 2)."""
    if n_options <= 2:
        return "2"
    if n_options <= 5:
        return "3-5"
    if n_options <= 10:
        return "6-10"
    return "11+"


def n_options(question: Question) -> int:
    """Options of a choice, levels of a score, 2 for a noul."""
    if isinstance(question, NoulQuestion):
        return 2
    return len(question.criteria)


def render_text(value: Any) -> str:
    """Laya's rendering of a level or description: strings as they are, else one-line JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def option_names(question: Question) -> list[str]:
    """The keys a client sees in ``probabilities``, in the caller's order."""
    if isinstance(question, ChoiceQuestion):
        if isinstance(question.criteria, dict):
            return list(question.criteria)
        return [json.dumps(c) if not isinstance(c, str) else c for c in question.criteria]
    if isinstance(question, ScoreQuestion):
        return [str(i) for i in range(len(question.criteria))]
    return ["false", "true"]


def answer_label(question: Question, probabilities: Sequence[float]) -> Label:
    """The predicted label: argmax, the first maximum in the caller's order winning (as
    ``cascade.answers`` picks a choice)."""
    best = 0
    for i, p in enumerate(probabilities):
        if p > probabilities[best]:
            best = i
    if isinstance(question, ChoiceQuestion):
        return option_names(question)[best]
    if isinstance(question, NoulQuestion):
        return best == 1
    return best


def label_index(question: Question, label: Any) -> int | None:
    """The option index of a gold label (None when it names no option)."""
    if isinstance(question, ChoiceQuestion):
        names = option_names(question)
        return names.index(label) if label in names else None
    if isinstance(question, NoulQuestion):
        return int(label) if isinstance(label, bool) else None
    n = len(question.criteria)
    ok = isinstance(label, int) and not isinstance(label, bool) and 0 <= label < n
    return label if ok else None
