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
