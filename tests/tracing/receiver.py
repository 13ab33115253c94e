"""A real OTLP/HTTP trace receiver for tests: ``ExportTraceServiceRequest`` protobuf messages
(the official ``opentelemetry-proto`` classes) POSTed to ``/v1/traces`` of a loopback HTTP
server, decoded into ``Span``s. ``stall()`` makes it hold every export unanswered (a collector
that has stopped answering) until ``release()``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    start_ns: int
    end_ns: int
    status: int  # Status.StatusCode: 0 unset, 1 ok, 2 error
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0  # export requests received (answered or held)
        self._lock = threading.Condition()
        self._open = threading.Event()
        self._open.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver._lock:
                    receiver.requests += 1
                    receiver._lock.notify_all()
                receiver._open.wait(timeout=60)
                request = ExportTraceServiceRequest.FromString(body)
                with receiver._lock:
                    receiver.spans.extend(_spans(request))
                    receiver._lock.notify_all()
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stall(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def wait_for(self, found: Callable[[list[Span]], bool], timeout_s: float = 30.0) -> list[Span]:
        """The spans once ``found(spans)`` holds (bounded wait); AssertionError otherwise."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not found(self.spans):
                left = deadline - time.monotonic()
                assert left > 0, [(s.service, s.name) for s in self.spans]
                self._lock.wait(left)
            return list(self.spans)

    def wait_requests(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self.requests < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{self.requests} export requests, wanted {count}"
                self._lock.wait(left)


def _spans(request: ExportTraceServiceRequest) -> Iterator[Span]:
    for resource in request.resource_spans:
        attrs = {a.key: _value(a.value) for a in resource.resource.attributes}
        for scope in resource.scope_spans:
            for span in scope.spans:
                yield Span(
                    name=span.name,
                    service=attrs.get("service.name", ""),
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex(),
                    kind=span.kind,
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    status=span.status.code,
                    attributes={a.key: _value(a.value) for a in span.attributes},
                )


@contextlib.contextmanager
def run_receiver() -> Iterator[Receiver]:
    """A started receiver, always shut down (released first) on exit."""
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release()
        receiver.server.shutdown()
        receiver.server.server_close()
        thread.join(timeout=10)
