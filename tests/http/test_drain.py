"""SIGTERM under load on ``cascade serve --demo``: /ready turns 503 first, every request the
gateway accepted is answered, and the process exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.servers import free_port, wait_http

BIN = Path(sys.executable).parent
DRAIN_S = 2.0
BODY = {"model": "jev-latest", "state": "I was charged twice for my March invoice",
        "questions": {"urgent": {"type": "noul", "instructions": "Is it urgent?"},
                      "team": {"type": "choice", "instructions": "Which team?",
                               "criteria": ["billing", "technical", "sales"]}}}


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
                    ready.append((time.monotonic(), (await http.get("/ready")).status_code))
                except httpx.ConnectError:
                    return
                await asyncio.sleep(0.05)

    async def terminate() -> float:
        await asyncio.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        return time.monotonic()

    *_, sent = await asyncio.gather(*(client() for _ in range(8)), poll_ready(), terminate())
    return requests, ready, sent


def test_sigterm_drains_then_exits_cleanly(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "CASCADE_DRAIN_S": str(DRAIN_S), "CASCADE_DEMO_DIR": str(tmp_path)}
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen([str(BIN / "cascade"), "serve", "--demo", "--port", str(port),
                             "--log-level", "warning"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        wait_http(url + "/health", timeout_s=120, proc=proc)
        deadline = time.monotonic() + 60
        while httpx.get(url + "/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        requests, ready, sent = asyncio.run(_load(url, proc))
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    statuses = Counter(status for _, status in requests)
    assert set(statuses) == {200}, statuses  # nothing accepted was lost or failed
    first_503 = min(t for t, status in ready if status == 503)
    assert first_503 - sent < 0.5
    assert all(status == 200 for t, status in ready if t < sent)
    # Requests were still routed and answered during the drain window.
    assert sum(1 for t, _ in requests if first_503 < t < sent + DRAIN_S - 0.2) > 10
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
