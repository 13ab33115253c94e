"""The demo gateway (tiny random tiers in process) under batches within the documented limits:
a batch is answered on an idle gateway, and a heavy one does not starve a small request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from cascade.http.app import create_app
from cascade.settings import Settings
from tests.servers import serve_app

NOUL8 = {f"q{i}": {"type": "noul", "instructions": f"Is point {i} of the complaint true?"}
         for i in range(8)}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(demo=True, demo_dir=str(tmp_path_factory.mktemp("demo")))
    with serve_app(create_app(settings), timeout_s=300) as url:
        yield url


@pytest.mark.parametrize("model", ["laya", "jev-latest"])
def test_a_batch_of_64_states_and_8_questions_is_answered(demo: str, model: str) -> None:
    """512 rows from one request: more than the Laya tier's row queue (256), which bounds the
    *other* requests' rows; a request's own rows never refuse it."""
    states = [f"ticket {i}: the invoice was wrong " * 5 for i in range(64)]
    response = httpx.post(demo + "/v1/systemone/batch", timeout=120,
                          json={"model": model, "states": states, "questions": NOUL8})
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 64


def test_a_heavy_batch_does_not_starve_a_small_request(demo: str) -> None:
    """64 long states for the strong tier (the tiny Clef on the CPU: seconds per device batch),
    then one small request for it: it is served next, never queued behind the whole batch."""
    async def scenario() -> tuple[httpx.Response, float]:
        async with httpx.AsyncClient(base_url=demo, timeout=120) as client:
            states = ["the invoice was wrong " * 300 for _ in range(64)]
            heavy = asyncio.create_task(client.post("/v1/systemone/batch", json={
                "model": "clef-flash", "states": states, "questions": NOUL8}))
            await asyncio.sleep(1.0)
            started = time.monotonic()
            small = await client.post("/v1/systemone", json={
                "model": "clef-flash", "state": "hello there",
                "questions": {"u": {"type": "noul", "instructions": "Urgent?"}}})
            took = time.monotonic() - started
            heavy.cancel()  # hang up: the gateway drops the batch's queued work
            await asyncio.gather(heavy, return_exceptions=True)
            return small, took

    small, took = asyncio.run(scenario())
    assert small.status_code == 200, small.text
    assert took < 8.0  # the admission deadline; FIFO behind the batch took 20 s or more
