"""``cascade_inflight_requests``: the in-flight permits taken now, read at scrape time (KEDA's
in-flight trigger, deploy/k8s/components/keda)."""

from __future__ import annotations

from pathlib import Path

from litestar.testing import TestClient

from tests.fleet.test_admin import policy
from tests.http.test_reload import ADMIN, app_on


def inflight(client: TestClient) -> list[str]:
    text = client.get("/metrics", headers=ADMIN).text
    return [line for line in text.splitlines() if line.startswith("cascade_inflight_requests ")]


def test_the_gauge_reads_the_permits_held_now(tmp_path: Path) -> None:
    with TestClient(app_on(policy(tmp_path))) as client:
        assert inflight(client) == ["cascade_inflight_requests 0.0"]
        with client.app.state.admission.permit(3, tenant="acme"):
            assert inflight(client) == ["cascade_inflight_requests 3.0"]
        assert inflight(client) == ["cascade_inflight_requests 0.0"]
