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

NOUL8 = {
    f"q{i}": {"type": "noul", "instructions": f"Is point {i} of the complaint true?"}
    for i in range(8)
}


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
    response = httpx.post(
        demo + "/v1/systemone/batch",
        timeout=120,
        json={"model": model, "states": states, "questions": NOUL8},
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 64


def test_a_heavy_batch_does_not_starve_a_small_request(demo: str) -> None:
    """64 long states for the strong tier (the tiny Clef on the CPU: seconds per device batch),
    then one small request for it: it is served next, never queued behind the whole batch. The
    order of the two answers shows it (FIFO answers the batch first, after 20 s or more here),
    on a machine of any speed; how long the small one waits is bench material."""

    async def scenario() -> tuple[httpx.Response, float, httpx.Response, float]:
        async with httpx.AsyncClient(base_url=demo, timeout=120) as client:
            states = ["the invoice was wrong " * 300 for _ in range(64)]

            async def post_heavy() -> tuple[httpx.Response, float]:
                response = await client.post(
                    "/v1/systemone/batch",
                    json={"model": "clef-flash", "states": states, "questions": NOUL8},
                )
                return response, time.monotonic()

            heavy = asyncio.create_task(post_heavy())
            await asyncio.sleep(1.0)
            small = await client.post(
                "/v1/systemone",
                json={
                    "model": "clef-flash",
                    "state": "hello there",
                    "questions": {"u": {"type": "noul", "instructions": "Urgent?"}},
                },
            )
            small_done = time.monotonic()
            big, big_done = await heavy
            return small, small_done, big, big_done

    small, small_done, big, big_done = asyncio.run(scenario())
    assert small.status_code == 200, small.text
    assert big.status_code == 200, big.text
    assert len(big.json()["results"]) == 64
    assert small_done < big_done  # answered while the batch still had device batches to run
