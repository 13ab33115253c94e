"""The served gateway (``cascade serve`` as a process): request-head limits and timeouts."""

from __future__ import annotations

import json
import os
import re
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
    env = {
        **os.environ,
        "CASCADE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "CASCADE_KEEP_ALIVE_S": "1",
    }
    cmd = [
        str(BIN / "cascade"),
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
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
    server: tuple[str, int, int],
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
    server: tuple[str, int, int],
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


# ---------------------------------------------------------------- issue 16: framing and errors

_VALID = (
    b'{"model": "jev-latest", "state": "hi", "questions": '
    b'{"q": {"type": "noul", "instructions": "Is it?"}}}'
)
_H2C = (
    b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
)


def _segments(server: tuple[str, int, int], *segments: bytes) -> bytes:
    """Send each segment in a TCP segment of its own (a pause between them), then read the
    answers until the server closes the connection (its keep-alive is 1 s)."""
    with _connect(server) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for segment in segments:
            sock.sendall(segment)
            time.sleep(0.3)
        return _send_and_read(sock, iter([]))


def _statuses(answer: bytes) -> list[bytes]:
    """The status lines in ``answer`` (a response may follow the previous body directly)."""
    return re.findall(rb"HTTP/1\.1 \d{3} [A-Za-z ]*", answer)


def test_an_h2c_upgrade_body_in_a_later_segment_is_the_body_not_a_second_request(
    server: tuple[str, int, int],
) -> None:
    smuggled = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _segments(server, _H2C % len(smuggled), smuggled)
    # One answer, to the POST: its body (not JSON) was read; before, the POST got 422 "Field
    # required" (no body) and the body was served as a second request (200 with the metrics).
    assert _statuses(answer) == [b"HTTP/1.1 422 Unprocessable Entity"], answer[:400]
    assert b"json_invalid" in answer
    assert b"# HELP" not in answer


def test_an_h2c_upgrade_request_is_served_as_http_1_1_with_its_body(
    server: tuple[str, int, int],
) -> None:
    follow_up = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _segments(server, _H2C % len(_VALID), _VALID, follow_up)
    statuses = _statuses(answer)
    assert len(statuses) == 2, answer[:600]  # the POST, then the GET on the same connection
    assert not statuses[0].startswith((b"HTTP/1.1 101", b"HTTP/1.1 422")), answer[:600]
    assert statuses[1] == b"HTTP/1.1 200 OK"


@pytest.mark.parametrize("writes", [1, 100])
def test_a_100_kb_header_is_431_in_one_write_or_many(
    server: tuple[str, int, int], writes: int
) -> None:
    head = _head(b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    size = -(-len(head) // writes)
    with _connect(server) as sock:
        answer = _send_and_read(sock, (head[i : i + size] for i in range(0, len(head), size)))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"65536-byte limit" in answer


def test_a_head_just_under_the_limit_in_one_write_is_served(server: tuple[str, int, int]) -> None:
    head = _head(b"X-Big: ")
    head += b"a" * (65536 - len(head) - 4) + b"\r\n\r\n"
    assert len(head) == 65536
    with _connect(server) as sock:
        sock.sendall(head)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics", "/v1/models"])
def test_head_is_answered_wherever_get_is(server: tuple[str, int, int], path: str) -> None:
    url = f"http://{server[0]}:{server[1]}{path}"
    get, head = httpx.get(url), httpx.head(url)
    assert head.status_code == get.status_code != 405
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    if path != "/metrics":  # the metrics change between the two requests
        assert head.headers["content-length"] == str(len(get.content))


def test_head_on_a_post_route_is_405(server: tuple[str, int, int]) -> None:
    r = httpx.head(f"http://{server[0]}:{server[1]}/v1/systemone")
    assert r.status_code == 405
    assert r.content == b""


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (b"GET /health HTTP/1.1\r\n\r\n", b"Missing mandatory Host"),
        (b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b"multiple Host"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"illegal header line"),
        (
            b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"both Content-Length and Transfer-Encoding",
        ),
        (
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"conflicting Content-Length",
        ),
        (
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"Transfer-Encoding: chunked is supported",
        ),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", b"illegal request line"),
    ],
)
def test_a_malformed_request_is_400_in_the_contract_error_shape(
    server: tuple[str, int, int], head: bytes, reason: bytes
) -> None:
    with _connect(server) as sock:
        answer = _send_and_read(sock, iter([head]))
    status, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status == b"HTTP/1.1 400 Bad Request", answer[:300]
    assert b"content-type: application/json" in headers
    error = json.loads(body)
    assert error["detail"]["error_type"] == "invalid_request_error"
    assert reason.decode() in error["detail"]["message"]


def test_http_1_0_without_host_is_served(server: tuple[str, int, int]) -> None:
    with _connect(server) as sock:
        answer = _send_and_read(sock, iter([b"GET /health HTTP/1.0\r\n\r\n"]))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_pipelined_requests_are_answered_in_order(server: tuple[str, int, int]) -> None:
    requests = b"".join(b"GET /health?n=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(50))
    with _connect(server) as sock:
        answer = _send_and_read(
            sock, iter([requests + b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"])
        )
    assert _statuses(answer) == [b"HTTP/1.1 200 OK"] * 50 + [b"HTTP/1.1 404 Not Found"]


def test_an_app_failure_before_its_answer_is_a_json_500() -> None:
    """uvicorn answers an exception escaping the app with a text/plain 500; ``served`` answers
    it in the contract's shape (the app's own handlers catch its errors; this is the rest)."""
    import asyncio

    from cascade.http.server import served

    async def broken(scope: object, receive: object, send: object) -> None:
        raise RuntimeError("boom")

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "GET", "path": "/health", "headers": []}
    asyncio.run(served(broken)(scope, receive, send))
    assert sent[0]["status"] == 500
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["detail"]["error_type"] == "api_error"


def test_pipelined_answers_stay_in_order_before_a_refused_request(
    server: tuple[str, int, int],
) -> None:
    """An answer's head is held until its body (``_HeadWithBody``); a malformed request right
    behind it is refused only after that answer went out whole."""
    requests = b"".join(b"GET /health?n=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(5))
    with _connect(server) as sock:
        answer = _send_and_read(sock, iter([requests + b"GET /health HTTP/1.1\r\n\r\n"]))
    assert _statuses(answer) == [b"HTTP/1.1 200 OK"] * 5 + [b"HTTP/1.1 400 Bad Request"]


def test_a_small_answer_is_one_write_and_a_held_head_goes_out_in_the_same_turn() -> None:
    import asyncio

    from cascade.http.protocol import ONE_WRITE_BYTES, _HeadWithBody

    class Recorder:
        def __init__(self) -> None:
            self.writes: list[bytes] = []
            self.closed = False

        def write(self, data: bytes) -> None:
            assert not self.closed
            self.writes.append(data)

        def close(self) -> None:
            self.closed = True

        def is_closing(self) -> bool:
            return self.closed

    async def scenario() -> list[list[bytes]]:
        loop = asyncio.get_running_loop()
        small, large, alone, closed = Recorder(), Recorder(), Recorder(), Recorder()
        for transport, body in ((small, b"{}"), (large, b"x" * (ONE_WRITE_BYTES + 1))):
            cycle = _HeadWithBody(transport, loop)  # type: ignore[arg-type]
            cycle.write(b"HEAD")
            cycle.write(body)
            cycle.write(b"")  # h11's end of a Content-Length body
        held = _HeadWithBody(alone, loop)  # type: ignore[arg-type]
        held.write(b"HEAD")
        assert alone.writes == []
        await asyncio.sleep(0)  # the end of this turn of the loop
        closing = _HeadWithBody(closed, loop)  # type: ignore[arg-type]
        closing.write(b"HEAD")
        closing.close()
        return [small.writes, large.writes, alone.writes, closed.writes]

    small, large, alone, closed = asyncio.run(scenario())
    assert small == [b"HEAD{}", b""]
    assert large == [b"HEAD", b"x" * (ONE_WRITE_BYTES + 1), b""]
    assert alone == [b"HEAD"] and closed == [b"HEAD"]
