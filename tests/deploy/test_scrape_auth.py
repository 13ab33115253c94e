"""The shipped scrape configuration reaches a gateway whose ``/metrics`` takes only the admin
key: a real Prometheus (Debian's) runs deploy/prometheus/prometheus.yml's gateway job, its
``authorization`` as shipped, against a gateway on loopback whose admin keys file is the very
file that job sends (docker-compose.yml mounts it as both). The same job sending a client key
is refused, so the check bites."""

from __future__ import annotations

import copy
import hashlib
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from tests.deploy import promql
from tests.servers import run_prometheus, serve_app

CONFIG = promql.DEPLOY / "prometheus" / "prometheus.yml"
JOB = "cascade-gateway"


def gateway_job() -> dict[str, Any]:
    (job,) = [j for j in promql.load_yaml(CONFIG)["scrape_configs"] if j["job_name"] == JOB]
    return dict(job)


def test_compose_gives_the_gateways_the_admin_key_prometheus_sends() -> None:
    compose = promql.load_yaml(promql.REPO / "docker-compose.yml")
    sent = CONFIG.parent / gateway_job()["authorization"]["credentials_file"]
    for name in ("gateway", "gateway-ollama"):
        service = compose["services"][name]
        secret = service["environment"]["CASCADE_ADMIN_KEYS_FILE"].removeprefix("/run/secrets/")
        assert secret in service["secrets"], name
        assert (promql.REPO / compose["secrets"][secret]["file"]).resolve() == sent.resolve()
        assert "CASCADE_PUBLIC_METRICS" not in service["environment"]
    assert len(sent.read_text().split()) == 1  # the whole file is the token


def test_prometheus_scrapes_with_the_admin_key_and_not_with_a_client_key(tmp_path: Path) -> None:
    job = gateway_job()
    sent = CONFIG.parent / job["authorization"]["credentials_file"]
    keys = tmp_path / "keys.toml"
    digest = hashlib.sha256(b"client-key").hexdigest()
    keys.write_text(f'[[tenant]]\nname = "acme"\nkeys = ["sha256:{digest}"]\n')
    (tmp_path / "client-key").write_text("client-key\n")
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(policy, {"upstream": FakeEngine("upstream", deterministic_answer)})
    settings = Settings(api_keys_file=str(keys), admin_keys_file=str(sent))
    with serve_app(create_app(settings, gateway)) as url:
        target = {"targets": [url.removeprefix("http://")]}
        shipped = {k: v for k, v in job.items() if k not in ("dns_sd_configs", "relabel_configs")}
        shipped |= {"static_configs": [target], "scrape_interval": "1s"}
        shipped["authorization"] = {"credentials_file": str(sent)}
        client = copy.deepcopy(shipped) | {"job_name": "with-a-client-key"}
        client["authorization"] = {"credentials_file": str(tmp_path / "client-key")}
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({"scrape_configs": [shipped, client]}))
        with run_prometheus(config, tmp_path) as prom:
            up = wait_for_up(prom, {JOB, "with-a-client-key"})
    assert up == {JOB: 1.0, "with-a-client-key": 0.0}


def wait_for_up(prom: str, jobs: set[str], timeout_s: float = 30.0) -> dict[str, float]:
    """``up`` of each of ``jobs`` once Prometheus has scraped them all."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = httpx.get(prom + "/api/v1/query", params={"query": "up"}, timeout=5).json()
        found = {r["metric"]["job"]: float(r["value"][1]) for r in body["data"]["result"]}
        if jobs <= found.keys():
            return found
        time.sleep(0.2)
    raise AssertionError(f"Prometheus did not scrape {jobs} within {timeout_s} s")
