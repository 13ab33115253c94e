"""The latency histograms carry the request's trace id as an exemplar in the OpenMetrics
exposition (what Prometheus scrapes with exemplar storage on); the classic text format is
unchanged."""

from __future__ import annotations

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.servers import serve_app
from tests.tracing.helpers import BODY, app, tracing_to
from tests.tracing.receiver import run_receiver

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def test_latency_buckets_link_to_the_trace_in_openmetrics() -> None:
    with run_receiver() as receiver, tracing_to(receiver.url), serve_app(app()) as url:
        response = httpx.post(
            url + "/v1/systemone",
            json=BODY,
            headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"},
        )
        assert response.status_code == 200
        scraped = httpx.get(url + "/metrics", headers={"accept": OPENMETRICS})
        classic = httpx.get(url + "/metrics")
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert scraped.text.endswith("# EOF\n") and scraped.text.count("# EOF") == 1
    linked = {
        (s.name, s.labels.get("route") or s.labels.get("tier"))
        for family in text_string_to_metric_families(scraped.text)
        for s in family.samples
        if s.exemplar and s.exemplar.labels == {"trace_id": TRACE}
    }
    assert ("cascade_request_duration_seconds_bucket", "/v1/systemone") in linked
    assert {
        ("cascade_tier_duration_seconds_bucket", "laya"),
        ("cascade_tier_duration_seconds_bucket", "clef"),
    } <= linked
    assert classic.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in classic.text and "# EOF" not in classic.text


def test_an_unsampled_trace_leaves_no_exemplar() -> None:
    unsampled = "5bf92f3577b34da6a3ce929d0e0e4736"
    with run_receiver() as receiver, tracing_to(receiver.url), serve_app(app()) as url:
        httpx.post(
            url + "/v1/systemone",
            json=BODY,
            headers={"traceparent": f"00-{unsampled}-00f067aa0ba902b7-00"},
        )
        scraped = httpx.get(url + "/metrics", headers={"accept": OPENMETRICS})
    assert unsampled not in scraped.text


def test_the_dashboards_latency_panels_show_exemplars() -> None:
    from tests.deploy import promql

    latency = [
        t
        for panel in promql.panels(promql.dashboard())
        for t in panel.get("targets", [])
        if "_duration_seconds_bucket" in t.get("expr", "")
        and ("cascade_request_" in t["expr"] or "cascade_tier_" in t["expr"])
    ]
    assert len(latency) == 4 and all(t.get("exemplar") is True for t in latency)
    compose = promql.load_yaml(promql.REPO / "docker-compose.yml")
    assert "--enable-feature=exemplar-storage" in compose["services"]["prometheus"]["command"]
