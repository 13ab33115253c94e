"""What the controllers learn from: one cheap answer, its cell, and whether it was right.

Feedback labels (``POST /v1/feedback``) and shadow answers of the strong tier (the teacher,
where the policy allows) both become ``Labelled`` answers; the refit reads only these. A
``Learner`` takes them as they come (the app's ``Services.learner``); ``cascade.eval.labelled``
reads a decision log's back (a warm start at boot).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec

from cascade.questions import Band
from cascade.schema import QuestionType


class Labelled(msgspec.Struct, frozen=True, kw_only=True):
    """The cheap tier's answer to one question, judged.

    ``confidence`` is what the gate read (max p, the calibration's temperature applied);
    ``correct`` whether the cheap tier's top answer matches the label. ``tenant``: who gave
    the label ("": no tenant named: auth off, an unnamed key, the strong tier's shadow answer).
    ``asked``: which asked question it judges (a feedback label: its decision-log row), so a
    relabel replaces its earlier judgement; None: an answer judged once (a shadow answer).
    """

    type: QuestionType
    band: Band
    confidence: float
    correct: bool
    source: Literal["feedback", "shadow"]
    ts: float  # wall-clock seconds of the request (time.time())
    tenant: str = ""
    asked: str | None = None


class Learner(Protocol):
    """What takes judged answers as they arrive (the refit). ``observe`` is called on the event
    loop, once per feedback call with its labels of cheap answers: it must return at once."""

    def observe(self, answers: Sequence[Labelled]) -> None: ...
