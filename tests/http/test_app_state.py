"""An app holds everything it was built with: its gateway's gauges (not the last gateway's of
the process), the drain flag the server begins, the model cards' release date from the policy;
its gate and cache gauges (not the process's); what start-up loaded is frozen out of the garbage
collector by the server that runs the app (``cascade serve``), never by the app factory."""

from __future__ import annotations

import datetime
import gc

import httpx
import msgspec
from litestar.testing import TestClient

from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.http.drain import Drain
from cascade.http.server import DrainingServer
from cascade.policy.model import Models, Policy, TypeBands, UpstreamTier
from cascade.settings import Settings
from tests.cache.helpers import Counting, cheap_policy, per_question
from tests.cache.helpers import gateway as cache_gateway
from tests.servers import serve_app


def gateway(tier: str, **models: object) -> Gateway:
    policy = Policy.single_tier(tier, UpstreamTier(urls=["http://127.0.0.1:9"]))
    if models:
        policy = msgspec.structs.replace(policy, models=Models(**models))  # type: ignore[arg-type]
    return Gateway(policy, {tier: FakeEngine(tier)})


def samples(text: str, family: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(family + "{")]


def plain(text: str, family: str) -> list[str]:
    """The samples of a family without labels."""
    return [line for line in text.splitlines() if line.startswith(family + " ")]


def test_each_app_reports_its_own_gateways_gauges() -> None:
    with TestClient(create_app(Settings(), gateway("first"))) as first:
        with TestClient(create_app(Settings(), gateway("second"))):
            text = first.get("/metrics").text
    assert samples(text, "cascade_tier_ready") == ['cascade_tier_ready{tier="first"} 1.0']
    assert samples(text, "cascade_breaker_state") == ['cascade_breaker_state{tier="first"} 0.0']
    build = samples(text, "cascade_build_info")
    assert len(build) == 1 and 'tiers="first=FakeEngine"' in build[0]


def test_the_drain_the_server_begins_is_the_one_the_app_was_built_with() -> None:
    drain = Drain()
    with TestClient(create_app(Settings(), gateway("up"), drain)) as client:
        assert client.get("/ready").status_code == 200
        assert client.get("/health").headers.get("connection") != "close"
        drain.begin()  # what cascade.http.server does on SIGTERM
        assert client.get("/ready").status_code == 503
        assert client.get("/health").headers["connection"] == "close"


def test_model_cards_are_dated_by_the_policy() -> None:
    dated = gateway(
        "up",
        cascade=["jev-latest", "jev-*"],
        strong_only=["big"],
        release_date=datetime.date(2025, 1, 2),
    )
    with TestClient(create_app(Settings(), dated)) as client:
        cards = client.get("/v1/models").json()["models"]
    assert [(c["name"], c["release_date"]) for c in cards] == [
        ("jev-latest", "2025-01-02"),
        ("big", "2025-01-02"),
    ]


def test_a_one_tier_gateway_does_not_describe_a_cascade() -> None:
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    one = Gateway(policy, {"upstream": FakeEngine("upstream")})
    with TestClient(create_app(Settings(), one)) as client:
        cards = client.get("/v1/models").json()["models"]
    assert cards and all(c["description"] == "one tier (upstream), no escalation" for c in cards)


def test_the_server_freezes_what_start_up_loaded_and_the_app_factory_does_not() -> None:
    with TestClient(create_app(Settings(), gateway("fake"))) as client:
        assert client.get("/ready").status_code == 200
        assert gc.get_freeze_count() == 0  # an embedder's process collects as it did
    try:
        with serve_app(
            create_app(Settings(), gateway("fake")),
            server_class=lambda config: DrainingServer(config, Drain(), 0.0),
        ) as url:
            assert httpx.get(url + "/ready").status_code == 200
            assert gc.get_freeze_count() > 0  # cascade serve's process: frozen once started
    finally:
        gc.unfreeze()


def gated(tier: str, threshold: float) -> Gateway:
    """A gateway with a memory cache whose noul cell gates at ``threshold``."""
    policy = cheap_policy(enabled=True)
    policy = msgspec.structs.replace(
        policy,
        thresholds=msgspec.structs.replace(
            policy.thresholds, confidence=TypeBands(noul={"2": threshold})
        ),
    )
    return cache_gateway(policy, Counting(tier, per_question, independent=True))


def test_two_apps_in_one_process_export_their_own_gate_and_cache_gauges() -> None:
    body = {
        "model": "jev-latest",
        "state": "charged twice",
        "questions": {"urgent": {"type": "noul", "instructions": "Urgent?"}},
    }
    with (
        TestClient(create_app(Settings(), gated("laya", 0.3))) as first,
        TestClient(create_app(Settings(), gated("laya", 0.9))) as second,
    ):
        assert first.post("/v1/systemone", json=body).status_code == 200
        texts = [first.get("/metrics").text, second.get("/metrics").text]
    gates = [samples(text, "cascade_gate_threshold") for text in texts]
    assert gates == [
        ['cascade_gate_threshold{band="2",type="noul"} 0.3'],
        ['cascade_gate_threshold{band="2",type="noul"} 0.9'],
    ]
    assert [plain(text, "cascade_cache_entries") for text in texts] == [
        ["cascade_cache_entries 1.0"],
        ["cascade_cache_entries 0.0"],
    ]
    assert [plain(text, "cascade_strong_share") for text in texts] == [
        ["cascade_strong_share 0.0"]
    ] * 2
