"""Small facts about a wire question that every layer shares: option bands, option counts,
the keys clients see, and how a criterion renders as text."""

from __future__ import annotations

import json
from typing import Any, Literal

from cascade.schema import ChoiceQuestion, NoulQuestion, Question, ScoreQuestion

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
