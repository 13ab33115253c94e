"""Body decoding runs on its own bounded threads: slow bodies never starve other requests."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import zstandard

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http import intake
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from tests.servers import serve_app

BODY = {
    "model": "jev-latest",
    "state": "hello",
    "questions": {"urgent": {"type": "noul", "instructions": "Urgent?"}},
}


async def _engine_using_the_default_executor(call: EngineCall) -> EngineAnswer:
    # Engines tokenize and prepare on asyncio's default executor, as Laya and Clef do.
    return await asyncio.to_thread(deterministic_answer, call)


@pytest.mark.slow
def test_slow_bodies_do_not_starve_other_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = intake.decode_content

    def stuck_decode(body: bytes, encoding: str | None, *, limit: int) -> bytes:
        if encoding == "zstd":
            release.wait(timeout=8)  # a hostile body that takes seconds to decode
        return real(body, encoding, limit=limit)

    monkeypatch.setattr(intake, "decode_content", stuck_decode)
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(
        policy, {"upstream": FakeEngine("upstream", _engine_using_the_default_executor)}
    )
    app = create_app(Settings(decode_threads=1, decode_queue=8), gateway)
    compressed = zstandard.compress(httpx.Request("POST", "/", json=BODY).content)

    async def scenario(url: str) -> tuple[list[int], int, float]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            slow = [
                asyncio.create_task(
                    client.post(
                        "/v1/systemone",
                        content=compressed,
                        headers={"content-type": "application/json", "content-encoding": "zstd"},
                    )
                )
                for _ in range(40)
            ]
            await asyncio.sleep(1.0)  # every slow body is now decoding or queued
            started = time.perf_counter()
            normal = await client.post("/v1/systemone", json=BODY)
            elapsed = time.perf_counter() - started
            release.set()
            statuses = [r.status_code for r in await asyncio.gather(*slow)]
            return statuses, normal.status_code, elapsed

    with serve_app(app) as url:
        statuses, normal_status, elapsed = asyncio.run(scenario(url))
    assert normal_status == 200
    assert elapsed < 2.0, f"a plain request waited {elapsed:.1f} s behind slow bodies"
    # One thread and eight places in the queue: the rest were refused at once, with 503.
    assert statuses.count(200) == 9
    assert statuses.count(503) == 31
