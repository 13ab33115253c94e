"""The whole cascade on tiny checkpoints of both tiers, over real HTTP.

The gateway runs Laya in process (ONNX) and reaches Clef as a separate process
(``cascade engine clef``), the way docker-compose deploys it, so the test can kill the strong
tier mid-test and bring it back. Each case checks the answer's provenance and the Prometheus
metrics it moved (deltas on the gateway's own ``/metrics``).
"""

from __future__ import annotations

import base64
import io
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from PIL import Image as PILImage
from prometheus_client.parser import text_string_to_metric_families

from cascade.clef.tiny import make_tiny as make_tiny_clef
from cascade.http.app import create_app
from cascade.laya.tiny import make_tiny as make_tiny_laya
from cascade.settings import Settings
from tests.servers import free_port, run_process, serve_app

BIN = Path(sys.executable).parent

POLICY = """
[tiers.laya]
kind = "laya"
checkpoints = {{ english = "{laya}" }}
timeout_s = 30.0

[tiers.clef]
kind = "upstream"
urls = ["{clef}"]
connect_timeout_s = 0.5
read_timeout_s = 30.0
timeout_s = 30.0
health_interval_s = 0.3

[models]
unknown = "cascade"

[route]
cheap = "laya"
strong = "clef"

[thresholds.confidence]
noul = {{ "2" = 0.999 }}  # forces every noul to escalate; choices stay with Laya

[breaker.clef]
window_s = 60.0
min_calls = 2
failure_ratio = 0.5
cooldown_s = 1.0
"""


class ClefProcess:
    """``cascade engine clef`` on a fixed port, which the test can stop and start again."""

    def __init__(self, release: Path, port: int) -> None:
        self.cmd = [
            str(BIN / "cascade"),
            "engine",
            "clef",
            "--checkpoint",
            str(release),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        self.url = f"http://127.0.0.1:{port}"
        self.stack = ExitStack()

    def start(self) -> None:
        self.stack.enter_context(
            run_process(self.cmd, ready_url=self.url + "/health", timeout_s=180)
        )
        deadline = time.monotonic() + 120
        while httpx.get(self.url + "/ready").status_code != 200:
            assert time.monotonic() < deadline, "clef engine never became ready"
            time.sleep(0.2)

    def stop(self) -> None:
        self.stack.close()


@pytest.fixture(scope="module")
def cascade_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ClefProcess]]:
    root = tmp_path_factory.mktemp("e2e")
    laya = make_tiny_laya(root / "laya")
    clef = ClefProcess(make_tiny_clef(root / "clef"), free_port())
    policy = root / "policy.toml"
    policy.write_text(POLICY.format(laya=laya, clef=clef.url))
    clef.start()
    try:
        with serve_app(create_app(Settings(policy=str(policy))), timeout_s=300) as url:
            yield url, clef
    finally:
        clef.stop()


def metrics(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url + "/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def moved(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def ask(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/v1/systemone", json=body, timeout=60)


CHOICE = {
    "type": "choice",
    "instructions": "Which team?",
    "criteria": {"billing": "payments", "tech": "bugs", "sales": "deals"},
}
NOUL = {"type": "noul", "instructions": "Is it urgent?"}


def png_b64() -> str:
    buf = io.BytesIO()
    PILImage.new("RGB", (32, 32), "blue").save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_long_state_goes_to_clef(cascade_stack: tuple[str, ClefProcess]) -> None:
    url, _ = cascade_stack
    before = metrics(url)
    r = ask(url, {"state": "a very long ticket text " * 200, "questions": {"team": CHOICE}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["x_cascade"]["tiers"] == {"team": "clef"}
    assert body["x_cascade"]["reasons"] == {"team": "state_too_long"}
    assert body["usage"]["truncated"] is False  # Clef read the whole state
    after = metrics(url)
    assert (
        moved(before, after, "cascade_escalations_total", reason="state_too_long", type="choice")
        == 1
    )
    assert moved(before, after, "cascade_questions_total", tier="clef", type="choice") == 1


def test_image_goes_to_clef(cascade_stack: tuple[str, ClefProcess]) -> None:
    url, _ = cascade_stack
    before = metrics(url)
    r = ask(
        url, {"state": "see the screenshot", "questions": {"team": CHOICE}, "images": [png_b64()]}
    )
    assert r.status_code == 200, r.text
    assert r.json()["x_cascade"]["reasons"] == {"team": "images"}
    assert (
        moved(before, metrics(url), "cascade_escalations_total", reason="images", type="choice")
        == 1
    )


def test_low_confidence_question_escalates_alone_and_merges(
    cascade_stack: tuple[str, ClefProcess],
) -> None:
    url, _ = cascade_stack
    before = metrics(url)
    r = ask(url, {"state": "charged twice", "questions": {"team": CHOICE, "urgent": NOUL}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["x_cascade"]["tiers"] == {"team": "laya", "urgent": "clef"}
    assert body["x_cascade"]["reasons"] == {"urgent": "low_confidence"}
    assert set(body["answers"]) == {"team", "urgent"}
    assert body["answers"]["team"]["action"]["act_probability"] >= 0  # Laya's act head
    assert "action" not in body["answers"]["urgent"]  # Clef has none
    assert r.headers["x-cascade-tiers"] == "laya=1,clef=1"
    after = metrics(url)
    assert (
        moved(before, after, "cascade_escalations_total", reason="low_confidence", type="noul") == 1
    )
    assert moved(before, after, "cascade_questions_total", tier="laya", type="choice") == 1
    assert (
        moved(before, after, "cascade_tier_duration_seconds_count", tier="clef", outcome="ok") == 1
    )
    assert moved(before, after, "cascade_batch_size_count", tier="laya") >= 1
    assert moved(before, after, "cascade_queue_wait_seconds_count", tier="laya") >= 1
    assert moved(before, after, "cascade_tokens_total", tier="laya") > 0


def test_strong_tier_down_degrades_then_recovers(cascade_stack: tuple[str, ClefProcess]) -> None:
    url, clef = cascade_stack
    before = metrics(url)
    clef.stop()
    try:
        for _ in range(4):
            r = ask(url, {"state": "charged twice", "questions": {"team": CHOICE, "urgent": NOUL}})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["x_cascade"]["tiers"] == {"team": "laya", "urgent": "laya"}
            assert body["x_cascade"]["degraded"]["urgent"] in {"strong_failed", "breaker_open"}
            # the cheap answer keeps its own confidence: nothing invented
            assert body["answers"]["urgent"]["confidence"] < 0.999
        health = httpx.get(url + "/health").json()
        assert health["tiers"]["clef"]["breaker"] == "open"
        refused = ask(url, {"state": "x", "questions": {"team": CHOICE}, "images": [png_b64()]})
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        after = metrics(url)
        assert moved(before, after, "cascade_breaker_state", tier="clef") == 2
        assert (
            moved(
                before,
                after,
                "cascade_requests_total",
                route="/v1/systemone",
                outcome="degraded",
                status="200",
            )
            == 4
        )
    finally:
        clef.start()
    deadline = time.monotonic() + 30
    while True:  # cooldown, then the half-open probe closes the breaker
        r = ask(url, {"state": "charged twice", "questions": {"urgent": NOUL}})
        if r.status_code == 200 and not r.json()["x_cascade"]["degraded"]:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.3)
    assert r.json()["x_cascade"]["tiers"] == {"urgent": "clef"}
    assert httpx.get(url + "/health").json()["tiers"]["clef"]["breaker"] == "closed"
    assert metrics(url)[("cascade_breaker_state", frozenset({("tier", "clef")}))] == 0
