"""Slow request bodies: a stalled or too slow body gets 408 and its connection closed, slow
bodies have a budget of their own (429 per client, 503 in all), and they never hold an
admission permit, so an honest client beside many slow senders is still served."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from tests.servers import serve_app

HEAD = (
    b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n"
    b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
)
BODY = {"model": "m", "state": "hello", "questions": {"u": {"type": "noul"}}}


def _gateway() -> Gateway:
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    return Gateway(policy, {"upstream": FakeEngine("upstream")})


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """``(host, port)`` of the gateway with the test's ``Settings`` (``indirect``)."""
    with serve_app(create_app(request.param, _gateway())) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def _slow(address: tuple[str, int]) -> socket.socket:
    """A connection that has sent a head and the first byte of a 1000-byte body."""
    sock = socket.create_connection(address, timeout=10)
    sock.sendall(HEAD + b"{")
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    answer = b""
    while data := sock.recv(65536):
        answer += data
    return answer


@pytest.mark.slow
@pytest.mark.parametrize("served", [Settings(body_read_timeout_s=0.5)], indirect=True)
def test_stalled_body_gets_408(served: tuple[str, int]) -> None:
    with _slow(served) as sock:
        started = time.monotonic()
        reply = _answer(sock)  # the connection is closed after the answer
        elapsed = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"error_type":"timeout"' in reply
    assert b"connection: close" in reply.lower()
    assert 0.4 < elapsed < 5


@pytest.mark.slow
@pytest.mark.parametrize(
    "served",
    [Settings(min_body_rate=100, body_rate_grace_s=0.3, body_read_timeout_s=30)],
    indirect=True,
)
def test_a_body_slower_than_the_minimum_rate_gets_408_long_before_the_timeout(
    served: tuple[str, int],
) -> None:
    """10 bytes/s against a minimum of 100: refused once the grace and the bytes' credit are
    spent (about 0.4 s), not after the 30 s timeout."""
    with _slow(served) as sock:
        started = time.monotonic()
        sock.settimeout(0.1)
        reply = b""
        while not reply and time.monotonic() - started < 10:
            sock.sendall(b" ")
            try:
                reply = sock.recv(65536)
            except TimeoutError:
                continue
        elapsed = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"slower than 100 bytes/s" in reply
    assert elapsed < 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("served", "status"),
    [
        (Settings(max_body_reads=10, max_body_reads_per_client=2), b"429"),
        (Settings(max_body_reads=2, max_body_reads_per_client=10), b"503"),
    ],
    indirect=["served"],
)
def test_slow_bodies_past_their_budget_are_refused_at_once(
    served: tuple[str, int], status: bytes
) -> None:
    """Two slow bodies fill the budget (a client's share, or all of it): a third is refused at
    once with Retry-After and its connection closed, while a body sent whole is still served."""
    first, second = _slow(served), _slow(served)
    try:
        time.sleep(0.3)  # both are being read
        with _slow(served) as third:
            started = time.monotonic()
            reply = _answer(third)
            assert time.monotonic() - started < 2
        assert reply.startswith(b"HTTP/1.1 " + status), reply[:200]
        assert b"retry-after: 1" in reply.lower()
        assert b"connection: close" in reply.lower()
        assert b'"error_type":"overloaded_error"' in reply
        honest = httpx.post(f"http://{served[0]}:{served[1]}/v1/systemone", json=BODY)
        assert honest.status_code == 200, honest.text
    finally:
        first.close()
        second.close()


SLOW_SENDERS = 24


@pytest.mark.parametrize(
    "served",
    [
        Settings(
            max_inflight=4,
            max_body_reads=8,
            max_body_reads_per_client=4,
            body_rate_grace_s=0.5,
            body_read_timeout_s=2,
        )
    ],
    indirect=True,
)
def test_slow_senders_never_starve_an_honest_client(served: tuple[str, int]) -> None:
    """The issue's attack scaled down: 24 senders of one body byte every 0.25 s, reconnecting
    after each answer, against 4 admission permits. Before the fix they held every permit and
    the honest client got 503s; now every one of its requests is answered 200."""
    stop = threading.Event()

    def slow_sender() -> None:
        while not stop.is_set():
            try:
                with _slow(served) as sock:
                    sock.settimeout(0.25)
                    while not stop.is_set():
                        try:
                            if not sock.recv(65536):
                                break
                        except TimeoutError:
                            sock.sendall(b" ")
            except OSError:
                time.sleep(0.05)  # refused or reset: reconnect

    senders = [threading.Thread(target=slow_sender, daemon=True) for _ in range(SLOW_SENDERS)]
    for sender in senders:
        sender.start()
    try:
        time.sleep(1.0)  # the senders hold their places
        statuses = []
        with httpx.Client(base_url=f"http://{served[0]}:{served[1]}", timeout=10) as client:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                statuses.append(client.post("/v1/systemone", json=BODY).status_code)
                time.sleep(0.05)
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=5)
    assert len(statuses) >= 10
    assert statuses == [200] * len(statuses)
