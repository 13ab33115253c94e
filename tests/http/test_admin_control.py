"""The live gate's admin routes: status, freeze and unfreeze, behind the admin key."""

from __future__ import annotations

from litestar.testing import TestClient

from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.http.services import services_of
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings


def _client() -> TestClient:
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(policy, {"upstream": FakeEngine("upstream")})
    settings = Settings(api_keys=("client",), admin_keys=("admin",))
    return TestClient(create_app(settings, gateway=gateway))


def test_freeze_and_unfreeze_hold_the_gate_and_status_says_so():
    admin = {"authorization": "Bearer admin"}
    with _client() as client:
        assert client.get("/admin/control", headers=admin).json()["frozen"] is False
        frozen = client.post("/admin/control/freeze", headers=admin)
        assert frozen.status_code == 200 and frozen.json()["frozen"] is True
        assert services_of(client.app).gateway.control.frozen
        thawed = client.post("/admin/control/unfreeze", headers=admin)
        assert thawed.status_code == 200 and thawed.json()["frozen"] is False


def test_control_routes_refuse_client_keys_and_no_key():
    with _client() as client:
        as_client = client.post("/admin/control/freeze", headers={"authorization": "Bearer client"})
        assert as_client.status_code == 403
        assert client.post("/admin/control/freeze").status_code == 401
        assert services_of(client.app).gateway.control.frozen is False


def test_feedback_labels_go_to_the_live_control():
    with _client() as client:
        assert services_of(client.app).learner is services_of(client.app).gateway.control
