"""A client that goes away: its work is cancelled in the tiers and recorded as such."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app, unless_disconnected
from cascade.http.reading import ClientGone
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from tests.faults.conftest import metric
from tests.servers import serve_app


@pytest.mark.slow
def test_a_disconnected_clients_work_is_dropped() -> None:
    seen: dict[str, float] = {}

    async def slow(call: EngineCall) -> EngineAnswer:
        seen["started"] = time.monotonic()
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            seen["cancelled"] = time.monotonic()
            raise
        seen["finished"] = time.monotonic()
        return deterministic_answer(call)

    policy = Policy.single_tier("up", UpstreamTier(urls=["http://127.0.0.1:9"]))
    app = create_app(Settings(), Gateway(policy, {"up": FakeEngine("up", slow)}))
    body = {"model": "m", "state": "s", "questions": {"u": {"type": "noul"}}}
    with serve_app(app) as url:

        def count(outcome: str, status: str) -> float:
            return metric(
                url, "cascade_requests_total", route="/v1/systemone", outcome=outcome, status=status
            )

        before = count("cancelled", "499"), count("ok", "200")
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/systemone", json=body, timeout=0.5)
        deadline = time.monotonic() + 2
        while "cancelled" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "cancelled" in seen and "finished" not in seen
        assert seen["cancelled"] - seen["started"] < 1.0
        while count("cancelled", "499") == before[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (count("cancelled", "499"), count("ok", "200")) == (before[0] + 1, before[1])


class _Client:
    """The ASGI side ``unless_disconnected`` reads: ``receive`` reports a disconnect after
    ``gone_after_s`` (never when None); ``reads`` counts the calls."""

    def __init__(self, gone_after_s: float | None) -> None:
        self.gone_after_s = gone_after_s
        self.reads = 0

    async def receive(self) -> dict[str, str]:
        self.reads += 1
        if self.gone_after_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.gone_after_s or 0)
        return {"type": "http.disconnect"}


def test_a_request_answered_within_the_watch_delay_is_never_watched() -> None:
    client = _Client(gone_after_s=0)

    async def scenario() -> str:
        async def work() -> str:
            await asyncio.sleep(0)
            return "answer"

        return await unless_disconnected(client, work())  # type: ignore[arg-type]

    assert asyncio.run(scenario()) == "answer"
    assert client.reads == 0  # no watcher task ran


@pytest.mark.slow
def test_a_client_gone_mid_request_cancels_its_work_and_leaves_no_cancellation() -> None:
    client = _Client(gone_after_s=0.1)
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        async def work() -> str:
            try:
                await asyncio.sleep(3)
            except asyncio.CancelledError:
                seen["cancelled"] = True
                raise
            return "answer"

        task = asyncio.current_task()
        assert task is not None
        with pytest.raises(ClientGone):
            await unless_disconnected(client, work())  # type: ignore[arg-type]
        seen["cancelling"] = task.cancelling()
        await asyncio.sleep(0.01)  # the request's task goes on (it records the 499)
        seen["went_on"] = True

    started = time.monotonic()
    asyncio.run(scenario())
    assert seen == {"cancelled": True, "cancelling": 0, "went_on": True}
    assert time.monotonic() - started < 1.0


def test_a_cancellation_that_is_not_the_clients_stays_one() -> None:
    client = _Client(gone_after_s=None)

    async def scenario() -> None:
        async def work() -> None:
            await asyncio.sleep(3)

        request = asyncio.ensure_future(unless_disconnected(client, work()))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)  # past the watch delay: the watcher is waiting
        request.cancel()  # the server shutting down
        with pytest.raises(asyncio.CancelledError):
            await request

    asyncio.run(scenario())
    assert client.reads == 1
