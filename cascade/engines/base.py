"""The one small interface every tier implements, and the structs that cross it.

An engine receives an already validated request (``EngineCall``) and returns raw, unrounded
probabilities per question (``EngineAnswer``). Answer shapes, confidences and rounding are the
gateway's job (``cascade.answers``), so every tier is reported the same way to clients.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

from cascade.schema import Controls, OptionSpans, Question, QuestionType


class Image(msgspec.Struct, frozen=True):
    """An image the gateway already decoded and checked (format, bytes, pixels)."""

    data: bytes
    mime: str  # image/png, image/jpeg or image/webp
    width: int
    height: int


class EngineCall(msgspec.Struct, kw_only=True):
    state: str | dict[str, Any] | list[Any]
    questions: dict[str, Question]
    model: str  # the name the client asked for; upstream engines may forward it
    images: list[Image] = msgspec.field(default_factory=list)
    controls: Controls = msgspec.field(default_factory=Controls)
    request_id: str = ""


class QuestionResult(msgspec.Struct, kw_only=True):
    """Unrounded probabilities for one question, in the caller's order.

    choice: the caller's criteria order; score: levels 0..n-1; noul: ``[P(false), P(true)]``.
    """

    type: QuestionType
    probabilities: list[float]
    act_probability: float | None = None  # Laya's act head, when the tier has one


class EngineUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    state_tokens: int | None = None
    state_tokens_dropped: int = 0
    truncated_questions: list[str] = msgspec.field(default_factory=list)
    options: dict[str, OptionSpans] = msgspec.field(default_factory=dict)


class EngineAnswer(msgspec.Struct, kw_only=True):
    model: str  # what actually answered, e.g. "laya-english" or the upstream's model name
    results: dict[str, QuestionResult]
    usage: EngineUsage


@runtime_checkable
class Engine(Protocol):
    """A tier. ``name`` is the configured name policies refer to (``laya``, ``clef``).

    ``answer`` contract: returns one ``QuestionResult`` per question of ``call`` (ids and types
    preserved). The engine owns its own timeouts and queue. Only ``cascade.errors`` exceptions
    escape: ``ClientError`` subclasses for requests this tier can never serve (too long, bad
    option order), ``Overloaded`` when its queue is full, ``EngineError`` subclasses for its own
    failures. It must be safe to call concurrently from the event loop and must never block it.
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
