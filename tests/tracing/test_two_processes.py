"""A traced request through two ``cascade serve`` processes: a front gateway whose only tier is
``--upstream``, a second cascade (``--demo``: tiny random Laya and Clef). Both export to one real
OTLP/HTTP receiver; the caller's ``traceparent`` runs through both, and the second process's
server span is a child of the front's upstream tier-call span (the ``traceparent`` the upstream
engine sends), its decide and tier spans below it."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port, run_process
from tests.tracing.receiver import Receiver, Span, run_receiver

BIN = Path(sys.executable).parent
TRACE = "11f7651916cd43dd8448eb211c80319c"
CALLER = "c7ad6b7169203331"
SERVER, CLIENT = 2, 3
BODY = {
    "model": "jev-latest",
    "state": {"ticket": "I was charged twice"},
    "questions": {"urgent": {"type": "noul", "instructions": "Is it urgent?"}},
}


@contextlib.contextmanager
def _serve(service: str, receiver: Receiver, work: Path, *flags: str) -> Iterator[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CASCADE_", "OTEL_")) or k == "CASCADE_CACHE"
    }
    env |= {
        "CASCADE_DEMO_DIR": str(work / "demo"),
        "CASCADE_LOG_LEVEL": "warning",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "CASCADE_DRAIN_S": "0",
    }
    url = f"http://127.0.0.1:{free_port()}"
    cmd = [
        str(BIN / "cascade"),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        url.rsplit(":", 1)[1],
        *flags,
    ]
    with run_process(cmd, ready_url=url + "/health", env=env, timeout_s=180):
        deadline = time.monotonic() + 60
        while httpx.get(url + "/ready").status_code != 200:
            assert time.monotonic() < deadline, f"{service} never became ready"
            time.sleep(0.2)
        yield url


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Response, list[Span]]]:
    work = tmp_path_factory.mktemp("two")
    with run_receiver() as receiver:
        with (
            _serve("strong-cascade", receiver, work, "--demo") as back,
            _serve("front", receiver, work, "--upstream", back) as front,
        ):
            response = httpx.post(
                front + "/v1/systemone",
                json=BODY,
                timeout=60,
                headers={"traceparent": f"00-{TRACE}-{CALLER}-01"},
            )
            # a server span ends last: once both are in, so is every span below them
            spans = receiver.wait_for(
                lambda found: (
                    {"front", "strong-cascade"}
                    <= {s.service for s in found if s.kind == SERVER and s.trace_id == TRACE}
                )
            )
            yield response, [s for s in spans if s.trace_id == TRACE]


def _one(spans: list[Span], service: str, name: str) -> Span:
    (found,) = [s for s in spans if s.service == service and s.name == name]
    return found


def test_the_strong_tiers_span_is_a_child_of_the_tier_call(
    traced: tuple[httpx.Response, list[Span]],
) -> None:
    response, spans = traced
    assert response.status_code == 200, response.text
    front = _one(spans, "front", "POST /v1/systemone")
    assert front.parent_id == CALLER and front.kind == SERVER
    decide = _one(spans, "front", "cascade.decide")
    assert decide.parent_id == front.span_id
    call = _one(spans, "front", "decide upstream")
    assert call.parent_id == decide.span_id and call.kind == CLIENT
    assert call.attributes["gen_ai.provider.name"] == "upstream"
    assert call.attributes["cascade.slot"] == "strong"  # --upstream: the strong slot alone
    back = _one(spans, "strong-cascade", "POST /v1/systemone")
    assert back.parent_id == call.span_id and back.kind == SERVER
    assert call.start_ns <= back.start_ns  # two clocks of one machine
    back_decide = _one(spans, "strong-cascade", "cascade.decide")
    assert back_decide.parent_id == back.span_id
    assert back_decide.attributes["cascade.request_id"] == response.headers["x-request-id"]
    tier_calls = [
        s
        for s in spans
        if s.service == "strong-cascade"
        and s.parent_id == back_decide.span_id
        and s.name.startswith("decide ")
    ]
    assert tier_calls and tier_calls[0].attributes["gen_ai.provider.name"] == "laya"
