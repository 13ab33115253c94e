"""cascade.overrides.uvicorn against the installed uvicorn: a forgotten signal is not raised
again, the upgrade warning is silenced, and a cycle writes its answer where it is routed. Each
has its control: uvicorn without the override does what the override exists to stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from cascade.overrides.uvicorn import QuietUpgrades, answer_transport, forget_signal, route_answer

UPGRADE = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


class _Transport(asyncio.Transport):
    """Records what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _serve(
    protocol_class: type[H11Protocol], data: bytes, routed: _Transport | None = None
) -> _Transport:
    """What ``protocol_class`` writes to its connection's transport when it receives ``data``
    (the answer goes to ``routed`` instead when given)."""

    async def run() -> _Transport:
        config = uvicorn.Config(_app, lifespan="off", log_config=None)
        config.load()
        protocol = protocol_class(config, ServerState(), {})
        transport = _Transport()
        protocol.connection_made(transport)
        protocol.data_received(data)
        if routed is not None:
            assert protocol.cycle is not None and answer_transport(protocol.cycle) is transport
            route_answer(protocol.cycle, routed)
        for _ in range(10):  # the cycle's task answers within a few turns of the loop
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return transport

    return asyncio.run(run())


def test_a_forgotten_signal_is_not_raised_again_after_shutdown() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: seen.append(sig))
    try:
        server = uvicorn.Server(uvicorn.Config(_app))
        with server.capture_signals():
            server.handle_exit(signal.SIGTERM, None)
            forget_signal(server, signal.SIGTERM)
        assert seen == []
        control = uvicorn.Server(uvicorn.Config(_app))
        with control.capture_signals():
            control.handle_exit(signal.SIGTERM, None)
        assert seen == [signal.SIGTERM]  # uvicorn re-raises what it captured
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_upgrade_is_served_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="uvicorn.error"):
        assert _serve(QuietUpgrades, UPGRADE).written.endswith(b"\r\n\r\nok")
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger="uvicorn.error"):
        _serve(H11Protocol, UPGRADE)
    assert "Unsupported upgrade request." in caplog.messages


def test_a_cycle_writes_its_answer_to_the_transport_it_is_routed_to() -> None:
    routed = _Transport()
    direct = _serve(H11Protocol, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", routed=routed)
    assert routed.written.startswith(b"HTTP/1.1 200 OK\r\n") and routed.written.endswith(b"ok")
    assert direct.written == b""
