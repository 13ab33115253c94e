"""A client that stops sending its body gets 408 within the read timeout, not a hung worker."""

from __future__ import annotations

import socket
import time

from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from tests.servers import serve_app


def test_stalled_body_gets_408() -> None:
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(policy, {"upstream": FakeEngine("upstream")})
    with serve_app(create_app(Settings(body_read_timeout_s=0.5), gateway)) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"st")
            started = time.monotonic()
            reply = sock.recv(65536)
            elapsed = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"error_type":"timeout"' in reply
    assert 0.4 < elapsed < 5
