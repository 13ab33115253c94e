"""The process's tracing, when configured: what drivers call around their work.

Every hook here is a no-op while no tracing is installed (the default): a module global read
and a ``None`` check, so tracing off costs nothing measurable (``cascade bench gateway``) and
OpenTelemetry is never imported. ``cascade.tracing.otel`` implements ``Tracing``;
``cascade serve`` installs one when ``OTEL_*`` asks for it (``cascade.tracing.config``).
Drivers open spans around calls (the pure flow never does); span attributes carry sizes, ids,
tier names and numbers, never a state or option text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableSequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

Attributes = Mapping[str, str | bool | int | float | list[float] | list[str]]


class Span(Protocol):
    """The part of an OpenTelemetry span drivers use."""

    def set_attributes(self, attributes: Attributes) -> None: ...

    def add_event(self, name: str, attributes: Attributes | None = None) -> None: ...


class Tracing(Protocol):
    """Spans of the current context (contextvars: a task inherits its creator's span)."""

    def span(
        self, name: str, attributes: Attributes | None = None, *, remote: bool = False
    ) -> AbstractContextManager[Span]: ...

    def annotate(self, build: Callable[[], Attributes]) -> None: ...

    def inject(self, headers: MutableSequence[tuple[str, str]]) -> None: ...

    def trace_id(self) -> str: ...

    def sampled_trace_id(self) -> str: ...

    def middleware(self, app: Any) -> Any: ...


_active: Tracing | None = None
_OFF: nullcontext[None] = nullcontext()


def install(tracing: Tracing | None) -> None:
    """Make ``tracing`` the process's (None: off again)."""
    global _active
    _active = tracing


def current() -> Tracing | None:
    return _active


def span(
    name: str, attributes: Attributes | None = None, *, remote: bool = False
) -> AbstractContextManager[Span | None]:
    """A child span of the current one, current inside the block (``remote``: a client span, a
    call to another process); ``None`` while off. An exception leaving the block is recorded
    on the span and marks it failed."""
    if _active is None:
        return _OFF
    return _active.span(name, attributes, remote=remote)


def annotate(build: Callable[[], Attributes]) -> None:
    """Set ``build()``'s attributes on the current span (``build`` is called only when that
    span records)."""
    if _active is not None:
        _active.annotate(build)


def injected(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` and the current context's ``traceparent`` (and ``tracestate``) for a call to
    another process: a new list while on, ``headers`` itself while off."""
    if _active is None:
        return headers
    found = list(headers)
    _active.inject(found)
    return found


def trace_id() -> str:
    """The current trace's id (32 hex digits), "" while off or outside a trace."""
    return "" if _active is None else _active.trace_id()


def exemplar() -> dict[str, str] | None:
    """A histogram exemplar naming the current trace when it is sampled, else None."""
    if _active is None:
        return None
    found = _active.sampled_trace_id()
    return {"trace_id": found} if found else None


def middleware() -> list[Any]:
    """The server-span ASGI middleware for ``Litestar(middleware=...)``; none while off."""
    return [] if _active is None else [_active.middleware]


@contextmanager
def installed(tracing: Tracing | None) -> Iterator[None]:
    """``tracing`` installed for the block, the previous one afterwards."""
    previous = _active
    install(tracing)
    try:
        yield
    finally:
        install(previous)
