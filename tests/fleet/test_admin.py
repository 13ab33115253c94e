"""The fleet's admin calls at their edges, in process: off (409), a wrong scope (422), its Redis
down (503 + Retry-After, the heartbeat counted as failed, requests still served), admin keys
only; which Redis the fleet meets on."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from cascade import metrics
from cascade.fleet.member import fleet_url
from cascade.settings import Settings, SettingsError, from_env
from tests.http.test_reload import ADMIN, BODY, app_on, policy_text
from tests.servers import free_port


def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(policy_text(0.0))
    return path


def test_with_the_fleet_off_its_calls_are_409_and_a_wrong_scope_422(tmp_path: Path) -> None:
    with TestClient(app_on(policy(tmp_path))) as client:
        for response in (
            client.get("/admin/fleet", headers=ADMIN),
            client.post("/admin/reload?scope=fleet", headers=ADMIN),
        ):
            assert response.status_code == 409
            assert "CASCADE_FLEET_REDIS" in response.json()["detail"]["message"]
        wrong = client.post("/admin/reload?scope=galaxy", headers=ADMIN)
        assert wrong.status_code == 422
        assert wrong.json()["detail"][0]["loc"] == ["query", "scope"]
        assert client.post("/admin/reload?scope=replica", headers=ADMIN).status_code == 200
        assert client.get("/admin/fleet").status_code == 401


def test_with_its_redis_down_the_fleet_calls_are_503_and_requests_still_served(
    tmp_path: Path,
) -> None:
    errors = metrics.FLEET_ERRORS._value.get()
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    app = app_on(policy(tmp_path), fleet_redis=down, fleet_heartbeat_s=0.05)
    with TestClient(app) as client:
        for response in (
            client.get("/admin/fleet", headers=ADMIN),
            client.post("/admin/reload?scope=fleet", headers=ADMIN),
        ):
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
        assert client.post("/v1/systemone", json=BODY).status_code == 200
    assert metrics.FLEET_ERRORS._value.get() > errors


def test_the_fleet_meets_on_its_own_redis_else_the_limits_else_the_cache() -> None:
    own = Settings(fleet_redis="redis://fleet:6379/0")
    assert fleet_url(own, "redis://limits/0", "redis://cache/0") == "redis://fleet:6379/0"
    assert fleet_url(Settings(), "redis://limits/0", "redis://cache/0") == "redis://limits/0"
    assert fleet_url(Settings(), None, "redis://cache/0") == "redis://cache/0"
    assert fleet_url(Settings(), None, None) is None


def test_a_fleet_redis_that_is_no_redis_url_stops_the_boot() -> None:
    with pytest.raises(SettingsError, match="CASCADE_FLEET_REDIS=127.0.0.1:6379"):
        from_env({"CASCADE_FLEET_REDIS": "127.0.0.1:6379"})
    assert from_env({"CASCADE_FLEET_REDIS": "rediss://r:6380/1"}).fleet_redis == "rediss://r:6380/1"
