"""How ``HttpEngine`` POSTs a request body to an upstream and reads the answer whole.

``AiohttpPoster`` is the request path: aiohttp's C parser and native asyncio transports cost
about a third of httpcore's CPU per request, and nothing is wrapped in httpx's request and
response objects on the way (``cascade bench gateway``). ``HttpxPoster`` sends through an httpx
transport or client instead: the one a test injects (``httpx.MockTransport``), or the client's
proxies when the environment sets some (``HTTP_PROXY``...; that client has the same limits).
``AiohttpPoster`` keeps one pool of keep-alive connections with at most ``max_connections``
requests at once. Both raise the httpx exceptions ``HttpEngine`` maps (nothing is retried
here); aiohttp's errors become:

=====================================================  =============================
waited longer than ``pool`` for one of the connections  ``httpx.PoolTimeout``
could not connect (refused, unreachable, DNS)           ``httpx.ConnectError``
connecting took longer than ``connect``                 ``httpx.ConnectTimeout``
no bytes for ``read`` seconds while waiting or reading  ``httpx.ReadTimeout``
disconnected, or a malformed status line or header      ``httpx.RemoteProtocolError``
reset, or a body cut short                              ``httpx.ReadError``
=====================================================  =============================

aiohttp keeps no cookies (a cookie one caller's answer sets never rides on another's request),
follows no redirects, and decodes a compressed body (gzip, deflate) itself. It has no write
timeout; the engine's whole-call limit (``timeout_s``) bounds a stalled write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import aiohttp
import httpx

Headers = Sequence[tuple[str, str]]
_KEEPALIVE_S = 5.0  # httpx's default keep-alive expiry
_MAX_HEAD_LINE = 64 * 1024  # an answer's status line or header field (aiohttp's default: 8190)


class Reply:
    """An upstream's answer, read whole: ``headers`` is case-insensitive."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content


class Poster(Protocol):
    async def post(self, url: str, headers: Headers, content: bytes) -> Reply: ...

    async def aclose(self) -> None: ...


class AiohttpPoster:
    """One aiohttp session (made on first use, in the running loop). Safe for concurrent
    requests on one event loop."""

    def __init__(self, max_connections: int, timeout: httpx.Timeout) -> None:
        self._slots = asyncio.Semaphore(max_connections)  # bound to a loop when first waited on
        self._limit = max_connections
        self._pool_s = timeout.pool
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout.connect,
                                              sock_read=timeout.read)
        self._session: aiohttp.ClientSession | None = None
        # The certificates httpx trusts (certifi's, or SSL_CERT_FILE/SSL_CERT_DIR), not only
        # the system's: an https upstream verifies as it did through httpx.
        self._tls = httpx.create_ssl_context()

    async def post(self, url: str, headers: Headers, content: bytes) -> Reply:
        try:
            async with asyncio.timeout(self._pool_s):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout("every connection is busy") from exc
        try:
            return await self._post(url, headers, content)
        finally:
            self._slots.release()

    async def _post(self, url: str, headers: Headers, content: bytes) -> Reply:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._limit, keepalive_timeout=_KEEPALIVE_S,
                                             ssl=self._tls)
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), timeout=self._timeout,
                trust_env=False, max_line_size=_MAX_HEAD_LINE, max_field_size=_MAX_HEAD_LINE)
        try:
            async with self._session.post(url, headers=headers, data=content,
                                          allow_redirects=False) as response:
                return Reply(response.status, response.headers, await response.read())
        except aiohttp.ClientError as exc:
            raise as_httpx(exc) from exc

    async def aclose(self) -> None:
        """Close the connections; a later ``post`` (on any loop) opens new ones."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._slots = asyncio.Semaphore(self._limit)


def as_httpx(exc: aiohttp.ClientError) -> httpx.TransportError:
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
    return kind(message)


class HttpxPoster:
    """``send`` (an httpx transport's ``handle_async_request`` or a client's ``send``) behind
    the ``Poster`` interface; ``timeout`` goes in each request's ``timeout`` extension."""

    def __init__(self, send: Callable[[httpx.Request], Awaitable[httpx.Response]],
                 timeout: httpx.Timeout, close: Callable[[], Awaitable[None]]) -> None:
        self._send = send
        self._close = close
        self._extensions = {"timeout": timeout.as_dict()}

    async def post(self, url: str, headers: Headers, content: bytes) -> Reply:
        request = httpx.Request("POST", url, headers=headers, content=content,
                                extensions=self._extensions)
        response = await self._send(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
        return Reply(response.status_code, response.headers, response.content)

    async def aclose(self) -> None:
        await self._close()
