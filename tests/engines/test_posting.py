"""cascade.engines.posting's aiohttp poster against scripted HTTP servers on loopback: what
reaches the server, what comes back, and each failure as the cascade error it maps to."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from cascade.engines.posting import AiohttpPoster, ConnectFailed, UpstreamReply, aiohttp_error
from cascade.errors import EngineFailed, EngineTimeout, Overloaded
from tests.servers import read_request

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
JSON = [("content-type", "application/json")]


def answer(body: bytes, *headers: bytes) -> bytes:
    fields = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), fields, body)


async def scenario(
    script: Script,
    client: Callable[[str, AiohttpPoster], Awaitable[Any]],
    max_connections: int = 4,
    pool: float = 2.0,
    read: float = 2.0,
) -> Any:
    server = await asyncio.start_server(script, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    poster = AiohttpPoster("up", max_connections, httpx.Timeout(read, connect=2.0, pool=pool))
    try:
        return await client(f"http://127.0.0.1:{port}/v1/systemone", poster)
    finally:
        await poster.aclose()
        server.close()
        await server.wait_closed()


def test_a_request_goes_out_as_built_and_its_answer_comes_back() -> None:
    seen: list[bytes] = []
    connections = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while not reader.at_eof():
            try:
                head, body = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            seen.append(head + body)
            writer.write(answer(b'{"ok": true}', b"x-a: 1", b"x-a: 2", b"set-cookie: s=1"))
            await writer.drain()

    async def client(url: str, poster: AiohttpPoster) -> list[UpstreamReply]:
        return [
            await poster.post(
                url, [*JSON, ("authorization", "Bearer k"), ("x-request-id", f"r{i}")], b'{"q": 1}'
            )
            for i in range(3)
        ]

    responses = asyncio.run(scenario(script, client))
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert responses[0].content == b'{"ok": true}'
    assert responses[0].headers["X-A"] == "1"  # case-insensitive
    assert len(connections) == 1  # kept alive and reused
    head = seen[2].decode().lower()
    assert head.startswith("post /v1/systemone http/1.1\r\n")
    assert "authorization: bearer k\r\n" in head and "x-request-id: r2\r\n" in head
    assert "content-length: 8\r\n" in head and seen[2].endswith(b'{"q": 1}')
    assert "cookie" not in head  # the first answer's cookie is not sent back


def test_a_compressed_answer_is_decoded() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(gzip.compress(b'{"ok": true}'), b"content-encoding: gzip"))
        await writer.drain()

    async def client(url: str, poster: AiohttpPoster) -> bytes:
        return (await poster.post(url, JSON, b"{}")).content

    assert asyncio.run(scenario(script, client)) == b'{"ok": true}'


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await asyncio.sleep(5)  # never answers


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.close()


async def _garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 two hundred\r\n\r\n")
    await writer.drain()


async def _cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"answers"')
    await writer.drain()
    writer.close()


@pytest.mark.parametrize(
    ("script", "error"),
    [
        (_silent, EngineTimeout),
        (_hang_up, EngineFailed),
        (_garbage, EngineFailed),
        (_cut_short, EngineFailed),
    ],
)
def test_failures_on_an_open_connection_are_cascade_errors(
    script: Script, error: type[Exception]
) -> None:
    async def client(url: str, poster: AiohttpPoster) -> None:
        with pytest.raises(error):
            await poster.post(url, JSON, b"{}")

    asyncio.run(scenario(script, client, read=0.3))


def test_a_closed_port_is_a_connect_error() -> None:
    async def client() -> None:
        server = await asyncio.start_server(_silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        poster = AiohttpPoster("up", 4, httpx.Timeout(2.0))
        try:
            with pytest.raises(ConnectFailed):
                await poster.post(f"http://127.0.0.1:{port}/v1/systemone", JSON, b"{}")
        finally:
            await poster.aclose()

    asyncio.run(client())


@pytest.mark.slow
def test_a_full_pool_waits_its_pool_timeout_then_is_overloaded() -> None:
    async def client(url: str, poster: AiohttpPoster) -> float:
        busy = asyncio.ensure_future(poster.post(url, JSON, b"{}"))
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(Overloaded, match="up: every upstream connection is busy"):
            await poster.post(url, JSON, b"{}")
        waited = loop.time() - started
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)
        return waited

    assert 0.15 < asyncio.run(scenario(_silent, client, max_connections=1, pool=0.2)) < 1.5


def test_a_long_header_field_is_read() -> None:
    """Answers with header fields longer than aiohttp's 8 KiB default are read (httpx read them)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"{}", b"x-long: " + b"a" * 20_000))
        await writer.drain()

    async def client(url: str, poster: AiohttpPoster) -> UpstreamReply:
        return await poster.post(url, JSON, b"{}")

    reply = asyncio.run(scenario(script, client))
    assert reply.status_code == 200 and len(reply.headers["x-long"]) == 20_000


def test_an_https_upstream_is_verified_against_the_certificates_httpx_trusts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SSL_CERT_FILE`` (honoured by httpx) makes a private CA's upstream trusted; without it,
    the same upstream fails to connect (certificate verify failed), as through httpx."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await read_request(reader)
            writer.write(answer(b'{"ok": true}'))
            await writer.drain()

    async def client(trusted: bool) -> bytes | None:
        if trusted:
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        else:
            monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        server = await asyncio.start_server(script, "127.0.0.1", 0, ssl=tls)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/systemone"
        poster = AiohttpPoster("up", 4, httpx.Timeout(2.0))
        try:
            return (await poster.post(url, JSON, b"{}")).content
        except ConnectFailed:
            return None
        finally:
            await poster.aclose()
            server.close()
            await server.wait_closed()

    assert asyncio.run(client(trusted=True)) == b'{"ok": true}'
    assert asyncio.run(client(trusted=False)) is None


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    """A server closing idle keep-alive connections (uvicorn after 5 s): the next request
    opens a new connection instead of failing on the closed one."""
    connections = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await read_request(reader)
        writer.write(answer(b"{}"))
        await writer.drain()
        await asyncio.sleep(0.2)  # idle: closed before the next request
        writer.close()

    async def client(url: str, poster: AiohttpPoster) -> list[int]:
        statuses = []
        for _ in range(3):
            statuses.append((await poster.post(url, JSON, b"{}")).status_code)
            await asyncio.sleep(0.4)
        return statuses

    assert asyncio.run(scenario(script, client)) == [200, 200, 200]
    assert len(connections) == 3


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (aiohttp.ConnectionTimeoutError("connect"), ConnectFailed),  # a ServerTimeoutError too
        (aiohttp.SocketTimeoutError("read"), EngineTimeout),
        (aiohttp.ServerDisconnectedError(), EngineFailed),
        (aiohttp.ClientPayloadError("cut short"), EngineFailed),
    ],
)
def test_each_aiohttp_error_maps_to_cascade_once(
    exc: aiohttp.ClientError, error: type[Exception]
) -> None:
    mapped = aiohttp_error("up", "http://u/v1/systemone", exc)
    assert type(mapped) is error and "http://u/v1/systemone" in str(mapped)
