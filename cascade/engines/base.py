"""The one small interface every tier implements, and the capabilities some tiers add. What
crosses them lives in ``cascade.calls``."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from cascade.calls import CallPreview, EngineAnswer, EngineCall


@runtime_checkable
class Engine(Protocol):
    """A tier. ``name`` is the configured name policies refer to (``laya``, ``clef``).

    ``answer`` contract: returns one ``QuestionResult`` per question of ``call`` (ids and types
    preserved). The engine owns its own timeouts and queue. Only ``cascade.errors`` exceptions
    escape: ``ClientError`` subclasses for requests this tier can never serve (too long, bad
    option order), ``Overloaded`` when its queue is full, ``EngineError`` subclasses for its own
    failures. It must be safe to call concurrently from the event loop and must never block it.

    Optional declaration: ``independent_questions = True`` says each question's result and
    usage depend on the call's state, model, images and controls and on that question alone
    (Laya reads one row per question), never on the other questions, and ``usage.row_tokens``
    gives each question's input tokens. The decision cache then keys such a tier per question
    (``answers_each_question``); any other tier is joint (Clef's head reads every question
    together; an upstream is opaque) and keyed by the whole call.
    """

    name: str

    async def start(self) -> None:
        """Load and warm up. ``ready()`` is true afterwards."""

    async def answer(self, call: EngineCall) -> EngineAnswer: ...

    def ready(self) -> bool: ...

    def health(self) -> dict[str, Any]:
        """Details for ``/health`` (checkpoint, revision, device, demo flag, queue depth)."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Previewing(Protocol):
    """The preview capability (Laya): a call's rows counted by the tier's tokenizer, without
    inference, for pre-routing. ``checkpoint=None`` is the tier's own choice from the model
    alias, task, lang and script (its ``default_checkpoint`` by default). Test a tier with
    ``isinstance(engine, Previewing)``."""

    def preview(self, call: EngineCall, *, checkpoint: str | None = None) -> CallPreview: ...


@runtime_checkable
class Waiting(Protocol):
    """The queue-wait capability (in-process tiers with admission, Clef): the seconds a new
    request would wait now before its batch starts, as admission predicts it (corrected)."""

    def expected_wait(self) -> float: ...


def answers_each_question(engine: object) -> bool:
    """Whether ``engine`` declares ``independent_questions = True`` (see ``Engine``)."""
    return getattr(engine, "independent_questions", False) is True
