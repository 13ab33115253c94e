"""A real Prometheus (Debian's package) scrapes ``cascade serve --demo`` under short, bounded
traffic; every PromQL expression that ships in deploy/ must evaluate through its HTTP API.

Dashboard targets are expanded as Grafana would (``$instance`` and ``$tier`` to the values the
dashboard's own variable queries return, ``$__rate_interval`` to a window covering the traffic);
most of them must return series. The alert rules are loaded into that Prometheus too: none may
report an evaluation error, and the demo-weights alert must go off for the demo gateway.
"""

from __future__ import annotations

import base64
import io
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image as PILImage
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy import promql
from tests.servers import free_port, run_process, run_prometheus

CASCADE = Path(sys.executable).parent / "cascade"
JOB = "cascade-gateway"
# Share of dashboard targets that must return series after the traffic. The ones allowed to be
# empty need what a short demo cannot produce: degraded answers (a failing strong tier), the
# escalation baseline (a recording rule over a day), shadow agreement (a random sample), drift
# (300 questions a cell; the fleet's also the fleet scope and a snapshot), the decision cache
# (off in the demo) and tenants' 429s (the demo has no tenant limits); every other target must
# return series.
MIN_WITH_SERIES = 0.8
MAY_BE_EMPTY = (
    "cascade_degraded_answers_total",
    "cascade:escalation_ratio",
    "cascade_shadow_choice_agreement",
    "cascade_confidence_psi",
    "cascade_fleet_confidence_psi",
    "cascade_cache_",
    "cascade_tenant_rate_limited_total",
    "cascade_novelty_flags_total",  # the demo's calibration has no reference set
    # per arm only while a canary runs (the demo has no [rollout]): share and decisions are there
    "cascade_rollout_requests_total",
    "cascade_rollout_questions_total",
    "cascade_rollout_request_seconds",
)

QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "Payments", "technical": "Bugs", "sales": None},
    },
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "anger": {
        "type": "score",
        "instructions": "How angry?",
        "criteria": ["calm", "upset", "furious"],
    },
}


def png_b64() -> str:
    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), "blue").save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``cascade serve --demo`` on loopback, through the CLI, in a directory of its own."""
    work = tmp_path_factory.mktemp("demo")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CASCADE_") or k == "CASCADE_CACHE"
    }
    env |= {"CASCADE_DEMO_DIR": str(work / "demo"), "CASCADE_LOG_LEVEL": "warning"}
    url = f"http://127.0.0.1:{free_port()}"
    port = url.rsplit(":", 1)[1]
    cmd = [
        str(CASCADE),
        "serve",
        "--demo",
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--decision-log",
        str(work / "decisions.db"),
    ]  # its panel reads the log's metric
    with run_process(cmd, ready_url=url + "/health", env=env, timeout_s=180):
        deadline = time.monotonic() + 60
        while httpx.get(url + "/ready").status_code != 200:
            assert time.monotonic() < deadline, "demo gateway never became ready"
            time.sleep(0.2)
        yield url


@pytest.fixture(scope="module")
def prometheus(demo: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Scrapes the demo every second under the job name the rules expect, with the shipped
    rule file loaded (alerting rules every second; the recording group keeps its 1m)."""
    work = tmp_path_factory.mktemp("prometheus")
    config = work / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\n"
        f"rule_files: ['{promql.RULES}']\n"
        f"scrape_configs:\n  - job_name: {JOB}\n"
        f"    static_configs: [{{targets: ['{demo.removeprefix('http://')}']}}]\n"
    )
    with run_prometheus(config, work) as url:
        yield url


STATES = [
    "I was charged twice for my March invoice",
    "The app crashes when I upload a photo",
    "Can I get a quote for 40 seats?",
    "Refund please, this is the third time!",
    "Password reset link never arrives",
    "Love the product, just saying thanks",
]


def traffic(url: str) -> int:
    """74 bounded requests from 4 threads: short states (cheap-final, low-confidence
    escalations), a few long ones and an image (strong tier: the default policy sends a state
    past Laya's 512 tokens there), the batch route, and invalid bodies. The long and image
    requests are spread through the short ones, one at a time, so the tiny Clef on a shared
    CPU is never asked for them all at once (admission would refuse some with 503). The demo
    mirrors a quarter of cheap-final requests (a server-side draw), so the shadow panels get
    series with near certainty."""
    spam = {"type": "choice", "instructions": "Spam?", "criteria": ["yes", "no"]}
    # Under the default policy's thresholds the tiny Laya keeps its three-point scores and
    # escalates most else: the anger-only requests are the cheap-final ones shadowing samples.
    mixes = [QUESTIONS, {"spam": spam, "anger": QUESTIONS["anger"]}, {"anger": QUESTIONS["anger"]}]
    short: list[tuple[str, dict[str, Any]]] = []
    for i in range(60):
        state = STATES[i % len(STATES)] + (" Also, again." * (i % 4))
        short.append(
            ("/v1/systemone", {"model": "jev-latest", "state": state, "questions": mixes[i % 3]})
        )
    heavy = [
        (
            "/v1/systemone",
            {"state": STATES[0] + ". " + " ".join(STATES) * 20, "questions": QUESTIONS},
        )
    ] * 4
    heavy += [
        ("/v1/systemone", {"state": "photo", "questions": QUESTIONS, "images": [png_b64()]})
    ] * 2
    bodies: list[tuple[str, dict[str, Any]]] = []
    for i, body in enumerate(short):
        bodies.append(body)
        if i % 10 == 9:
            bodies.append(heavy[i // 10])
    bodies += [("/v1/systemone/batch", {"states": STATES[:3], "questions": QUESTIONS})] * 4
    bodies += [("/v1/systemone", {"state": "no questions", "questions": {}})] * 4

    def post(numbered: tuple[int, tuple[str, dict[str, Any]]]) -> int:
        i, (route, body) = numbered
        return httpx.post(
            url + route, json=body, headers={"x-request-id": f"deploy-{i}"}, timeout=60
        ).status_code

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(post, enumerate(bodies)))
    assert codes.count(422) == 4 and codes.count(200) == len(codes) - 4, codes
    return len(codes)


def gateway_total(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "cascade_requests_total"
    )


def api(prom: str, path: str, **params: Any) -> Any:
    body = httpx.get(prom + path, params=params, timeout=30).json()
    assert body["status"] == "success", (path, params, body)
    return body["data"]


def evaluate(prom: str, expr: promql.Expr) -> list[dict[str, Any]]:
    """An instant query; an error (parse, type, execution) fails with where the PromQL lives."""
    body = httpx.get(prom + "/api/v1/query", params={"query": expr.expr}, timeout=30).json()
    assert body["status"] == "success", f"{expr.where}: {body.get('error')}\n{expr.expr}"
    result = body["data"]["result"]
    return result if isinstance(result, list) else [result]


@pytest.fixture(scope="module")
def scraped(demo: str, prometheus: str) -> str:
    """Traffic sent, and scraped: Prometheus holds the gateway's own request count."""
    deadline = time.monotonic() + 30
    while not api(prometheus, "/api/v1/query", query=f'up{{job="{JOB}"}} == 1')["result"]:
        assert time.monotonic() < deadline, "Prometheus never scraped the demo gateway"
        time.sleep(0.2)
    traffic(demo)
    total = gateway_total(demo)
    query = f'sum(last_over_time(cascade_requests_total{{job="{JOB}"}}[1m]))'
    deadline = time.monotonic() + 30
    while True:
        result = api(prometheus, "/api/v1/query", query=query)["result"]
        if result and float(result[0]["value"][1]) == total:
            return prometheus
        assert time.monotonic() < deadline, f"Prometheus never saw {total} requests: {result}"
        time.sleep(0.2)


def variables(prom: str, board: dict[str, Any]) -> dict[str, list[str]]:
    """Each template variable's values from its own ``label_values`` query, in order, so a
    variable may use the ones before it (``$tier`` is filtered by ``$instance``)."""
    values: dict[str, list[str]] = {}
    for var in board["templating"]["list"]:
        selector, label = promql.label_values_query(var["definition"])
        selector = promql.expand(selector, values, "1m")
        found = api(prom, f"/api/v1/label/{label}/values", **{"match[]": selector})
        assert found, f"variable {var['name']}: {var['definition']} found no values"
        values[var["name"]] = found
    return values


def test_every_dashboard_expression_evaluates_and_most_return_series(scraped: str) -> None:
    board = promql.dashboard()
    values = variables(scraped, board)
    assert set(values["tier"]) == {"laya", "clef"}
    empty, evaluated = [], 0
    for panel, expr in promql.dashboard_exprs(board):
        repeat = panel.get("repeat")
        # A repeated panel is one copy per value of its variable, each with that value alone.
        runs = [{**values, repeat: [v]} for v in values[repeat]] if repeat else [values]
        for run in runs:
            concrete = promql.Expr(expr.where, promql.expand(expr.expr, run, "1m"))
            evaluated += 1
            if not evaluate(scraped, concrete):
                empty.append(concrete)
    unexpected = [e.where for e in empty if not any(m in e.expr for m in MAY_BE_EMPTY)]
    assert unexpected == []
    with_series = 1 - len(empty) / evaluated
    assert with_series >= MIN_WITH_SERIES, f"{len(empty)}/{evaluated} empty: {empty}"


def test_build_panel_shows_demo_weights(scraped: str) -> None:
    board = promql.dashboard()
    weights = next(p for p in promql.panels(board) if p["title"] == "Weights")
    expr = promql.expand(weights["targets"][0]["expr"], variables(scraped, board), "1m")
    assert [r["value"][1] for r in evaluate(scraped, promql.Expr("Weights", expr))] == ["1"]


def test_every_rule_expression_evaluates(scraped: str) -> None:
    for expr in promql.rule_exprs():
        evaluate(scraped, expr)
    # The same rules as Prometheus runs them: loaded, and no evaluation error.
    groups = api(scraped, "/api/v1/rules")["groups"]
    loaded = [rule for group in groups for rule in group["rules"]]
    assert len(loaded) == len(promql.rule_exprs())
    errors = [(r["name"], r.get("lastError")) for r in loaded if r["health"] == "err"]
    assert not errors


def test_demo_weights_alert_goes_off_for_the_demo(scraped: str, demo: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        alerts = api(scraped, "/api/v1/alerts")["alerts"]
        found = [a for a in alerts if a["labels"]["alertname"] == "CascadeDemoWeightsServing"]
        if found:
            break
        assert time.monotonic() < deadline, f"no CascadeDemoWeightsServing alert: {alerts}"
        time.sleep(0.5)
    assert found[0]["labels"]["instance"] == demo.removeprefix("http://")
    assert found[0]["state"] in {"pending", "firing"}


def test_adapter_queue_wait_query_evaluates_per_pod(scraped: str, demo: str) -> None:
    """The HPA's custom metric, with the adapter's template filled in for this one 'pod'."""
    instance = demo.removeprefix("http://")
    exprs = promql.adapter_exprs(f'instance="{instance}"', "instance")
    assert exprs
    for expr in exprs:
        result = evaluate(scraped, expr)
        assert [r["metric"] for r in result] == [{"instance": instance}], expr


def test_keda_trigger_queries_evaluate_to_one_value(scraped: str) -> None:
    """components/keda's Prometheus queries, with the Kubernetes namespace matcher dropped (this
    Prometheus scrapes the demo directly): each is one number KEDA can compare."""
    scaled = promql.load_yaml(promql.DEPLOY / "k8s" / "components" / "keda" / "scaledobject.yaml")
    queries = [
        t["metadata"]["query"] for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"
    ]
    assert len(queries) == 2
    for query in queries:
        assert ', namespace="cascade"' in query
        local = query.replace(', namespace="cascade"', "")
        assert "namespace" not in local, local
        result = evaluate(scraped, promql.Expr("components/keda", local))
        assert len(result) == 1 and float(result[0]["value"][1]) >= 0, (query, result)
