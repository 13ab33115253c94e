"""``Tracing`` on the OpenTelemetry SDK: a tracer of one ``TracerProvider`` (never the global
one, so tests can run several), the W3C propagators (``OTEL_PROPAGATORS``), and the server
span as ASGI middleware. Imported only when tracing is on."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableSequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from cascade.tracing.active import Attributes

_MAX_ID = 128  # a client's x-request-id, as the gateway accepts it


class OtelTracing:
    """Spans of ``provider``'s tracer; ``shutdown`` flushes what is queued (bounded wait)."""

    def __init__(self, provider: TracerProvider) -> None:
        from cascade import __version__

        self.provider = provider
        self.tracer = provider.get_tracer("cascade", __version__)

    @contextmanager
    def span(
        self, name: str, attributes: Attributes | None = None, *, remote: bool = False
    ) -> Iterator[Any]:
        parent = trace.get_current_span()
        context = parent.get_span_context()
        if context.is_valid and not context.trace_flags.sampled:
            # An unsampled trace samples none of its children (the parent-based samplers):
            # the parent stays current, its context is what goes upstream.
            yield parent
            return
        kind = SpanKind.CLIENT if remote else SpanKind.INTERNAL
        with self.tracer.start_as_current_span(name, kind=kind, attributes=attributes) as span:
            yield span

    def annotate(self, build: Callable[[], Attributes]) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(build())

    def inject(self, headers: MutableSequence[tuple[str, str]]) -> None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        headers.extend(carrier.items())

    def trace_id(self) -> str:
        context = trace.get_current_span().get_span_context()
        return trace.format_trace_id(context.trace_id) if context.is_valid else ""

    def sampled_trace_id(self) -> str:
        context = trace.get_current_span().get_span_context()
        sampled = context.is_valid and context.trace_flags.sampled
        return trace.format_trace_id(context.trace_id) if sampled else ""

    def middleware(self, app: Any) -> Any:
        """``app`` inside an HTTP server span that continues the caller's ``traceparent`` (a
        malformed one is ignored by the propagator: a new trace starts, the request goes on)."""
        tracer = self.tracer

        async def traced(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers = dict(scope.get("headers") or [])
            carrier = {
                name: headers[name.encode()].decode("latin-1")
                for name in ("traceparent", "tracestate")
                if name.encode() in headers
            }
            route = scope.get("path_template") or scope["path"]
            attributes: dict[str, Any] = {
                "http.request.method": scope["method"],
                "http.route": route,
                "url.path": scope["path"],
                "url.scheme": scope.get("scheme", "http"),
                "network.protocol.version": scope.get("http_version", "1.1"),
            }
            rid = headers.get(b"x-request-id", b"")[:_MAX_ID].decode("latin-1")
            if rid:
                attributes["cascade.request_id"] = rid
            status = 0

            async def sending(message: Any) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            with tracer.start_as_current_span(
                f"{scope['method']} {route}",
                context=propagate.extract(carrier),
                kind=SpanKind.SERVER,
                attributes=attributes,
            ) as span:
                await app(scope, receive, sending)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))

        return traced

    def shutdown(self) -> None:
        self.provider.shutdown()
