"""A send timeout for clients that stop reading their answer.

uvicorn hands a whole answer to the transport at once; a client that never reads it keeps what
the kernel does not take (most of a 13.5 MB batch answer) in the process's memory for as long as
it keeps the connection: 30 such answers held +390 MiB. Here, while the transport's write buffer
is over its high-water mark (asyncio's ``pause_writing``), a connection whose unsent bytes
(that buffer and, on Linux, the kernel's send queue) have not shrunk by ``MIN_PROGRESS`` bytes
in ``send_timeout_s`` is aborted, which frees the buffer at once (``close`` would wait for it to
drain). A client that keeps reading keeps its connection, as with nginx's ``send_timeout``
between two successive writes. The kernel's queue counts because a slow reader drains it long
before asyncio's own buffer moves; the minimum so that a reader that takes a few bytes now and
then (or a peer kernel that accepts them) cannot hold a large answer indefinitely. The timer runs
on a closing connection too: uvicorn's keep-alive timer closes a connection right after the
answer was handed over, and ``close`` keeps the unsent answer until the client reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import struct
import termios
from typing import Any

from cascade import metrics

log = logging.getLogger("cascade")
MIN_PROGRESS = 64 * 1024  # bytes a client must read per send timeout (about 2 KiB/s at 30 s)


class SendTimeout(asyncio.Protocol):
    """The send timeout as a mixin for a uvicorn HTTP protocol class (h11's or httptools'),
    placed before it in the bases: it only needs ``transport``, ``loop`` and ``client``."""

    send_timeout_s: float
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    client: tuple[str, int] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._send_timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # the unsent bytes when the timer was armed

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._arm_send_timer()

    def resume_writing(self) -> None:
        self._disarm_send_timer()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_send_timer()
        super().connection_lost(exc)

    def _unsent_bytes(self) -> int:
        unsent = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        with contextlib.suppress(AttributeError, OSError):  # TIOCOUTQ: Linux's send queue
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
            unsent += struct.unpack("i", queued)[0]
        return unsent

    def _arm_send_timer(self) -> None:
        self._unsent = self._unsent_bytes()
        self._send_timer = self.loop.call_later(self.send_timeout_s, self._send_timed_out)

    def _disarm_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        # A closing transport counts too (see the module docstring).
        unsent = self._unsent_bytes()
        if unsent <= self._unsent - MIN_PROGRESS:  # the client reads: another send_timeout_s
            self._arm_send_timer()
            return
        metrics.SEND_TIMEOUTS.inc()
        client = self.client[0] if self.client else "?"
        log.warning(
            "closing a connection from %s: its client read (almost) none of its answer "
            "for %g s (%d bytes unsent)",
            client,
            self.send_timeout_s,
            unsent,
        )
        self.transport.abort()


def with_send_timeout(
    protocol: type[asyncio.Protocol], send_timeout_s: float
) -> type[asyncio.Protocol]:
    """``protocol`` (a uvicorn HTTP protocol class) with the send timeout."""
    return type(protocol.__name__, (SendTimeout, protocol), {"send_timeout_s": send_timeout_s})
