"""The strong tier failing in every way a remote one can, behind a real gateway on loopback.

Expected for each fault: answerable requests never get a 5xx; their answers come back from the
cheap tier flagged degraded and counted; requests only the strong tier can serve get 503 with
Retry-After; the breaker opens on tier faults only (never on the client's content or on
back-pressure); ``/ready`` stays 200; and once the tier returns the breaker closes within its
cooldown plus one probe.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.faults.conftest import COOLDOWN_S, PNG, Gateway, ask, breaker, metric
from tests.faults.stub import Stub

SLOW_FAULTS = ("slow", "hang")  # the gateway waits out its timeout (0.8 s) on each
FAST_FAULTS = ("killed", "5xx", "malformed", "404", "503")
REASON = {
    "slow": "strong_timeout",
    "hang": "strong_timeout",
    "killed": "strong_failed",
    "5xx": "strong_failed",
    "malformed": "strong_failed",
    "404": "strong_failed",
    "503": "strong_failed",
}


def inject(stub: Stub, fault: str) -> None:
    if fault == "killed":
        stub.stop()
    else:
        stub.delay_s = 5.0
        stub.mode = fault


def heal(stub: Stub, fault: str) -> None:
    if fault == "killed":
        stub.start()
    stub.mode = "ok"


@pytest.mark.slow
@pytest.mark.parametrize("fault", SLOW_FAULTS + FAST_FAULTS)
def test_a_strong_tier_fault_degrades_opens_the_breaker_and_recovers(
    fault: str, stub: Stub, gateway: Gateway
) -> None:
    with gateway(stub.url) as url:
        assert ask(url).json()["x_cascade"]["degraded"] == {}  # healthy first
        degraded_before = metric(
            url, "cascade_degraded_answers_total", type="noul", reason=REASON[fault]
        )
        inject(stub, fault)
        took, reasons = [], []
        for _ in range(5):
            started = time.monotonic()
            response = ask(url)
            took.append(time.monotonic() - started)
            assert response.status_code == 200, response.text  # answerable: never a 5xx
            body = response.json()
            assert body["x_cascade"]["tiers"]["urgent"] == "laya"
            reasons.append(body["x_cascade"]["degraded"]["urgent"])
            assert reasons[-1] in (REASON[fault], "breaker_open")
        bound = 1.5 if fault in SLOW_FAULTS else 1.0  # never the upstream's 5 s Retry-After
        assert max(took) < bound, took
        # Opened on the tier's faults: the last answers say so and made no call; the gauge
        # reads open, or half-open where its 1 s cooldown ran out first on a loaded machine.
        assert reasons[3:] == ["breaker_open"] * 2 and max(took[3:]) < 0.5
        assert breaker(url) in (1, 2)
        assert (
            metric(url, "cascade_degraded_answers_total", type="noul", reason=REASON[fault])
            > degraded_before
        )
        image = ask(url, images=[PNG])  # only the strong tier reads images
        assert image.status_code == 503 and int(image.headers["retry-after"]) >= 1
        assert httpx.get(url + "/ready").status_code == 200  # readiness follows the cheap tier
        if fault == "killed":
            time.sleep(0.5)  # a probe or two
            assert httpx.get(url + "/health").json()["tiers"]["clef"]["ready"] is False
            assert metric(url, "cascade_tier_ready", tier="clef") == 0

        heal(stub, fault)
        healed = time.monotonic()
        while True:
            body = ask(url).json()
            if not body["x_cascade"]["degraded"] and breaker(url) == 0:
                break
            assert time.monotonic() - healed < COOLDOWN_S + 1.5, "the breaker did not close"
            time.sleep(0.1)


@pytest.mark.parametrize(
    ("mode", "reason", "image_status"),
    [
        ("400", "strong_refused", 400),
        ("413", "strong_refused", 413),
        ("422", "strong_refused", 422),
        ("overloaded", "strong_overloaded", 503),
    ],
)
def test_refused_content_and_back_pressure_degrade_but_never_open_the_breaker(
    mode: str, reason: str, image_status: int, stub: Stub, gateway: Gateway
) -> None:
    stub.mode = mode
    with gateway(stub.url) as url:
        for _ in range(6):
            response = ask(url)
            assert response.status_code == 200
            assert response.json()["x_cascade"]["degraded"] == {"urgent": reason}
        # a request only the strong tier can serve gets its refusal (the client's fault) or
        # the back-pressure, never a breaker-open 503
        image = ask(url, images=[PNG])
        assert image.status_code == image_status
        assert breaker(url) == 0


def test_a_flapping_tier_never_turns_answerable_requests_into_5xx(
    stub: Stub, gateway: Gateway
) -> None:
    stub.mode = "flapping"
    with gateway(stub.url) as url:
        for _ in range(12):
            response = ask(url)
            assert response.status_code == 200
            body = response.json()["x_cascade"]
            assert (body["tiers"]["urgent"] == "laya") == bool(body["degraded"])


def test_probes_keep_their_own_connections(stub: Stub, gateway: Gateway) -> None:
    """Every request connection busy with a slow answer: the health probe still gets through,
    so a healthy upstream is never marked down (and escalations never fail fast for it)."""
    stub.mode, stub.delay_s = "slow", 1.5
    with gateway(
        stub.url,
        upstream_extra="max_queue = 1",  # one request connection
        read_timeout_s="3.0",
        timeout_s="3.0",
    ) as url:
        ups = []
        worker = threading.Thread(target=lambda: ask(url))
        worker.start()
        deadline = time.monotonic() + 1.3
        time.sleep(0.05)
        while time.monotonic() < deadline:
            ups.append(httpx.get(url + "/health").json()["tiers"]["clef"]["urls"][0]["up"])
            time.sleep(0.05)
        worker.join()
        assert ups and all(ups)


def test_fallback_keeps_the_strong_only_rules(stub: Stub, gateway: Gateway) -> None:
    """With choices sent strong by a type rule and the strong tier dead, the English default
    checkpoint may stand in for English text, never for Chinese text or a state it would cut."""
    stub.stop()
    choice = {
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "payments", "tech": "bugs"},
        }
    }
    with gateway(stub.url, route_extra='strong_types = ["choice"]') as url:
        english = ask(url, choice)
        assert english.status_code == 200
        assert english.json()["x_cascade"]["degraded"] == {"team": "strong_failed"}
        chinese = ask(url, choice, state="我的退款还没有到账，请帮我查一下，谢谢")
        assert chinese.status_code == 503 and "script" in chinese.text
        assert int(chinese.headers["retry-after"]) >= 1
        long = ask(url, choice, state="refund please " * 300)
        assert long.status_code == 503 and "state_too_long" in long.text
