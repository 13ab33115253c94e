"""The served gateway (``cascade serve`` as a process): request-head limits and timeouts."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cascade.http.protocol import LINGER_S
from tests.servers import free_port, run_process

BIN = Path(sys.executable).parent
HEADER_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int, int]]:
    """``(host, port, pid)`` of ``cascade serve`` with a 1 s header timeout."""
    port = free_port()
    env = {**os.environ, "CASCADE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
           "CASCADE_KEEP_ALIVE_S": "1"}
    cmd = [str(BIN / "cascade"), "serve", "--upstream", "http://127.0.0.1:9", "--port", str(port),
           "--log-level", "warning"]
    with run_process(cmd, ready_url=f"http://127.0.0.1:{port}/health", env=env) as proc:
        yield "127.0.0.1", port, proc.pid


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _connect(server: tuple[str, int, int]) -> socket.socket:
    return socket.create_connection(server[:2], timeout=10)


def _send_and_read(sock: socket.socket, chunks: Iterator[bytes]) -> bytes:
    """Send ``chunks`` until the server stops reading, then read its answer to the end."""
    try:
        for chunk in chunks:
            sock.sendall(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = b""
    try:
        while data := sock.recv(65536):
            answer += data
    except ConnectionResetError:
        pass
    return answer


def _head(extra: bytes = b"") -> bytes:
    return b"GET /health HTTP/1.1\r\nHost: x\r\n" + extra


def test_a_normal_request_is_served(server: tuple[str, int, int]) -> None:
    r = httpx.get(f"http://{server[0]}:{server[1]}/health", headers={"x-pad": "a" * 8000})
    assert r.status_code == 200


def test_a_10_mb_header_is_431(server: tuple[str, int, int]) -> None:
    with _connect(server) as sock:
        value = (b"a" * 65536 for _ in range(160))  # 10 MB, never ended
        answer = _send_and_read(sock, iter([_head(b"X-Big: "), *value]))
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b'"error_type":"request_too_large"' in answer
    assert b"65536-byte limit" in answer


def test_100000_headers_are_431(server: tuple[str, int, int]) -> None:
    fields = b"".join(b"X-%d: 1\r\n" % i for i in range(100_000))
    with _connect(server) as sock:
        answer = _send_and_read(sock, iter([_head(), fields, b"\r\n"]))
    assert answer.startswith(b"HTTP/1.1 431 ")


def test_many_small_headers_over_the_count_are_431(server: tuple[str, int, int]) -> None:
    fields = b"".join(b"X-%d: 1\r\n" % i for i in range(200))  # 2 KB: under the byte limit
    with _connect(server) as sock:
        answer = _send_and_read(sock, iter([_head(), fields, b"\r\n"]))
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b"more than 128 header fields" in answer


def test_a_header_dribbled_past_the_timeout_is_closed_with_408(
    server: tuple[str, int, int]
) -> None:
    with _connect(server) as sock:
        sock.sendall(_head())
        started = time.monotonic()
        closed_after = None
        for _ in range(40):  # one byte every 0.1 s: never idle, never done
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            time.sleep(0.1)
        answer = _send_and_read(sock, iter([]))
        closed_after = closed_after or time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert closed_after < HEADER_TIMEOUT_S + LINGER_S + 1.5


def test_1000_slow_connections_are_closed_and_their_fds_return(
    server: tuple[str, int, int]
) -> None:
    host, port, pid = server
    baseline = _open_fds(pid)
    socks = []
    try:
        for i in range(1000):
            sock = socket.create_connection((host, port), timeout=10)
            # Half send part of a head and stop; half send nothing at all.
            if i % 2:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
        peak = 0
        for _ in range(5):  # the server accepts them while we count
            peak = max(peak, _open_fds(pid))
            time.sleep(0.05)
        deadline = time.monotonic() + HEADER_TIMEOUT_S + 5
        while _open_fds(pid) > baseline + 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        after = _open_fds(pid)
        closed = 0
        for sock in socks:
            sock.settimeout(2)
            try:
                while sock.recv(65536):  # a 408 for those that sent part of a head, then EOF
                    pass
                closed += 1
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass  # still open
    finally:
        for sock in socks:
            sock.close()
    assert peak > baseline + 300  # the server did accept them
    assert after <= baseline + 5, f"fds: baseline {baseline}, peak {peak}, after {after}"
    assert closed == 1000
    assert httpx.get(f"http://{host}:{port}/health").status_code == 200
