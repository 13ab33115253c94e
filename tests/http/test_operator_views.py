"""The operator's views (``/metrics``, ``/health``'s details) take an admin key, and a tenant
reads its own usage at ``GET /v1/usage``: against a real gateway (uvicorn on loopback) with two
tenants from a keys file."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from tests.servers import serve_app

QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "angry": {"type": "noul", "instructions": "Is it angry?"},
}
BODY = {"model": "jev-latest", "state": "I was charged twice", "questions": QUESTIONS}
DETAILS = {"tiers", "config", "route", "demo", "ready"}  # what only the operator reads


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


TENANTS = f"""
[[tenant]]
name = "acme"
keys = ["{sha("acme-key")}"]

[[tenant]]
name = "beta"
keys = ["{sha("beta-key")}"]
"""


def serve(tmp_path: Path, **settings: Any) -> Any:
    """A gateway on loopback with ``settings`` (``TENANTS`` as ``keys=True``)."""
    if settings.pop("keys", False):
        path = tmp_path / "keys.toml"
        path.write_text(TENANTS)
        settings["api_keys_file"] = str(path)
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(policy, {"upstream": FakeEngine("upstream", deterministic_answer)})
    return serve_app(create_app(Settings(**settings), gateway))


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with serve(tmp_path, keys=True, admin_keys=("admin-key",)) as found:
        yield found


def test_a_tenant_key_reads_neither_metrics_nor_health_details(url: str) -> None:
    assert httpx.post(url + "/v1/systemone", json=BODY, headers=auth("acme-key")).status_code == 200
    refused = httpx.get(url + "/metrics", headers=auth("beta-key"))
    assert refused.status_code == 403, refused.text
    assert refused.json()["detail"]["error_type"] == "permission_error"
    assert "acme" not in refused.text
    for headers in ({}, auth("wrong")):
        r = httpx.get(url + "/metrics", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    seen = httpx.get(url + "/health", headers=auth("beta-key")).json()
    assert seen.keys() == {"status", "loaded", "revisions"}  # Laya's client keys, no details
    assert httpx.get(url + "/health").json() == {"status": "ok"}


def test_the_admin_key_reads_metrics_and_health_details(url: str) -> None:
    assert httpx.post(url + "/v1/systemone", json=BODY, headers=auth("acme-key")).status_code == 200
    text = httpx.get(url + "/metrics", headers=auth("admin-key")).text
    assert 'cascade_tenant_requests_total{tenant="acme",tier="upstream"}' in text
    health = httpx.get(url + "/health", headers=auth("admin-key")).json()
    assert DETAILS <= health.keys() and "policy_hash" in health["config"]


def test_admin_keys_without_client_keys_gate_the_details(tmp_path: Path) -> None:
    """Client auth off, an admin key set: clients are served, the operator's views are not."""
    with serve(tmp_path, admin_keys=("admin-key",)) as url:
        assert httpx.post(url + "/v1/systemone", json=BODY).status_code == 200
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/metrics", headers=auth("admin-key")).status_code == 200
        assert not DETAILS & httpx.get(url + "/health", headers=auth("anything")).json().keys()
        assert DETAILS <= httpx.get(url + "/health", headers=auth("admin-key")).json().keys()


def test_client_keys_without_an_admin_key_close_metrics_unless_public(tmp_path: Path) -> None:
    with serve(tmp_path, keys=True) as url:
        r = httpx.get(url + "/metrics", headers=auth("acme-key"))
        assert r.status_code == 403 and "CASCADE_ADMIN_KEYS" in r.json()["detail"]["message"]
        assert not DETAILS & httpx.get(url + "/health", headers=auth("acme-key")).json().keys()
    with serve(tmp_path, keys=True, public_metrics=True) as url:
        assert httpx.get(url + "/metrics").status_code == 200


def test_keyless_serves_every_view_to_anyone(tmp_path: Path) -> None:
    with serve(tmp_path) as url:
        assert httpx.get(url + "/metrics").status_code == 200
        assert DETAILS <= httpx.get(url + "/health").json().keys()


def test_usage_answers_each_tenant_its_own_figures_only(url: str) -> None:
    tokens = 0
    for _ in range(3):
        r = httpx.post(url + "/v1/systemone", json=BODY, headers=auth("acme-key"))
        tokens += r.json()["usage"]["input_tokens"]
    batch = {"states": ["a", "b"], "questions": QUESTIONS}
    r = httpx.post(url + "/v1/systemone/batch", json=batch, headers=auth("beta-key"))
    beta_tokens = r.json()["total_usage"]["input_tokens"]

    acme = httpx.get(url + "/v1/usage", headers=auth("acme-key")).json()
    assert acme["tenant"] == "acme" and acme["scope"] == "replica"
    (today,) = acme["days"]
    tier = {"requests": 3, "questions": 6, "input_tokens": tokens, "cost": tokens * 20 / 1000}
    assert today["tiers"] == {"upstream": tier}
    assert {k: today[k] for k in tier} == {**tier, "requests": 3}
    assert acme["total"] == {k: v for k, v in today.items() if k != "date"}

    beta = httpx.get(url + "/v1/usage", headers=auth("beta-key")).json()
    assert beta["tenant"] == "beta"
    assert beta["total"]["tiers"] == {
        "upstream": {
            "requests": 2,
            "questions": 4,
            "input_tokens": beta_tokens,
            "cost": beta_tokens * 20 / 1000,
        }
    }
    for headers in ({}, auth("admin-key")):  # an admin key is no tenant's
        assert httpx.get(url + "/v1/usage", headers=headers).status_code == 401
