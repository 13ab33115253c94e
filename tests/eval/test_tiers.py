"""A tier's identity (what its cached outputs are keyed by): an upstream's includes the models
and revisions its ``/health`` reports, so a redeployed upstream is asked again."""

from __future__ import annotations

import asyncio

import httpx

from cascade.calls import EngineCall
from cascade.engines.http import HttpEngine
from cascade.eval.tiercache import item_key
from cascade.eval.tiers import identity_of
from cascade.policy.model import UpstreamTier

URL = "http://127.0.0.1:9/v1/systemone"


def _identity(health: httpx.Response) -> str:
    tier = UpstreamTier(urls=[URL], model="clef-flash")
    engine = HttpEngine(
        "up", tier.urls, model=tier.model, transport=httpx.MockTransport(lambda request: health)
    )

    async def run() -> str:
        try:
            return await identity_of("up", tier, engine)
        finally:
            await engine.aclose()

    return asyncio.run(run())


def test_an_upstream_is_known_by_its_url_model_and_reported_revision() -> None:
    def reports(revision: str) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "status": "ok",
                "ready": True,
                "loaded": ["clef-flash"],
                "revisions": {"clef-flash": revision},
            },
        )

    old, new = _identity(reports("aaa111")), _identity(reports("bbb222"))
    assert old.startswith(f"upstream:clef-flash@{URL}:") and "aaa111" in old
    assert old != new and "bbb222" in new
    assert _identity(reports("aaa111")) == old  # the same deployment: the same key
    call = EngineCall(state="s", questions={}, model="m")
    assert item_key(old, None, call) != item_key(new, None, call)
    # an upstream showing no details (no key, or down) is known by its URL and model only
    assert _identity(httpx.Response(503)) == f"upstream:clef-flash@{URL}:{{}}"
