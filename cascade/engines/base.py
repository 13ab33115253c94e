"""The one small interface every tier implements. What crosses it lives in ``cascade.calls``."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from cascade.calls import EngineAnswer, EngineCall


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
