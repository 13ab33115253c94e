"""A remote tier that changes the model its answers name, or the revisions its ``/health``
lists, is logged (old -> new) and counted per tier; URLs of one pool are judged apart."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from prometheus_client import REGISTRY

from cascade.engines.http import HttpEngine
from tests.engines.test_http import ANSWERS, CALL


def changes(tier: str) -> float:
    return REGISTRY.get_sample_value("cascade_upstream_model_changes_total", {"tier": tier}) or 0


class Upstream:
    """A fake ``/v1/systemone`` server: its model and revision can be swapped under load."""

    def __init__(self, model: str = "clef-flash", revision: str = "r1") -> None:
        self.model, self.revision = model, revision
        self.health_auth: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            self.health_auth.append(request.headers.get("authorization"))
            return httpx.Response(
                200,
                json={
                    "status": "ok",
                    "loaded": [self.model],
                    "revisions": {self.model: self.revision},
                },
            )
        model = f"{self.model}@{request.url.host}" if request.url.host != "up" else self.model
        return httpx.Response(
            200, json={"model": model, "answers": ANSWERS, "usage": {"input_tokens": 3}}
        )


def test_a_new_model_behind_the_same_url_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = Upstream()

    async def scenario() -> None:
        eng = HttpEngine(
            "strong-a",
            ["http://up"],
            api_key="k",
            health_interval_s=0.02,
            transport=httpx.MockTransport(upstream),
        )
        await eng.start()
        for _ in range(3):
            await eng.answer(CALL)
        assert changes("strong-a") == 0  # the same model, call after call
        upstream.model = "clef-flash-2"
        with caplog.at_level(logging.WARNING, logger="cascade"):
            await eng.answer(CALL)
            await eng.answer(CALL)
        assert changes("strong-a") == 1
        await asyncio.sleep(0.1)  # the probe sees the new revisions too
        await eng.aclose()

    asyncio.run(scenario())
    assert changes("strong-a") == 2
    assert (
        "tier strong-a: http://up now reports model clef-flash-2 (was clef-flash)"
        in caplog.messages
    )
    assert upstream.health_auth and set(upstream.health_auth) == {"Bearer k"}


def test_a_new_revision_alone_counts_and_urls_of_a_pool_are_judged_apart() -> None:
    upstream = Upstream()

    async def scenario() -> None:
        eng = HttpEngine(
            "strong-b",
            ["http://a", "http://b"],
            health_interval_s=0.02,
            transport=httpx.MockTransport(upstream),
        )
        await eng.start()
        for _ in range(4):  # round robin: a and b name different models, each its own
            await eng.answer(CALL)
        assert changes("strong-b") == 0
        upstream.revision = "r2"
        await asyncio.sleep(0.1)
        await eng.aclose()

    asyncio.run(scenario())
    assert changes("strong-b") == 2  # each URL's revision changed once
