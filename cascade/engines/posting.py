"""How ``HttpEngine`` POSTs a request body to an upstream and reads the answer whole.

``AiohttpPoster`` is the request path: aiohttp's C parser and native asyncio transports cost
about a third of httpcore's CPU per request, and nothing is wrapped in httpx's request and
response objects on the way (``cascade bench gateway``). ``HttpxPoster`` sends through an httpx
transport or client instead: the one a test injects (``httpx.MockTransport``), or the client's
proxies when the environment sets some (``HTTP_PROXY``...; that client has the same limits).
``AiohttpPoster`` keeps one pool of keep-alive connections with at most ``max_connections``
requests at once. Nothing is retried here. Each poster maps its library's errors to cascade's
once, here (``aiohttp_error``, ``httpx_error``):

=====================================================  =====================================
waited longer than ``pool`` for one of the connections  ``Overloaded`` (``Retry-After: 1``)
could not connect (refused, unreachable, DNS)           ``ConnectFailed`` (try the next URL)
connecting took longer than ``connect``                 ``ConnectFailed``
no bytes for ``read`` seconds while waiting or reading  ``EngineTimeout``
disconnected, or a malformed status line or header      ``EngineFailed``
reset, or a body cut short                              ``EngineFailed``
=====================================================  =====================================

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

from cascade.errors import EngineFailed, EngineTimeout, Overloaded

Headers = Sequence[tuple[str, str]]
_KEEPALIVE_S = 5.0  # httpx's default keep-alive expiry
_MAX_HEAD_LINE = 64 * 1024  # an answer's status line or header field (aiohttp's default: 8190)


class UpstreamReply:
    """An upstream's answer, read whole: ``headers`` is case-insensitive."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content


class ConnectFailed(Exception):
    """Nothing reached the server: the request may go to the next URL."""


class Poster(Protocol):
    async def post(self, url: str, headers: Headers, content: bytes) -> UpstreamReply:
        """The answer of ``url``; raises ``ConnectFailed``, or ``Overloaded``,
        ``EngineTimeout`` or ``EngineFailed`` (see the module's table)."""
        ...

    async def aclose(self) -> None: ...


class AiohttpPoster:
    """One aiohttp session (made on first use, in the running loop) for the tier ``name``.
    Safe for concurrent requests on one event loop."""

    def __init__(self, name: str, max_connections: int, timeout: httpx.Timeout) -> None:
        self._name = name
        self._slots = asyncio.Semaphore(max_connections)  # bound to a loop when first waited on
        self._limit = max_connections
        self._pool_s = timeout.pool
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeout.connect, sock_read=timeout.read
        )
        self._session: aiohttp.ClientSession | None = None
        # The certificates httpx trusts (certifi's, or SSL_CERT_FILE/SSL_CERT_DIR), not only
        # the system's: an https upstream verifies as it did through httpx.
        self._tls = httpx.create_ssl_context()

    async def post(self, url: str, headers: Headers, content: bytes) -> UpstreamReply:
        try:
            async with asyncio.timeout(self._pool_s):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise pool_busy(self._name) from exc
        try:
            return await self._post(url, headers, content)
        finally:
            self._slots.release()

    async def _post(self, url: str, headers: Headers, content: bytes) -> UpstreamReply:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limit, keepalive_timeout=_KEEPALIVE_S, ssl=self._tls
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=self._timeout,
                trust_env=False,
                max_line_size=_MAX_HEAD_LINE,
                max_field_size=_MAX_HEAD_LINE,
            )
        try:
            async with self._session.post(
                url, headers=headers, data=content, allow_redirects=False
            ) as response:
                return UpstreamReply(response.status, response.headers, await response.read())
        except aiohttp.ClientError as exc:
            raise aiohttp_error(self._name, url, exc) from exc

    async def aclose(self) -> None:
        """Close the connections; a later ``post`` (on any loop) opens new ones."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._slots = asyncio.Semaphore(self._limit)


def pool_busy(name: str) -> Overloaded:
    return Overloaded(f"{name}: every upstream connection is busy", retry_after=1.0)


def aiohttp_error(name: str, url: str, exc: aiohttp.ClientError) -> Exception:
    """cascade's error for an aiohttp one (the module's table). Order matters: a connector
    error is an OS error, and both timeouts are ``ServerTimeoutError``s."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return ConnectFailed(f"{url}: {exc!r}")
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return EngineTimeout(f"{name}: {url} did not answer in time ({type(exc).__name__})")
    return EngineFailed(f"{name}: {url} failed: {exc!r}")  # disconnected, reset, cut short


def httpx_error(name: str, url: str, exc: httpx.HTTPError) -> Exception:
    """cascade's error for an httpx one (the module's table). Order matters: ConnectTimeout
    and PoolTimeout are TimeoutExceptions too."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return ConnectFailed(f"{url}: {exc!r}")
    if isinstance(exc, httpx.PoolTimeout):
        return pool_busy(name)
    if isinstance(exc, httpx.TimeoutException):
        return EngineTimeout(f"{name}: {url} did not answer in time ({type(exc).__name__})")
    return EngineFailed(f"{name}: {url} failed: {exc!r}")


class HttpxPoster:
    """``send`` (an httpx transport's ``handle_async_request`` or a client's ``send``) behind
    the ``Poster`` interface for the tier ``name``; ``timeout`` goes in each request's
    ``timeout`` extension."""

    def __init__(
        self,
        name: str,
        send: Callable[[httpx.Request], Awaitable[httpx.Response]],
        timeout: httpx.Timeout,
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self._name = name
        self._send = send
        self._close = close
        self._extensions = {"timeout": timeout.as_dict()}

    async def post(self, url: str, headers: Headers, content: bytes) -> UpstreamReply:
        request = httpx.Request(
            "POST", url, headers=headers, content=content, extensions=self._extensions
        )
        try:
            response = await self._send(request)
            try:
                await response.aread()
            finally:
                await response.aclose()
        except httpx.HTTPError as exc:
            raise httpx_error(self._name, url, exc) from exc
        return UpstreamReply(response.status_code, response.headers, response.content)

    async def aclose(self) -> None:
        await self._close()
