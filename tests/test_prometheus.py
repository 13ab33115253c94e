"""A real Prometheus (Debian's package) scrapes the gateway; its HTTP API must show every family.

The cascade here runs two fake tiers with unique names, so the label sets are this test's own
even though the metric registry is process-wide; expected values are deltas from a baseline
read before the traffic. Without a ``prometheus`` binary the test fails (docs/development.md:
``apt-get install prometheus``); ``.ci/run`` installs it.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image as PILImage

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.errors import EngineUnavailable
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import (
    Bands,
    BreakerConfig,
    Checkpoints,
    ClefTier,
    LayaTier,
    Policy,
    Route,
    Shadow,
    Thresholds,
    TypeBands,
)
from cascade.settings import Settings
from tests.servers import run_prometheus, scrape, serve_app

CHEAP, STRONG = "laya_prom", "clef_prom"


def cheap_handler(call: EngineCall) -> EngineAnswer:
    """Confident on every question except ids starting with ``hard``."""
    results = {}
    for qid, question in call.questions.items():
        n = 2 if question.type == "noul" else len(question.criteria)
        if qid.startswith("hard"):
            probs = [1.0 / n] * n
        else:
            probs = [0.97] + [0.03 / (n - 1)] * (n - 1)
        results[qid] = QuestionResult(type=question.type, probabilities=probs)
    return EngineAnswer(
        model="laya-fake",
        results=results,
        usage=EngineUsage(input_tokens=10 * len(results), state_tokens=5),
    )


class Switch:
    down = False


def strong_handler(call: EngineCall) -> EngineAnswer:
    if Switch.down:
        raise EngineUnavailable("strong tier is down")
    return deterministic_answer(call)


def policy() -> Policy:
    confidence = TypeBands(choice=Bands(three_five=0.9))
    return Policy(
        tiers={
            CHEAP: LayaTier(checkpoints=Checkpoints(english="unused")),
            STRONG: ClefTier(release="unused"),
        },
        route=Route(cheap=CHEAP, strong=STRONG),
        thresholds=Thresholds(confidence=confidence),
        breaker={
            STRONG: BreakerConfig(window_s=60, min_calls=2, failure_ratio=0.5, cooldown_s=3.0)
        },
        shadow=Shadow(fraction=1.0, max_concurrent=4),
    )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, str]]:
    gateway = Gateway(
        policy(),
        {CHEAP: FakeEngine(CHEAP, cheap_handler), STRONG: FakeEngine(STRONG, strong_handler)},
    )
    with serve_app(create_app(Settings(), gateway)) as url:
        port = url.rsplit(":", 1)[1]
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 250ms\n  scrape_timeout: 240ms\n"
            "scrape_configs:\n  - job_name: cascade\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{port}']\n"
        )
        with run_prometheus(config, tmp_path) as prom:
            yield url, prom


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def query(prom: str, promql: str) -> float:
    """The series' latest scraped value(s), summed. ``last_over_time`` rather than an instant
    query: a scrape that times out on a loaded machine marks series stale for a moment."""
    expr = promql if "(" in promql else f"last_over_time({promql}[1m])"
    data = httpx.get(prom + "/api/v1/query", params={"query": expr}).json()
    result = data["data"]["result"]
    return sum(float(r["value"][1]) for r in result)


def png_b64() -> str:
    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), "red").save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


EASY = {
    "team": {"type": "choice", "instructions": "Team?", "criteria": ["a", "b", "c"]},
    "urgent": {"type": "noul", "instructions": "Urgent?"},
}
HARD = {
    "hard": {"type": "choice", "instructions": "Team?", "criteria": ["a", "b", "c"]},
    "urgent": {"type": "noul", "instructions": "Urgent?"},
}


def traffic(url: str) -> None:
    post = lambda body: httpx.post(url + "/v1/systemone", json=body, timeout=30)  # noqa: E731
    for _ in range(3):
        assert post({"state": "easy", "questions": EASY}).status_code == 200
    hard = post({"state": "hard", "questions": HARD}).json()
    assert hard["x_cascade"]["tiers"] == {"hard": STRONG, "urgent": CHEAP}
    assert hard["x_cascade"]["reasons"] == {"hard": "low_confidence"}
    image = post({"state": "img", "questions": EASY, "images": [png_b64()]}).json()
    assert set(image["x_cascade"]["tiers"].values()) == {STRONG}
    assert post({"state": "bad", "questions": {}}).status_code == 422
    Switch.down = True
    # 2 successes sit in the breaker's window (shadow calls never count): the 2nd failure opens
    # it (ratio 0.5).
    for _ in range(7):
        degraded = post({"state": "hard", "questions": HARD})
        assert degraded.status_code == 200
        assert degraded.json()["x_cascade"]["degraded"]["hard"] in {"strong_failed", "breaker_open"}
    assert post({"state": "img", "questions": EASY, "images": [png_b64()]}).status_code == 503
    time.sleep(1.0)  # let scrapes see the open breaker
    Switch.down = False
    # The cooldown (3 s, longer than the degraded requests take on a loaded machine, so no probe
    # slips in among them) has passed: the next call is the half-open probe.
    time.sleep(2.1)
    assert post({"state": "hard", "questions": HARD}).json()["x_cascade"]["degraded"] == {}


def wait_for(prom: str, promql: str, expected: float, timeout_s: float = 20) -> float:
    """Poll Prometheus until ``promql`` equals ``expected`` (a scrape happened) or time is up."""
    deadline = time.monotonic() + timeout_s
    got = query(prom, promql)
    while got != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        got = query(prom, promql)
    return got


# Families that must be present with a positive value once the traffic ran.
FAMILIES = [
    f'cascade_questions_total{{tier="{CHEAP}"}}',
    f'cascade_questions_total{{tier="{STRONG}"}}',
    f'cascade_tier_duration_seconds_count{{tier="{STRONG}"}}',
    f'cascade_answer_confidence_count{{tier="{CHEAP}"}}',
    f'cascade_tokens_total{{tier="{CHEAP}"}}',
    'cascade_shadow_requests_total{outcome="sent"}',
    "cascade_shadow_choice_agreement_total",
    "cascade_shadow_delta_count",
    "cascade_shadow_tvd_count",
    'cascade_hop_duration_seconds_count{hop="decode"}',
    'cascade_hop_duration_seconds_count{hop="validate"}',
    'cascade_hop_duration_seconds_count{hop="pre_route"}',
    'cascade_hop_duration_seconds_count{hop="merge"}',
    'cascade_hop_duration_seconds_count{hop="encode"}',
    'cascade_request_duration_seconds_count{route="/v1/systemone"}',
    "cascade_build_info",
]


def test_prometheus_sees_every_family(stack: tuple[str, str]) -> None:
    url, prom = stack
    assert wait_for(prom, 'up{job="cascade"}', 1) == 1  # scraping has begun
    before = scrape(url)
    traffic(url)
    after = scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    route = "/v1/systemone"
    assert delta("cascade_requests_total", route=route, outcome="ok", status="200") == 6
    assert delta("cascade_requests_total", route=route, outcome="degraded", status="200") == 7
    assert delta("cascade_requests_total", route=route, outcome="client_error", status="422") == 1
    assert delta("cascade_requests_total", route=route, outcome="overloaded", status="503") == 1
    assert delta("cascade_escalations_total", reason="images", type="choice") == 1
    assert delta("cascade_escalations_total", reason="low_confidence", type="choice") == 2
    assert delta("cascade_degraded_answers_total", reason="strong_failed", type="choice") == 2
    assert delta("cascade_degraded_answers_total", reason="breaker_open", type="choice") == 5
    assert delta("cascade_shadow_requests_total", outcome="sent") == 3

    # Prometheus scraped the same numbers the gateway shows.
    ok = value(after, "cascade_requests_total", route=route, outcome="ok", status="200")
    assert wait_for(prom, f'cascade_requests_total{{route="{route}",outcome="ok"}}', ok) == ok
    degraded = value(after, "cascade_degraded_answers_total", reason="breaker_open", type="choice")
    promql = 'cascade_degraded_answers_total{reason="breaker_open",type="choice"}'
    assert query(prom, promql) == degraded
    for promql in FAMILIES:
        assert query(prom, promql) > 0, promql
    assert query(prom, f'cascade_tier_ready{{tier="{STRONG}"}}') == 1
    opened = query(prom, f'max_over_time(cascade_breaker_state{{tier="{STRONG}"}}[1m])')
    assert opened == 2  # the breaker opened while the strong tier was down ...
    assert wait_for(prom, f'cascade_breaker_state{{tier="{STRONG}"}}', 0) == 0  # ... and closed
