"""The span tree and attributes of one gateway, in process, exported over OTLP/HTTP to a real
receiver; the server span continues a caller's ``traceparent`` and ignores a malformed one."""

from __future__ import annotations

import httpx

from tests.servers import serve_app
from tests.tracing.helpers import BODY, app, tracing_to
from tests.tracing.receiver import Span, run_receiver

TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER = "b7ad6b7169203331"
SERVER, CLIENT, INTERNAL = 2, 3, 1  # opentelemetry.proto SpanKind


def _children(spans: list[Span], parent: Span) -> list[Span]:
    return [s for s in spans if s.parent_id == parent.span_id]


def test_a_request_continues_the_callers_trace_with_a_span_per_hop() -> None:
    with run_receiver() as receiver:
        with tracing_to(receiver.url) as tracing, serve_app(app()) as url:
            response = httpx.post(
                url + "/v1/systemone",
                json=BODY,
                headers={"traceparent": f"00-{TRACE}-{CALLER}-01", "x-request-id": "rid-1"},
            )
            assert response.status_code == 200, response.text
            tracing.provider.force_flush()
        spans = receiver.wait_for(lambda found: any(s.kind == SERVER for s in found))
    (server,) = [s for s in spans if s.kind == SERVER]
    assert (server.trace_id, server.parent_id) == (TRACE, CALLER)
    assert server.name == "POST /v1/systemone" and server.service == "cascade"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["http.route"] == "/v1/systemone"
    assert server.attributes["cascade.admission_s"] >= 0
    names = sorted(s.name for s in _children(spans, server))
    assert names == ["cascade.decide", "cascade.decode"]
    (decide,) = [s for s in spans if s.name == "cascade.decide"]
    assert decide.attributes["cascade.outcome"] == "ok"
    assert decide.attributes["cascade.route"] == "clef=1,laya=1"
    assert decide.attributes["cascade.reasons"] == "low_confidence=1"
    assert decide.attributes["cascade.request_id"] == "rid-1"
    assert len(decide.attributes["cascade.policy_hash"]) > 8
    assert decide.attributes["cascade.questions"] == 2
    cheap, strong = sorted(_children(spans, decide), key=lambda s: s.start_ns)
    assert (cheap.name, strong.name) == ("decide laya", "decide clef")
    assert cheap.end_ns <= strong.start_ns  # the strong call waits for the cheap answer
    assert decide.start_ns <= cheap.start_ns and strong.end_ns <= decide.end_ns
    assert cheap.kind == strong.kind == INTERNAL
    assert cheap.attributes["gen_ai.operation.name"] == "decide"
    assert cheap.attributes["gen_ai.provider.name"] == "laya"
    assert cheap.attributes["gen_ai.request.model"] == "english"  # the checkpoint it runs
    assert cheap.attributes["gen_ai.response.model"] == "cascade-fake"
    assert cheap.attributes["gen_ai.usage.input_tokens"] > 0
    assert cheap.attributes["cascade.slot"] == "cheap"
    assert cheap.attributes["cascade.questions"] == 2
    assert 0.5 in cheap.attributes["cascade.confidence"]
    assert strong.attributes["cascade.slot"] == "strong"
    assert strong.attributes["cascade.questions"] == 1
    for span in spans:  # privacy: no state or question text anywhere
        text = repr(span.attributes)
        assert "charged twice" not in text and "urgent?" not in text and "spam" not in text


def test_a_malformed_traceparent_starts_a_new_trace() -> None:
    with run_receiver() as receiver:
        with tracing_to(receiver.url) as tracing, serve_app(app()) as url:
            for bad in ("00-zz-yy-01", "00-" + "0" * 32 + "-" + CALLER + "-01", "garbage" * 40):
                response = httpx.post(
                    url + "/v1/systemone", json=BODY, headers={"traceparent": bad}
                )
                assert response.status_code == 200, response.text
            tracing.provider.force_flush()
        spans = receiver.wait_for(lambda found: sum(s.kind == SERVER for s in found) == 3)
    servers = [s for s in spans if s.kind == SERVER]
    assert all(s.parent_id == "" for s in servers)
    assert len({s.trace_id for s in servers}) == 3


def test_a_batch_has_one_decide_span_per_state() -> None:
    batch = {
        "model": BODY["model"],
        "states": ["one", "two", "three"],
        "questions": BODY["questions"],
    }
    with run_receiver() as receiver:
        with tracing_to(receiver.url) as tracing, serve_app(app()) as url:
            response = httpx.post(url + "/v1/systemone/batch", json=batch)
            assert response.status_code == 200, response.text
            tracing.provider.force_flush()
        spans = receiver.wait_for(lambda found: any(s.kind == SERVER for s in found))
    (server,) = [s for s in spans if s.kind == SERVER]
    decides = [s for s in _children(spans, server) if s.name == "cascade.decide"]
    assert len(decides) == 3
    for decide in decides:
        assert sorted(s.name for s in _children(spans, decide)) == ["decide clef", "decide laya"]
