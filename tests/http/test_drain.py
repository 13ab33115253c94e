"""SIGTERM under load on ``cascade serve --demo``: /ready turns 503 first, every request the
gateway accepted is answered, and the process exits 0. Also the two edges of "accepted": a
connection opened just before shutdown whose request arrives after it began, and connections
the kernel queued that the server had not accepted yet when its drain ended."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port, wait_http

BIN = Path(sys.executable).parent
DRAIN_S = 2.0
BODY = {
    "model": "jev-latest",
    "state": "I was charged twice for my March invoice",
    "questions": {
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": ["billing", "technical", "sales"],
        },
    },
}


async def _load(url: str, proc: subprocess.Popen[bytes]) -> tuple[list, list, float]:
    """8 clients posting and one polling /ready; SIGTERM after 1 s; until the port closes."""
    requests: list[tuple[float, object]] = []
    ready: list[tuple[float, object]] = []
    stop = time.monotonic() + DRAIN_S + 6

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            while time.monotonic() < stop:
                try:
                    status: object = (await http.post("/v1/systemone", json=BODY)).status_code
                except httpx.ConnectError:
                    return  # no longer accepting: the end of the drain
                except httpx.TransportError as exc:  # accepted, then dropped: a lost request
                    status = type(exc).__name__
                requests.append((time.monotonic(), status))

    async def poll_ready() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:
            while time.monotonic() < stop:
                try:
                    status = (await http.get("/ready")).status_code
                except httpx.ConnectError:
                    return
                ready.append((time.monotonic(), status))  # when the answer came
                await asyncio.sleep(0.05)

    async def terminate() -> float:
        await asyncio.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        return time.monotonic()

    *_, sent = await asyncio.gather(*(client() for _ in range(8)), poll_ready(), terminate())
    return requests, ready, sent


@contextlib.contextmanager
def demo_gateway(tmp_path: Path, drain_s: float) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``cascade serve --demo`` with ``drain_s``, ready; yields the process and its port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "CASCADE_DRAIN_S": str(drain_s), "CASCADE_DEMO_DIR": str(tmp_path)}
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [str(BIN / "cascade"), "serve", "--demo", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(url + "/health", timeout_s=120, proc=proc)
        # The demo builds two tiny Laya checkpoints and warms its Clef up before /ready turns
        # 200; on a loaded machine that can take a minute or more. Never start the test early.
        deadline = time.monotonic() + 180
        while httpx.get(url + "/ready").status_code != 200:
            assert time.monotonic() < deadline, "the demo gateway never became ready"
            time.sleep(0.1)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.slow
def test_sigterm_drains_then_exits_cleanly(tmp_path: Path) -> None:
    with demo_gateway(tmp_path, DRAIN_S) as (proc, port):
        requests, ready, sent = asyncio.run(_load(f"http://127.0.0.1:{port}", proc))
        code = proc.wait(timeout=30)
    statuses = Counter(status for _, status in requests)
    assert set(statuses) == {200}, statuses  # nothing accepted was lost or failed
    first_503 = min(t for t, status in ready if status == 503)
    assert first_503 - sent < 0.5
    assert all(status == 200 for t, status in ready if t < sent)
    # Requests were still routed and answered during the drain window.
    assert sum(1 for t, _ in requests if first_503 < t < sent + DRAIN_S - 0.2) > 10
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]


def _post_bytes() -> bytes:
    body = json.dumps(BODY).encode()
    return (
        b"POST /v1/systemone HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    ) + body


def _read_response(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (b"" if it closed at once)."""
    sock.settimeout(30)
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_request_on_a_connection_opened_before_shutdown_is_served(tmp_path: Path) -> None:
    """The connection is accepted during the drain; its request arrives only after the server
    stopped listening. uvicorn alone closes such an "idle" connection: the request is lost."""
    with demo_gateway(tmp_path, drain_s=0.5) as (proc, port):
        conn = socket.create_connection(("127.0.0.1", port))
        time.sleep(0.2)  # accepted by the server
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not _refuses_connections(port) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _refuses_connections(port)  # shutdown has begun
        conn.sendall(_post_bytes())
        response = _read_response(conn)
        conn.close()
        code = proc.wait(timeout=30)
    assert response.startswith(b"HTTP/1.1 200 "), response[:200]
    assert b"connection: close" in response.lower()
    assert code == 0


def test_connections_queued_when_the_drain_ends_are_served(tmp_path: Path) -> None:
    """The gateway is stopped (SIGSTOP) across the end of its drain window while clients connect
    and send: the kernel queues those connections. On SIGCONT the server must answer them, not
    close the listening socket over them (which resets them) nor close them unread."""
    with demo_gateway(tmp_path, drain_s=0.5) as (proc, port):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.6)  # the drain deadline passes while the process is stopped
        conns = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(6)]
        for conn in conns:
            conn.sendall(_post_bytes())
        proc.send_signal(signal.SIGCONT)
        responses = [_read_response(conn) for conn in conns]
        for conn in conns:
            conn.close()
        code = proc.wait(timeout=30)
    assert [r[:15] for r in responses] == [b"HTTP/1.1 200 OK"] * len(conns)
    assert code == 0
