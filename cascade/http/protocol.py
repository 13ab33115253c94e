"""uvicorn's h11 protocol with the rules of RFC 9112 that h11 leaves to its user, limits on the
request head (its size, its number of fields, the time a client may take to send it), and error
answers in the contract's JSON shape.

Why h11 and not httptools (uvicorn's default): httptools (llhttp) switches protocols as soon as
it parses ``Connection: Upgrade`` with ``Upgrade: h2c``: it skips the request's body, and uvicorn
then parses the body's bytes as the next request on the connection (request smuggling behind a
proxy that forwards ``Upgrade``). h11 switches only when the server answers ``101``, so such a
request is served as ordinary HTTP/1.1 with its body, as nginx does. h11 also refuses a request
without ``Host`` or with two (RFC 9112 section 3.2), and enforces uvicorn's
``h11_max_incomplete_event_size`` on a head that spans several reads. What is left here:

- a head (request line and header fields) over ``max_header_bytes``, however its bytes arrive,
  or with more than ``max_headers`` fields, is answered ``431``;
- a request with both ``Content-Length`` and ``Transfer-Encoding`` is answered ``400`` (h11
  would let Transfer-Encoding win; RFC 9112 section 6.3 lets a server refuse it, and a proxy
  that reads it the other way is how requests are smuggled);
- every other malformed request is answered ``400`` with h11's reason;
- a connection that has not finished a request head within ``header_timeout_s`` of opening, or
  of the first byte of its next request, is closed (``408`` when it had sent part of one).

Every refusal is a JSON ``ErrorBody`` followed by a lingering close. Idle keep-alive connections
are uvicorn's ``timeout_keep_alive``. An ``Upgrade`` the server does not do is ignored without a
log line.

At shutdown uvicorn closes every connection that has no request in progress. A connection
opened just before that may already have its request on the wire, and closing it loses a request
the client saw accepted; so a connection that has not yet sent a complete request head gets
``FIRST_REQUEST_GRACE_S`` to send one, which is then served and the connection closed.

A response's head (status line and header fields) is held until its first body bytes and both
go out in one write (``_HeadWithBody``): one system call and one TCP segment per small answer,
not two. A head whose body is not sent in the same turn of the event loop goes out at its end.

The size of a head that arrives in one read is the length of h11's receive buffer before and
after parsing it: h11 keeps an incomplete head in that buffer, so the difference is the whole
head's bytes. That buffer, the cycle's transport and the upgrade warning are private to h11 and
uvicorn: ``cascade.overrides`` holds each use; ``tests/http/test_server.py`` sends such a head
in one write and in many.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES
from uvicorn.server import ServerState

from cascade.overrides.h11 import buffered, is_head_too_long
from cascade.overrides.uvicorn import QuietUpgrades, answer_transport, route_answer
from cascade.schema import ErrorBody, ErrorDetail, encoder

LINGER_S = 1.0  # after refusing a head: how long to keep reading (and dropping) before closing
FIRST_REQUEST_GRACE_S = 1.0  # at shutdown: how long a new connection may take to send its request
ONE_WRITE_BYTES = 64 * 1024  # an answer's body up to this size goes out with its head, in one write
MAX_REASON_CHARS = 200  # h11's reasons may quote the offending line; the answer quotes its start


class HeadLimits:
    """The limits one server's connections share (set on a subclass by ``guarded``)."""

    def __init__(self, max_header_bytes: int, max_headers: int, header_timeout_s: float) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.header_timeout_s = header_timeout_s


class _Connection(h11.Connection):
    """h11's server side with the checks on a parsed head (see the module docstring). The
    error that ends the connection is kept in ``error`` for the answer."""

    def __init__(self, limits: HeadLimits) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.limits = limits
        self.error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        before = buffered(self)
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                self._check(event, before - buffered(self))
            return event
        except h11.RemoteProtocolError as exc:
            self.error = exc
            raise

    def _check(self, request: h11.Request, head_bytes: int) -> None:
        limits = self.limits
        if head_bytes > limits.max_header_bytes:
            raise h11.RemoteProtocolError(head_too_large(limits), error_status_hint=431)
        if len(request.headers) > limits.max_headers:
            raise h11.RemoteProtocolError(
                f"the request has more than {limits.max_headers} header fields",
                error_status_hint=431,
            )
        names = {name for name, _ in request.headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            raise h11.RemoteProtocolError(
                "a request may not have both Content-Length and Transfer-Encoding"
            )


def head_too_large(limits: HeadLimits) -> str:
    return f"the request head exceeds the {limits.max_header_bytes}-byte limit"


class _HeadWithBody:
    """The transport a request's cycle writes its answer to: its first write (the head) is held
    until the next one (the body), or the end of this turn of the event loop, or ``close``;
    both then go out in one write when the body is small (copying a large one would cost more
    than the system call it saves)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None
        self._wrote = False

    def write(self, data: bytes) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if len(data) <= ONE_WRITE_BYTES:
                self._transport.write(head + data)
                return
            self._transport.write(head)
        elif not self._wrote:
            self._wrote = True
            self._head = data
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


class GuardedH11Protocol(QuietUpgrades):
    limits: HeadLimits
    conn: _Connection

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.conn = _Connection(self.limits)
        self._head_begun = False  # bytes of a request head have arrived, the head is not done
        self._head_timer: asyncio.TimerHandle | None = None
        self._discarding = False
        self._shutting_down = False

    # uvicorn narrows asyncio.Protocol's BaseTransport to Transport (and ignores that itself).
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discarding:  # refused: the rest of what the client sends is dropped unread
            return
        if data and self.conn.their_state is h11.IDLE:  # (part of) the next request head
            self._head_begun = True
            self._arm_head_timer()
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and answer_transport(cycle) is self.transport:  # a new cycle
            route_answer(cycle, _HeadWithBody(self.transport, self.loop))
        if self.conn.their_state is not h11.IDLE:  # a request head was parsed (or refused)
            self._head_begun = False
            self._disarm_head_timer()
            if self._shutting_down and self.cycle is not None:
                self.cycle.keep_alive = False

    def on_response_complete(self) -> None:
        # Whatever comes next (a pipelined request's answer, a refusal) goes after this answer.
        if self.cycle is not None:
            answer = answer_transport(self.cycle)
            if isinstance(answer, _HeadWithBody):
                answer.flush()
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        """Answer the error h11 raised (uvicorn passes only a generic ``msg``)."""
        error = self.conn.error
        if error is not None and error.error_status_hint == 431:
            reason = head_too_large(self.limits) if is_head_too_long(error) else str(error)
            self._refuse(431, "request_too_large", reason)
            return
        reason = str(error) if error is not None else msg
        if len(reason) > MAX_REASON_CHARS:
            reason = reason[:MAX_REASON_CHARS] + "..."
        # 400 also for h11's 501 (a transfer coding other than chunked): bad input is a 4xx.
        self._refuse(400, "invalid_request_error", f"malformed HTTP request: {reason}")

    def shutdown(self) -> None:
        """uvicorn's graceful close, except that a connection still waiting for its first
        request head gets ``FIRST_REQUEST_GRACE_S`` to send it (see the module docstring)."""
        self._shutting_down = True
        if self._discarding:  # refused: the lingering close ends it
            return
        if self.cycle is None and not self.transport.is_closing():
            self.loop.call_later(FIRST_REQUEST_GRACE_S, super().shutdown)
            return
        super().shutdown()

    # ------------------------------------------------------------ the head timer

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._head_timed_out
            )

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_begun:
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
        head = [b"HTTP/1.1 %d %s\r\n" % (status, STATUS_PHRASES[status])]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(
            b"content-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % len(body)
        )
        self.transport.write(b"".join([*head, body]))
        self._disarm_head_timer()
        self._discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def guarded(limits: HeadLimits) -> type[GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` that applies ``limits``."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})
