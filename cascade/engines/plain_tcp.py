"""The upstream client's transport for ``http://`` URLs: httpx and httpcore over asyncio's own
TCP transports, without anyio (httpcore's pluggable network backend).

httpcore's default backend runs every read and write through anyio (a cancel scope, a
checkpoint, a dict of socket attributes built at each look) and sends a request's head and its
body in two writes: two system calls and two TCP segments per request. Here a connection is an
``asyncio.Protocol``: a request's writes are gathered and sent in one when its response is first
read (or as soon as 64 KiB are waiting), received bytes wait in a buffer (reading pauses past
1 MiB), and whether an idle connection was closed by its server, which httpcore asks before
reusing one, is known without a system call. TLS is not spoken here: ``HttpEngine`` uses this
transport only when every URL is ``http://``.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from typing import Any, cast

import httpcore
import httpx

_FLUSH_BYTES = 64 * 1024  # pending request bytes sent at once, before the response is read
_MAX_BUFFER = 1024 * 1024  # received bytes held before the socket stops being read


class _Connection(asyncio.Protocol, httpcore.AsyncNetworkStream):
    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._received = bytearray()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._closed = False  # the server closed, or the connection was lost
        self._error: Exception | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._waiter: asyncio.Future[None] | None = None  # a read or a drain waiting

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._received += data
        if len(self._received) > _MAX_BUFFER and not self._reading_paused:
            self._reading_paused = True
            self._transport_now().pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._closed = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._error = exc
        self._wake()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self, timeout: float | None) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._waiter
        finally:
            self._waiter = None

    def _transport_now(self) -> asyncio.Transport:
        assert self._transport is not None  # set before create_connection returns
        return self._transport

    # -- httpcore.AsyncNetworkStream

    def _flush(self) -> None:
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
            self._transport_now().write(data)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._flush()
        if not self._received and not self._closed:
            try:
                await self._wait(timeout)
            except TimeoutError as exc:
                raise httpcore.ReadTimeout("timed out reading the response") from exc
        if self._received:
            data = bytes(self._received[:max_bytes])
            del self._received[:max_bytes]
            if self._reading_paused and len(self._received) <= _MAX_BUFFER:
                self._reading_paused = False
                self._transport_now().resume_reading()
            return data
        if self._error is not None:
            raise httpcore.ReadError(str(self._error)) from self._error
        return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._closed or self._transport_now().is_closing():
            raise httpcore.WriteError("the connection is closed")
        self._pending.append(buffer)
        self._pending_bytes += len(buffer)
        if self._pending_bytes >= _FLUSH_BYTES:
            self._flush()
        while self._writing_paused and not self._closed:
            try:
                await self._wait(timeout)
            except TimeoutError as exc:
                raise httpcore.WriteTimeout("timed out sending the request") from exc

    async def aclose(self) -> None:
        self._transport_now().close()

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle connection with bytes or an EOF waiting is done
            return self._closed or bool(self._received)
        name = {"socket": "socket", "client_addr": "sockname", "server_addr": "peername"}
        return self._transport_now().get_extra_info(name[info]) if info in name else None


class _Backend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, connection = await loop.create_connection(
                    _Connection, host, port,
                    local_addr=(local_address, 0) if local_address else None)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"could not connect to {host}:{port} in time") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        sock: socket.socket = transport.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return connection

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def plain_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """httpx's transport (its request, response and error mapping) on a connection pool that
    uses the backend above."""
    transport = httpx.AsyncHTTPTransport(limits=limits)
    # httpx (pinned in pyproject.toml) takes no network backend; its pool is replaced whole.
    transport._pool = httpcore.AsyncConnectionPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=_Backend(),
    )
    return transport
