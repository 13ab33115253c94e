"""cascade.engines.plain_tcp: httpx over httpcore on asyncio's transports, against raw loopback
servers (asyncio.start_server) that misbehave in the ways a real upstream can."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from cascade.engines.plain_tcp import plain_transport

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
LIMITS = httpx.Limits(max_connections=4, max_keepalive_connections=4)


async def _request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


def _answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def _with_server(serve: Serve, scenario: Callable[[str], Awaitable[None]]) -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with asyncio.timeout(20):
            await scenario(f"http://127.0.0.1:{port}/v1/systemone")
    finally:
        server.close()
        await server.wait_closed()


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await _request(reader)
        writer.write(_answer(b"one"))
        await writer.drain()
        writer.close()  # keep-alive offered, then the connection closed while idle

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(transport=plain_transport(LIMITS)) as client:
            first = await client.post(url, content=b"{}")
            await asyncio.sleep(0.2)  # the server's FIN has arrived
            second = await client.post(url, content=b"{}")
        assert (first.content, second.content) == (b"one", b"one")

    asyncio.run(_with_server(serve, scenario))
    assert len(connections) == 2


def test_a_held_request_is_sent_and_a_large_answer_arrives_whole() -> None:
    body = bytes(range(256)) * (12 * 1024)  # 3 MiB: reading pauses and resumes
    reads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reads.append(await _request(reader))  # sent when the response is first read
        writer.write(_answer(body))
        await writer.drain()
        writer.close()

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(transport=plain_transport(LIMITS)) as client:
            response = await client.post(url, content=b'{"state": "s"}')
        assert response.content == body

    asyncio.run(_with_server(serve, scenario))
    assert reads[0].endswith(b'\r\n\r\n{"state": "s"}')


def test_a_silent_server_is_a_read_timeout_and_a_cut_answer_an_error() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        await asyncio.sleep(5)

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()
        writer.transport.abort()

    async def times_out(url: str) -> None:
        async with httpx.AsyncClient(transport=plain_transport(LIMITS), timeout=0.3) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(url, content=b"{}")

    async def fails(url: str) -> None:
        async with httpx.AsyncClient(transport=plain_transport(LIMITS)) as client:
            with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
                await client.post(url, content=b"{}")

    asyncio.run(_with_server(silent, times_out))
    asyncio.run(_with_server(cut, fails))


def test_a_closed_port_is_a_connect_error() -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        async with httpx.AsyncClient(transport=plain_transport(LIMITS)) as client:
            with pytest.raises(httpx.ConnectError):
                await client.post(f"http://127.0.0.1:{port}/", content=b"{}")

    asyncio.run(scenario())
