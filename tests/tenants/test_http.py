"""Tenants through the HTTP front door: 401s, 429s with their headers in each contract's error
shape, a tenant's own policy, spend counters, Redis outages, and isolation between tenants."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import math
import time
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.http.services import services_of
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from cascade.tenants.admission import TenantAdmission
from cascade.tenants.limits import LocalStore
from tests.cache.helpers import Counting, joint_policy, per_question
from tests.cache.helpers import gateway as cache_gateway
from tests.servers import run_redis, serve_app

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "angry": {"type": "noul", "instructions": "Is it angry?"},
}
BODY = {"model": "jev-latest", "state": "I was charged twice", "questions": QUESTIONS}
DECISION = {
    "model": "jev-latest",
    "input": "I was charged twice",
    "questions": [{"id": "urgent", "type": "noul", "instructions": "Is it urgent?"}],
}


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def app(tmp_path: Path, tenants: str, handler=deterministic_answer):  # type: ignore[no-untyped-def]
    path = tmp_path / "keys.toml"
    path.write_text(tenants)
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(policy, {"upstream": FakeEngine("upstream", handler)})
    return create_app(Settings(api_keys_file=str(path), admin_keys=("admin-key",)), gateway)


TWO = f"""
[[tenant]]
name = "acme"
keys = ["{sha("acme-key")}"]
requests_per_min = 2
input_tokens_per_min = 100000

[[tenant]]
name = "beta"
keys = ["{sha("beta-key")}"]

[[tenant]]
name = "gone"
keys = ["{sha("gone-key")}"]
expires = 2020-01-01T00:00:00Z
"""


@pytest.mark.parametrize("headers", [{}, auth("nope"), auth("gone-key"), {"authorization": "x"}])
def test_a_missing_wrong_or_expired_key_is_401_with_www_authenticate(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    with TestClient(app(tmp_path, TWO)) as client:
        r = client.post("/v1/systemone", json=BODY, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["detail"]["error_type"] == "authentication_error"
        assert client.post("/v1/systemone", json=BODY, headers=auth("beta-key")).status_code == 200


def test_over_its_limit_a_tenant_gets_429_with_openai_rate_limit_headers(tmp_path: Path) -> None:
    with TestClient(app(tmp_path, TWO)) as client:
        clock = [0.0]
        services_of(client.app).tenant_admission = TenantAdmission(LocalStore(lambda: clock[0]))
        first = client.post("/v1/systemone", json=BODY, headers=auth("acme-key"))
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert first.headers["x-ratelimit-reset-requests"] == "30s"
        assert first.headers["x-ratelimit-limit-tokens"] == "100000"
        client.post("/v1/systemone", json=BODY, headers=auth("acme-key"))
        refused = client.post("/v1/systemone", json=BODY, headers=auth("acme-key"))
        assert refused.status_code == 429 and refused.headers["retry-after"] == "30"
        assert refused.json() == {
            "detail": {
                "error_type": "rate_limit_exceeded",
                "message": "tenant `acme` is over its requests_per_min (2); retry in 30 s",
            }
        }
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        decisions = client.post("/v1/decisions", json=DECISION, headers=auth("acme-key"))
        assert decisions.status_code == 429 and decisions.headers["retry-after"] == "30"
        assert decisions.json()["error"]["code"] == "rate_limit_exceeded"
        assert "x-ratelimit-reset-requests" in decisions.headers
        other = client.post("/v1/systemone", json=BODY, headers=auth("beta-key"))
        assert other.status_code == 200 and "x-ratelimit-limit-requests" not in other.headers
        clock[0] = 30.0
        assert client.post("/v1/systemone", json=BODY, headers=auth("acme-key")).status_code == 200
        text = client.get("/metrics", headers=auth("admin-key")).text
    assert 'cascade_tenant_rate_limited_total{limit="requests_per_min",tenant="acme"}' in text


def test_input_tokens_are_charged_after_the_answer(tmp_path: Path) -> None:
    tenants = f'[[tenant]]\nname = "acme"\nkeys = ["{sha("k")}"]\ninput_tokens_per_min = 5\n'
    with TestClient(app(tmp_path, tenants)) as client:
        assert client.post("/v1/systemone", json=BODY, headers=auth("k")).status_code == 200
        refused = client.post("/v1/systemone", json=BODY, headers=auth("k"))
        assert refused.status_code == 429 and "input_tokens_per_min" in refused.text
        assert refused.headers["x-ratelimit-remaining-tokens"] == "0"


@pytest.mark.parametrize("rate", [0.0, 0.5, 1.0])
def test_a_cache_hit_is_charged_at_charge_cached_and_reported_as_cached(
    tmp_path: Path, rate: float
) -> None:
    """A cache hit's input tokens are ``cached_tokens`` in both contracts and charged at
    ``[cache] charge_cached`` (it charged them all and said 0); ``x-ratelimit-remaining-tokens``
    is the level after the answer's charge (it was the level before)."""
    path = tmp_path / "keys.toml"
    path.write_text(
        f'[[tenant]]\nname = "acme"\nkeys = ["{sha("k")}"]\ninput_tokens_per_min = 6000\n'
    )
    gateway = cache_gateway(
        joint_policy(charge_cached=rate), Counting("upstream", per_question, independent=False)
    )
    served = create_app(Settings(api_keys_file=str(path)), gateway)
    with serve_app(served) as url, httpx.Client(base_url=url, timeout=10) as http:
        services_of(served).tenant_admission = TenantAdmission(LocalStore(lambda: 0.0))
        left = 6000
        predicate = {**DECISION, "questions": [{**DECISION["questions"][0], "type": "predicate"}]}
        for route, body in (("/v1/decisions", predicate), ("/v1/systemone", BODY)):
            first, again = (http.post(route, json=body, headers=auth("k")) for _ in range(2))
            assert [first.headers["x-cascade-cache"], again.headers["x-cascade-cache"]] == [
                "miss",
                "hit",
            ]
            usage = [r.json()["usage"] for r in (first, again)]
            tokens = usage[0]["input_tokens"]
            assert tokens > 0 and usage[1]["input_tokens"] == tokens
            if route == "/v1/decisions":
                assert [u["input_tokens_details"]["cached_tokens"] for u in usage] == [0, tokens]
            else:
                assert "cached_tokens" not in usage[0] and usage[1]["cached_tokens"] == tokens
            left -= tokens
            assert first.headers["x-ratelimit-remaining-tokens"] == str(left)
            left -= math.ceil(tokens * rate)
            assert again.headers["x-ratelimit-remaining-tokens"] == str(left)
        own = http.get("/v1/usage", headers=auth("k")).json()["total"]  # and so is its spend
        assert own["input_tokens"] == 6000 - left


def test_a_batch_counts_every_question_of_every_state(tmp_path: Path) -> None:
    tenants = f'[[tenant]]\nname = "acme"\nkeys = ["{sha("k")}"]\nquestions_per_min = 5\n'
    with TestClient(app(tmp_path, tenants)) as client:
        batch = {"states": ["a", "b"], "questions": QUESTIONS}
        ok = client.post("/v1/systemone/batch", json=batch, headers=auth("k"))
        assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-questions"] == "1"
        refused = client.post("/v1/systemone", json=BODY, headers=auth("k"))
        assert refused.status_code == 429 and "questions_per_min" in refused.text


def test_spend_is_counted_per_tenant_and_tier(tmp_path: Path) -> None:
    def sample(counter, tenant: str) -> float:  # type: ignore[no-untyped-def]
        return counter.labels(tenant=tenant, tier="upstream")._value.get()

    before = [
        sample(c, "beta")
        for c in (
            metrics.TENANT_QUESTIONS,
            metrics.TENANT_TOKENS,
            metrics.TENANT_COST,
            metrics.TENANT_REQUESTS,
        )
    ]
    with TestClient(app(tmp_path, TWO)) as client:
        r = client.post("/v1/systemone", json=BODY, headers=auth("beta-key"))
    tokens = r.json()["usage"]["input_tokens"]
    after = [
        sample(c, "beta")
        for c in (
            metrics.TENANT_QUESTIONS,
            metrics.TENANT_TOKENS,
            metrics.TENANT_COST,
            metrics.TENANT_REQUESTS,
        )
    ]
    # an upstream tier costs 20 per 1000 input tokens by default (cascade eval's cost model)
    assert [a - b for a, b in zip(after, before, strict=True)] == pytest.approx(
        [2, tokens, tokens * 20 / 1000, 1]
    )


def test_a_tenant_gets_its_own_policy_overlay(tmp_path: Path) -> None:
    (tmp_path / "acme.toml").write_text('[models]\nunknown = "reject"\ncascade = ["acme-*"]\n')
    tenants = TWO.replace(
        "input_tokens_per_min = 100000\n", 'input_tokens_per_min = 100000\npolicy = "acme.toml"\n'
    )
    with TestClient(app(tmp_path, tenants)) as client:
        acme = client.post("/v1/systemone", json=BODY, headers=auth("acme-key"))
        assert acme.status_code == 400 and acme.json()["detail"]["error_type"] == "api_usage_error"
        mine = client.post(
            "/v1/systemone", json={**BODY, "model": "acme-1"}, headers=auth("acme-key")
        )
        assert mine.status_code == 200, mine.text
        assert client.post("/v1/systemone", json=BODY, headers=auth("beta-key")).status_code == 200


def test_a_bad_overlay_names_its_line(tmp_path: Path) -> None:
    from cascade.policy.files import PolicyError

    (tmp_path / "acme.toml").write_text('[models]\n\n[route]\ncheap = "x"\n')
    tenants = f'[[tenant]]\nname = "acme"\nkeys = ["{sha("k")}"]\npolicy = "acme.toml"\n'
    with pytest.raises(PolicyError, match=r"acme.toml:3: error: an overlay cannot set `route`"):
        app(tmp_path, tenants)
    (tmp_path / "acme.toml").write_text('[thresholds.confidence.choice]\n"2" = 1.5\n')
    with pytest.raises(PolicyError, match=r"acme.toml:2: error: .*outside \[0, 1\]"):
        app(tmp_path, tenants)


@pytest.mark.slow
@pytest.mark.parametrize(("on_error", "status"), [("open", 200), ("closed", 503)])
def test_a_redis_outage_fails_open_or_closed_never_500(
    tmp_path: Path, on_error: str, status: int
) -> None:
    errors = metrics.LIMITS_BACKEND_ERRORS.labels(backend="redis")
    with run_redis() as (url, proc):
        tenants = TWO + f'\n[limits]\nbackend = "redis"\nurl = "{url}"\non_error = "{on_error}"\n'
        with TestClient(app(tmp_path, tenants)) as client:
            ok = client.post("/v1/systemone", json=BODY, headers=auth("acme-key"))
            assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-requests"] == "1"
            proc.terminate()
            proc.wait(timeout=10)
            before = errors._value.get()
            started = time.monotonic()
            r = client.post("/v1/systemone", json=BODY, headers=auth("acme-key"))
            assert time.monotonic() - started < 2.0
            assert r.status_code == status, r.text
            if status == 503:
                assert r.headers["retry-after"] == "1"
                assert r.json()["detail"]["error_type"] == "overloaded_error"
            assert errors._value.get() > before
            assert (
                client.post("/v1/systemone", json=BODY, headers=auth("beta-key")).status_code == 200
            )  # no limits


def test_a_tenant_over_its_limits_never_delays_another(tmp_path: Path) -> None:
    """acme's one request in flight holds the engine for 2 s; its flood meanwhile is
    refused at once (429, max_inflight and requests_per_min), and beta is served at once."""

    async def handler(call: EngineCall) -> EngineAnswer:
        if call.state == "slow":
            await asyncio.sleep(2.0)
        return deterministic_answer(call)

    tenants = TWO.replace("requests_per_min = 2\n", "requests_per_min = 30\nmax_inflight = 1\n")
    with serve_app(app(tmp_path, tenants, handler)) as url:
        with (
            httpx.Client(base_url=url, timeout=10) as http,
            concurrent.futures.ThreadPoolExecutor(12) as pool,
        ):
            http.post("/v1/systemone", json=BODY, headers=auth("beta-key"))  # warm
            slow = pool.submit(
                http.post, "/v1/systemone", json={**BODY, "state": "slow"}, headers=auth("acme-key")
            )
            time.sleep(0.2)

            def timed(key: str) -> tuple[int, float]:
                started = time.perf_counter()
                code = http.post("/v1/systemone", json=BODY, headers=auth(key)).status_code
                return code, time.perf_counter() - started

            flood = [pool.submit(timed, "acme-key") for _ in range(40)]
            served = [timed("beta-key") for _ in range(5)]
            flooded = [f.result() for f in flood]
            assert slow.result().status_code == 200
    assert {code for code, _ in flooded} == {429}
    assert all(code == 200 for code, _ in served)
    assert max(s for _, s in served) < 1.0  # not behind acme's 2 s in the engine
