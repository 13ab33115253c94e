"""A client that goes away: its work is cancelled in the tiers and recorded as such."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from tests.faults.conftest import metric
from tests.servers import serve_app


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
            return metric(url, "cascade_requests_total", route="/v1/systemone",
                          outcome=outcome, status=status)

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
