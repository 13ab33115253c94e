"""uvicorn's httptools protocol with limits on the request head: its size, its number of header
fields, and the time a client may take to send it.

httptools buffers a header field until it ends and has no limit or timeout of its own, so
without these a client could hold a connection open forever by dribbling a header, or make the
server buffer a 10 MB header. Here:

- a head (request line and header fields) over ``max_header_bytes``, or with more than
  ``max_headers`` fields, is answered ``431`` and the connection closed, as soon as the bytes
  received prove it (at most one read past the limit is buffered);
- a connection that has not finished a request head within ``header_timeout_s`` of opening, or
  of the first byte of its next request, is closed (``408`` when it had sent part of one).

Idle keep-alive connections are uvicorn's ``timeout_keep_alive``.

At shutdown uvicorn closes every connection that has no request in progress. A connection
opened just before that may already have its request on the wire, and closing it loses a request
the client saw accepted; so a connection that has not yet sent a complete request head gets
``FIRST_REQUEST_GRACE_S`` to send one, which is then served and the connection closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from cascade.schema import ErrorBody, ErrorDetail, encoder

LINGER_S = 1.0  # after refusing a head: how long to keep reading (and dropping) before closing
FIRST_REQUEST_GRACE_S = 1.0  # at shutdown: how long a new connection may take to send its request


class HeadLimits:
    """The limits one server's connections share (set on a subclass by ``guarded``)."""

    def __init__(self, max_header_bytes: int, max_headers: int, header_timeout_s: float) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.header_timeout_s = header_timeout_s


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head over a limit (httptools turns it
    into a parse error, which uvicorn answers with 400 unless ``send_400_response`` says no)."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits: HeadLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # waiting for (the rest of) a request head
        self._head_bytes = 0
        self._head_fields = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._too_large: str | None = None
        self._discarding = False
        self._shutting_down = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discarding:  # refused: the rest of what the client sends is dropped unread
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        limit = self.limits.max_header_bytes
        if self._too_large is None and self._in_head and self._head_bytes > limit:
            self._too_large = f"the request head exceeds the {limit}-byte limit"
        if self._too_large is not None and not self.transport.is_closing():
            self._refuse(431, "request_too_large", self._too_large)

    def send_400_response(self, msg: str) -> None:
        if self._too_large is not None:  # httptools wraps our callback's error as a parse error
            return
        super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_fields = 0
        self._arm_head_timer()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        if self._head_fields > self.limits.max_headers:
            self._too_large = f"the request has more than {self.limits.max_headers} header fields"
            raise _HeadTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm_head_timer()
        super().on_headers_complete()
        if self._shutting_down and self.cycle is not None:
            self.cycle.keep_alive = False

    def shutdown(self) -> None:
        """uvicorn's graceful close, except that a connection still waiting for its first
        request head gets ``FIRST_REQUEST_GRACE_S`` to send it (see the module docstring)."""
        self._shutting_down = True
        if self.cycle is None and not self.transport.is_closing():
            self.loop.call_later(FIRST_REQUEST_GRACE_S, super().shutdown)
            return
        super().shutdown()

    # ------------------------------------------------------------ the head timer

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s,
                                                    self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes:
            wait = self.limits.header_timeout_s
            self._refuse(408, "timeout", f"request headers not received within {wait:g} s")
        else:
            self.transport.close()

    def _refuse(self, status: int, error_type: str, message: str) -> None:
        """Answer ``status`` and close. Closing a socket with unread input makes the kernel send
        a reset, which can destroy the answer before the client reads it (a client still
        sending its 10 MB header would see only "connection reset"); so, as nginx's lingering
        close does, send the answer and a FIN, then read and discard for ``LINGER_S``."""
        body = encoder.encode(ErrorBody(detail=ErrorDetail(error_type=error_type, message=message)))
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n"
                    b"connection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join([*head, body]))
        self._disarm_head_timer()
        self._discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def guarded(limits: HeadLimits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` that applies ``limits``."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})
