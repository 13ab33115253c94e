"""The send timeout: a client that reads none of a large answer is disconnected (its buffer
freed), one that reads slowly gets the whole answer."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.http.sending import with_send_timeout
from cascade.http.server import guarded, head_limits
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from tests.servers import serve_app

SEND_TIMEOUT_S = 0.5
# 64 states and a choice of 20 labels of 10 KB: a 200 KB request, a 13.5 MB answer (the labels
# come back per state), far more than the kernel's socket buffers take.
LABELS = {f"label{i:02d}" + "x" * 10_000: "d" for i in range(20)}
BODY = json.dumps(
    {
        "model": "m",
        "states": [f"ticket {i}" for i in range(64)],
        "questions": {"c": {"type": "choice", "criteria": LABELS}},
    }
).encode()
REQUEST = (
    b"POST /v1/systemone/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(BODY)
) + BODY


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    # Labels and answers this large need the text limits raised (they refuse the batch else).
    settings = Settings(max_label_chars=20_000, max_batch_answer_bytes=64 * 2**20)
    app = create_app(settings, Gateway(policy, {"upstream": FakeEngine("upstream")}))
    # The keep-alive timer closes a connection soon after its answer was handed over: a
    # closing connection still holds its unsent answer, and the send timeout still ends it.
    protocol = with_send_timeout(guarded(head_limits(settings)), SEND_TIMEOUT_S)
    with serve_app(app, http=protocol, timeout_keep_alive=SEND_TIMEOUT_S / 5) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def _send(address: tuple[str, int], window: int) -> socket.socket:
    """The request sent on a connection whose receive buffer (so its TCP window) is ``window``
    bytes: small, so the client's kernel cannot take the answer in its reader's place."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)  # set before connecting
    sock.settimeout(10)
    sock.connect(address)
    sock.sendall(REQUEST)
    return sock


def _read(sock: socket.socket, *, chunk: int, pause_s: float) -> tuple[bytes, int | None]:
    """Read ``chunk`` bytes, pause ``pause_s``, and again, until the answer is whole or the
    connection ends; returns the answer's body as far as it came, and its content-length."""
    data = b""
    length = None
    while length is None or len(data) < length:
        goal = len(data) + chunk
        while len(data) < goal and (length is None or len(data) < length):
            try:
                piece = sock.recv(65536)
            except ConnectionResetError:
                piece = b""
            if not piece:
                return data, length
            data += piece
            if length is None and b"\r\n\r\n" in data:
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))
        time.sleep(pause_s)
    return data, length


def _timeouts() -> float:
    return REGISTRY.get_sample_value("cascade_send_timeouts_total") or 0.0


def test_a_client_that_never_reads_its_answer_is_disconnected(address: tuple[str, int]) -> None:
    before = _timeouts()
    with _send(address, window=4096) as sock:
        time.sleep(SEND_TIMEOUT_S * 5)  # the answer is ready within this; nothing is read
        data, length = _read(sock, chunk=1 << 20, pause_s=0)
    assert length is not None and length > 13_000_000
    assert len(data) < length / 2  # what the kernel held; the rest was dropped with the buffer
    assert _timeouts() == before + 1


def test_a_slow_reader_gets_its_whole_answer(address: tuple[str, int]) -> None:
    """1 MiB every 0.2 s: progress within every send timeout, so nothing is cut."""
    before = _timeouts()
    with _send(address, window=65536) as sock:
        data, length = _read(sock, chunk=1 << 20, pause_s=0.2)
    assert length is not None and len(data) == length
    assert json.loads(data)["results"]
    assert _timeouts() == before
