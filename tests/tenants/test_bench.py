"""``cascade bench tenants`` on loopback: its phases, statuses and table."""

from __future__ import annotations

from pathlib import Path

from cascade.bench import tenants
from tests.servers import serve_app
from tests.tenants.test_http import TWO, app


def test_the_bench_reports_each_phase(tmp_path: Path) -> None:
    with serve_app(app(tmp_path, TWO)) as url:
        result = tenants.run(
            url, quiet_key="beta-key", flood_key="acme-key", requests=5, rate=20.0, timeout_s=10.0
        )
    phases = result["phases"]
    assert list(phases) == ["alone", "flood", "alone_again"]
    assert all(p["quiet_statuses"] == {200: 5} for p in phases.values())
    assert phases["flood"]["flood_statuses"].get(429, 0) > 0  # acme: 2 requests a minute
    assert phases["alone"]["flood_statuses"] == {}
    text = tenants.table(result)
    assert "flood" in text and "429:" in text
