"""httpx's transport interface over aiohttp: the upstream tier's request path.

``HttpEngine`` builds ``httpx.Request`` objects and reads ``httpx.Response`` objects (its error
table is written against httpx's exceptions, and tests swap in ``httpx.MockTransport``); the
bytes move through aiohttp, whose C parser and native asyncio transports cost about a third of
httpcore's CPU per request (``cascade bench gateway``). This module does exactly what httpx's own
transport does, no more: one pool of keep-alive connections, at most ``max_connections``
requests at once, the request's ``timeout`` extension honoured, and aiohttp's errors raised as
the httpx exceptions the engine maps (nothing is retried here):

=====================================================  =============================
waited longer than ``pool`` for one of the connections  ``httpx.PoolTimeout``
could not connect (refused, unreachable, DNS)           ``httpx.ConnectError``
connecting took longer than ``connect``                 ``httpx.ConnectTimeout``
no bytes for ``read`` seconds while waiting or reading  ``httpx.ReadTimeout``
disconnected, or a malformed status line or header      ``httpx.RemoteProtocolError``
reset, or a body cut short                              ``httpx.ReadError``
=====================================================  =============================

aiohttp keeps no cookies (a cookie one caller's answer sets never rides on another's request),
adds no headers of its own, follows no redirects and leaves the body's content encoding to
httpx, as httpx's transport does. It has no write timeout; the engine's whole-call limit
(``timeout_s``) bounds a stalled write.
"""

from __future__ import annotations

import asyncio

import aiohttp
import httpx

_NOT_SENT = {"content-length", "transfer-encoding"}  # aiohttp frames the body itself
_KEEPALIVE_S = 5.0  # httpx's default keep-alive expiry


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One aiohttp session (made on first use, in the running loop) behind httpx's
    ``handle_async_request``. Safe for concurrent requests on one event loop."""

    def __init__(self, max_connections: int) -> None:
        self._slots = asyncio.Semaphore(max_connections)
        self._limit = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=self._limit, keepalive_timeout=_KEEPALIVE_S)
        return aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
            timeout=aiohttp.ClientTimeout(total=None), trust_env=False,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout: dict[str, float | None] = request.extensions.get("timeout", {})
        try:
            async with asyncio.timeout(timeout.get("pool")):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("every connection is busy", request=request) from exc
        try:
            return await self._send(request, timeout)
        finally:
            self._slots.release()

    async def _send(self, request: httpx.Request, timeout: dict[str, float | None]
                    ) -> httpx.Response:
        if self._session is None:
            self._session = self._open()
        headers = [(k, v) for k, v in request.headers.multi_items() if k not in _NOT_SENT]
        limits = aiohttp.ClientTimeout(total=None, sock_connect=timeout.get("connect"),
                                       sock_read=timeout.get("read"))
        try:
            async with self._session.request(
                request.method, str(request.url), headers=headers, data=request.content or None,
                allow_redirects=False, timeout=limits,
            ) as response:
                content = await response.read()
        except aiohttp.ClientError as exc:
            raise _as_httpx(exc, request) from exc
        return httpx.Response(
            response.status, headers=response.raw_headers, content=content, request=request,
            extensions={"http_version": b"HTTP/1.1",
                        "reason_phrase": (response.reason or "").encode("latin-1")},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _as_httpx(exc: aiohttp.ClientError, request: httpx.Request) -> httpx.TransportError:
    """The httpx exception for an aiohttp one (the module's table). Order matters: a
    connector error is an OS error, and both timeouts are ``ServerTimeoutError``s."""
    message = str(exc) or type(exc).__name__
    kind: type[httpx.TransportError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        kind = httpx.ConnectTimeout
    elif isinstance(exc, aiohttp.ServerTimeoutError):
        kind = httpx.ReadTimeout
    elif isinstance(exc, aiohttp.ClientConnectorError):
        kind = httpx.ConnectError
    elif isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientResponseError):
        kind = httpx.RemoteProtocolError
    else:  # a reset, a cut-short body, anything else on an open connection
        kind = httpx.ReadError
    return kind(message, request=request)
