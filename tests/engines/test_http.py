"""cascade.engines.http: HttpEngine against httpx.MockTransport, and once against a real server."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import httpx
import msgspec
import pytest
from jevcompat import mock as jev_mock

from cascade import __version__
from cascade.calls import EngineAnswer, EngineCall, Image
from cascade.engines.base import Engine
from cascade.engines.http import HttpEngine, error_info, retry_after
from cascade.errors import (
    EngineFailed,
    EngineTimeout,
    EngineUnavailable,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    UpstreamClientError,
    ValidationFailed,
)
from cascade.http.errors import status_of
from cascade.schema import ChoiceQuestion, Controls, NoulQuestion, Question, ScoreQuestion
from tests.servers import read_request

T = TypeVar("T")
Handler = Callable[[httpx.Request], httpx.Response]

QUESTIONS: dict[str, Question] = {
    "team": ChoiceQuestion(
        instructions="Which team?", criteria={"billing": "Payments", "technical": None}
    ),
    "anger": ScoreQuestion(instructions="How angry?", criteria=["calm", "upset", "furious"]),
    "urgent": NoulQuestion(instructions="Is it urgent?"),
}
CALL = EngineCall(state="charged twice", questions=QUESTIONS, model="jev-latest", request_id="r1")
ANSWERS = {
    "team": {"type": "choice", "choice": "technical", "confidence": 0.5,
             "probabilities": {"technical": 0.7, "billing": 0.3}},  # not in the caller's order
    "anger": {"type": "score", "score": 1.0, "confidence": 0.5, "legend": {},
              "probabilities": {"0": 0.2, "1": 0.6, "2": 0.2}},
    "urgent": {"type": "noul", "noul": 0.9},
}  # fmt: skip
REPLY = {"model": "upstream-1.0", "answers": ANSWERS, "usage": {"input_tokens": 42}}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def reply(status: int = 200, body: Any = REPLY, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


class Recorder:
    """A MockTransport handler answering from a list of responses (the last one repeats)."""

    def __init__(self, *responses: httpx.Response | Exception | Handler) -> None:
        self.responses = list(responses) or [reply()]
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.responses[min(len(self.requests), len(self.responses)) - 1]
        if isinstance(step, Exception):
            raise step
        return step(request) if callable(step) else step

    @property
    def hosts(self) -> list[str]:
        return [r.url.host for r in self.requests]


def engine(handler: Handler, urls: tuple[str, ...] = ("http://up",), **kw: Any) -> HttpEngine:
    return HttpEngine("up", urls, transport=httpx.MockTransport(handler), **kw)


async def answer(handler: Handler, call: EngineCall = CALL, **kw: Any) -> EngineAnswer:
    eng = engine(handler, **kw)
    try:
        return await eng.answer(call)
    finally:
        await eng.aclose()


# ---------------------------------------------------------------- the request


def test_the_request_forwards_the_call_with_auth_and_request_id() -> None:
    rec = Recorder()
    run(answer(rec, api_key="sekret"))
    (request,) = rec.requests
    assert request.method == "POST"
    assert str(request.url) == "http://up/v1/systemone"
    assert request.headers["authorization"] == "Bearer sekret"
    assert request.headers["x-request-id"] == "r1"
    body = json.loads(request.content)
    assert body["model"] == "jev-latest" and body["state"] == "charged twice"
    assert body["questions"]["team"] == {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "Payments", "technical": None},
    }
    assert "images" not in body and "max_len" not in body


def test_an_upstream_cookie_is_not_sent_on_other_requests() -> None:
    """One client serves every caller: a Set-Cookie the upstream sent for one request must not
    ride along on the next caller's (the client kept a shared cookie jar)."""

    async def two_calls() -> list[httpx.Request]:
        rec = Recorder(reply(**{"set-cookie": "session=caller-1; Path=/"}), reply())
        eng = engine(rec)
        try:
            await eng.answer(CALL)
            await eng.answer(msgspec.structs.replace(CALL, request_id="r2"))
        finally:
            await eng.aclose()
        return rec.requests

    first, second = run(two_calls())
    assert "cookie" not in first.headers and "cookie" not in second.headers
    assert second.headers["x-request-id"] == "r2"
    assert second.headers["content-type"] == "application/json"
    assert second.headers["user-agent"] == f"cascade/{__version__}"


def test_configured_model_controls_and_images_are_sent_the_laya_and_ollama_way() -> None:
    rec = Recorder()
    image = Image(data=b"\x89PNG...", mime="image/png", width=1, height=1)
    call = EngineCall(
        state={"a": 1},
        questions={"urgent": NoulQuestion(instructions="?")},
        model="jev-latest",
        images=[image],
        controls=Controls(max_len=256, lang="de"),
    )
    reply_ = {"model": "m", "answers": {"urgent": ANSWERS["urgent"]}, "usage": {}}
    rec.responses = [reply(body=reply_)]
    run(answer(rec, call, model="laya-english", urls=("http://up/v1/systemone/",)))
    request = rec.requests[0]
    assert str(request.url) == "http://up/v1/systemone"
    assert "authorization" not in request.headers
    body = json.loads(request.content)
    assert body["model"] == "laya-english"
    assert (body["max_len"], body["lang"]) == (256, "de")
    assert "task" not in body
    assert body["images"] == [base64.b64encode(image.data).decode()]


# ---------------------------------------------------------------- success bodies


def test_answers_come_back_in_the_callers_order() -> None:
    result = run(answer(Recorder()))
    assert result.model == "upstream-1.0"
    assert result.results["team"].probabilities == pytest.approx([0.3, 0.7])
    assert result.results["anger"].probabilities == pytest.approx([0.2, 0.6, 0.2])
    assert result.results["urgent"].probabilities == pytest.approx([0.1, 0.9])
    assert result.results["urgent"].type == "noul"
    assert result.usage.input_tokens == 42


def test_cloudflare_envelope_laya_extras_and_rounding() -> None:
    laya = {
        "model": "laya-rl-agent",
        "answers": {
            **ANSWERS,
            "team": {**ANSWERS["team"], "probabilities": {"billing": 0.3333, "technical": 0.6666},
                     "action": {"act_probability": 0.25}},
        },
        "usage": {"input_tokens": 12.0, "output_tokens": 0, "state_tokens": 9,
                  "state_tokens_dropped": 3, "truncated": True, "truncated_questions": ["team"],
                  "options": {"team": {"total": 2, "distinct": 1, "tokens_per_option": 4},
                              "anger": {"total": 3, "distinct": 2, "tokens_per_option": None}}},
    }  # fmt: skip
    envelope = {"result": laya, "success": True, "errors": [], "messages": []}
    result = run(answer(Recorder(reply(body=envelope))))
    team = result.results["team"]
    assert sum(team.probabilities) == pytest.approx(1, abs=1e-12)  # renormalised
    assert team.probabilities[0] == pytest.approx(1 / 3, abs=1e-4)
    assert team.act_probability == 0.25
    assert result.results["anger"].act_probability is None
    usage = result.usage
    assert (usage.input_tokens, usage.state_tokens, usage.state_tokens_dropped) == (12, 9, 3)
    assert usage.truncated_questions == ["team"]
    assert list(usage.options) == ["team"]  # a collapse without a cap has nothing to report
    assert usage.options["team"].tokens_per_option == 4


def test_list_criteria_are_keyed_by_their_string_labels() -> None:
    call = EngineCall(state="s", questions={"q": ChoiceQuestion(criteria=["low", 2])}, model="m")
    body = {"answers": {"q": {"type": "choice", "probabilities": {"2": 0.4, "low": 0.6}}}}
    result = run(answer(Recorder(reply(body=body)), call))
    assert result.results["q"].probabilities == pytest.approx([0.6, 0.4])
    assert result.model == "m"  # no model field upstream: the name we sent
    assert result.usage.input_tokens == 0


def test_non_string_labels_are_keyed_by_their_json() -> None:
    question = ChoiceQuestion(criteria=[True, 1, 1.5, "x"])
    call = EngineCall(state="s", questions={"q": question}, model="m")
    given = {"x": 0.4, "1.5": 0.3, "1": 0.2, "true": 0.1}
    body = {"answers": {"q": {"type": "choice", "probabilities": given}}}
    result = run(answer(Recorder(reply(body=body)), call))
    assert result.results["q"].probabilities == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_null_usage_extras_read_as_absent() -> None:
    nulls = dict.fromkeys(
        ["state_tokens", "state_tokens_dropped", "truncated_questions", "options"]
    )
    result = run(answer(Recorder(reply(body={**REPLY, "usage": {"input_tokens": 5, **nulls}}))))
    usage = result.usage
    assert (usage.input_tokens, usage.state_tokens, usage.state_tokens_dropped) == (5, None, 0)
    assert (usage.truncated_questions, usage.options) == ([], {})


def _with(qid: str, **fields: Any) -> dict[str, Any]:
    return {**REPLY, "answers": {**ANSWERS, qid: {**ANSWERS[qid], **fields}}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**REPLY, "answers": {"team": ANSWERS["team"]}}, "'anger': missing"),
        (_with("urgent", type="boolean"), "'urgent': missing, or not of type 'noul'"),
        (_with("team", probabilities={"Billing": 0.3, "technical": 0.7}), "not keyed"),
        (_with("team", probabilities={"billing": 0.3}), "not keyed"),
        (_with("anger", probabilities={"1": 0.2, "2": 0.6, "3": 0.2}), "not keyed"),
        (_with("team", probabilities={"billing": 0.6, "technical": 0.7}), "sum to 1.3000"),
        (_with("anger", probabilities={"0": -0.2, "1": 0.6, "2": 0.6}), "not in [0, 1]"),
        (_with("urgent", noul=1.5), "not in [0, 1]"),
        ({**REPLY, "answers": {**ANSWERS, "urgent": {"type": "noul"}}}, "without 'noul'"),
        ({"result": None, "success": False, "errors": [{"code": 1, "message": "x"}]}, "1: x"),
        ({"answers": []}, "not a System One answer"),
        ([1, 2], "not a System One answer"),
    ],
)
def test_inconsistent_200_bodies_are_engine_failures(body: Any, message: str) -> None:
    with pytest.raises(EngineFailed, match=message.replace("[", r"\[")):
        run(answer(Recorder(reply(body=body))))


def test_a_200_that_is_not_json_is_an_engine_failure() -> None:
    with pytest.raises(EngineFailed, match="not a System One answer"):
        run(answer(Recorder(httpx.Response(200, text=")]}'\n{}"))))


# ---------------------------------------------------------------- error bodies and statuses


def test_422_detail_items_pass_through() -> None:
    items = [{"loc": ["body", "questions", "q", 0], "msg": "bad", "type": "string_type",
              "input": 3}]  # fmt: skip
    with pytest.raises(ValidationFailed) as exc:
        run(answer(Recorder(reply(422, {"detail": items}))))
    assert exc.value.items == [
        {"loc": ["body", "questions", "q", 0], "msg": "bad", "type": "string_type"}
    ]


def test_a_422_with_a_string_detail_becomes_one_item() -> None:
    with pytest.raises(ValidationFailed) as exc:
        run(answer(Recorder(reply(422, {"detail": "max_len must be an integer"}))))
    assert exc.value.items == [
        {"loc": ["body"], "msg": "max_len must be an integer", "type": "value_error"}
    ]


@pytest.mark.parametrize(
    ("status", "body", "message", "error_type"),
    [
        (400, {"detail": {"error_type": "api_usage_error", "message": "Unknown model: x"}},
         "Unknown model: x", "api_usage_error"),
        (400, {"success": False, "errors": [{"code": 5006, "message": "no questions"}],
               "messages": [], "result": None}, "5006: no questions", "invalid_request_error"),
        (400, {"error": {"message": "bad field", "field": "state"}}, "bad field",
         "invalid_request_error"),
        (400, {"detail": "'questions' must be an object"}, "'questions' must be an object",
         "invalid_request_error"),
        (409, "a JSON string", "a JSON string", "invalid_request_error"),
    ],
)  # fmt: skip
def test_other_4xx_of_every_dialect_keep_status_message_and_type(
    status: int, body: Any, message: str, error_type: str
) -> None:
    with pytest.raises(UpstreamClientError) as exc:
        run(answer(Recorder(reply(status, body))))
    assert (exc.value.upstream_status, exc.value.message, exc.value.error_type) == (
        status,
        message,
        error_type,
    )


def test_non_json_error_bodies_are_quoted() -> None:
    assert error_info(b"<html>Bad Gateway</html>").message == "<html>Bad Gateway</html>"
    assert error_info(b'{"detail": [{"msg": "a"}, "b"]}').message == "a; b"


@pytest.mark.parametrize(
    ("status", "error", "message"),
    [
        (413, PayloadTooLarge, "state too large"),
        (401, EngineFailed, "refused our credentials"),
        (403, EngineFailed, "refused our credentials"),
        (408, EngineTimeout, "408"),
        (404, EngineFailed, "no such endpoint"),  # a wrong URL: a broken tier, not the client
        (405, EngineFailed, "no such endpoint"),
        (503, EngineUnavailable, "503"),  # down or draining, not back-pressure
        (500, EngineFailed, "inference failed"),
        (502, EngineFailed, "502"),
        (301, EngineFailed, "301"),
    ],
)
def test_statuses_that_are_not_the_clients_business(
    status: int, error: type[Exception], message: str
) -> None:
    rec = Recorder(
        reply(status, {"detail": "state too large" if status == 413 else "inference failed"})
    )
    with pytest.raises(error, match=message):
        run(answer(rec))
    assert len(rec.requests) == 1  # never retried


@pytest.mark.parametrize(
    ("status", "headers", "retry", "wire_status"),
    [
        (429, {"Retry-After": "7"}, 7.0, 429),
        (429, {"retry-after-ms": "1500", "Retry-After": "9"}, 1.5, 429),
        (503, {"Retry-After": "100"}, 100.0, 503),  # longer than the deadline: not retried
        (503, {}, 1.0, 503),
        (529, {"Retry-After": "0"}, 0.0, 503),
    ],
)
def test_overload_carries_their_retry_after_and_is_not_retried(
    status: int, headers: dict[str, str], retry: float, wire_status: int
) -> None:
    rec = Recorder(reply(status, {"detail": {"error_type": "overloaded_error", "message": "b"}},
                         **headers))  # fmt: skip
    with pytest.raises(Overloaded) as exc:
        run(answer(rec))
    assert (exc.value.retry_after, status_of(exc.value)) == (retry, wire_status)
    assert len(rec.requests) == 1


@pytest.mark.slow
def test_a_503_is_never_slept_on() -> None:
    """A draining upstream's ``503 + Retry-After: 5`` fails at once (the gateway degrades), backs
    that URL off, and the request moves on to another URL that is up, without waiting."""
    rec = Recorder(reply(503, {"detail": "draining"}, **{"Retry-After": "5"}))
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match="draining") as exc:
        run(answer(rec))
    assert time.monotonic() - started < 1.0 and exc.value.retry_after == 5.0
    assert len(rec.requests) == 1

    def by_host(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a":
            return reply(503, {"detail": "draining"}, **{"Retry-After": "5"})
        return reply()

    rec = Recorder(by_host)

    async def scenario() -> list[bool]:
        eng = engine(rec, urls=("http://a", "http://b"), health_interval_s=60)
        for _ in range(3):
            assert (await eng.answer(CALL)).model == "upstream-1.0"
        up = [u["up"] for u in eng.health()["urls"]]
        await eng.aclose()
        return up

    started = time.monotonic()
    assert run(scenario()) == [False, True]  # a backs off for its Retry-After
    assert time.monotonic() - started < 1.0
    assert rec.hosts[:2] == ["a", "b"] and set(rec.hosts[2:]) == {"b"}


def test_retry_after_accepts_http_dates_and_ignores_garbage() -> None:
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({"retry-after-ms": "x", "retry-after": "2"}) == 2.0
    assert retry_after({}) is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1e400", 3600.0),
        ("inf", 3600.0),
        ("nan", None),
        ("-5", 0.0),
        ("Fri, 31 Dec 9999 23:59:59 GMT", 3600.0),
        ("Mon, 01 Jan 0001 00:00:00 GMT", 0.0),
    ],
)
def test_retry_after_is_clamped_to_an_hour_and_nan_is_no_value(
    value: str, seconds: float | None
) -> None:
    assert retry_after({"retry-after": value}) == seconds
    if not value[0].isalpha():  # retry-after-ms takes numbers only
        assert retry_after({"retry-after-ms": value}) == seconds


@pytest.mark.parametrize("kind", ["overloaded_error", "unavailable"])
@pytest.mark.parametrize(
    ("value", "header"),
    [("1e400", "3600"), ("nan", "1"), ("-5", "1"), ("Fri, 31 Dec 9999 23:59:59 GMT", "3600")],
)
def test_an_upstreams_wild_retry_after_becomes_a_sane_json_503(
    kind: str, value: str, header: str
) -> None:
    """Before the clamp, ``1e400`` (and a far-future date) made the next request a text/plain
    500 (``OverflowError`` in ``math.ceil``) and ``nan`` one too (``ValueError``)."""
    from litestar.testing import TestClient

    from cascade.gateway import Gateway
    from cascade.http.app import create_app
    from cascade.policy.model import Policy, UpstreamTier
    from cascade.settings import Settings

    def upstream(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the health probe: up
            return reply(200, {"status": "ok"})
        return reply(
            503, {"detail": {"error_type": kind, "message": "busy"}}, **{"Retry-After": value}
        )

    policy = Policy.single_tier("up", UpstreamTier(urls=["http://up"]))
    gateway = Gateway(policy, {"up": engine(upstream, health_interval_s=60)})
    body = {"state": "s", "questions": {"q": {"type": "noul"}}}
    with TestClient(create_app(Settings(), gateway)) as client:
        first, after = (client.post("/v1/systemone", json=body) for _ in range(2))
    assert first.headers["retry-after"] == header
    for response in (first, after):  # after a 503 ``unavailable`` the URL is backed off
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/json"
        assert 1 <= int(response.headers["retry-after"]) <= 3600
        assert response.json()["detail"]["error_type"] in ("overloaded_error", "unavailable")


# ---------------------------------------------------------------- transport errors and routing


def _fails(exc: Exception, *hosts: str) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host in hosts:
            raise exc
        return reply()

    return handler


@pytest.mark.parametrize("exc", [httpx.ConnectError("refused"), httpx.ConnectTimeout("slow")])
def test_a_connect_failure_moves_on_and_marks_the_url_down(exc: Exception) -> None:
    rec = Recorder(_fails(exc, "a"))

    async def scenario() -> dict[str, Any]:
        eng = engine(rec, urls=("http://a", "http://b"), health_interval_s=60)
        for _ in range(4):
            await eng.answer(CALL)
        health = eng.health()
        await eng.aclose()
        return health

    health = run(scenario())
    assert rec.hosts == ["a", "b", "b", "b", "b"]
    assert health["urls"] == [{"url": "http://a", "up": False}, {"url": "http://b", "up": True}]


def test_when_every_url_fails_to_connect_the_engine_is_unavailable_fast() -> None:
    rec = Recorder(httpx.ConnectError("refused"))

    async def scenario() -> None:
        eng = engine(rec, urls=("http://a", "http://b"), health_interval_s=60)
        with pytest.raises(EngineUnavailable, match="could not connect"):
            await eng.answer(CALL)
        with pytest.raises(EngineUnavailable, match="every upstream is down") as exc:
            await eng.answer(CALL)
        assert exc.value.retry_after is not None and 50 < exc.value.retry_after <= 62
        await eng.aclose()

    run(scenario())
    assert sorted(rec.hosts) == ["a", "b"]  # the second call never left


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (httpx.ReadTimeout("slow"), EngineTimeout),
        (httpx.WriteTimeout("slow"), EngineTimeout),
        (httpx.PoolTimeout("full"), Overloaded),
        (httpx.RemoteProtocolError("gone"), EngineFailed),
        (httpx.ReadError("reset"), EngineFailed),
    ],
)
def test_other_transport_errors_are_mapped_and_never_retried(
    exc: Exception, error: type[Exception]
) -> None:
    rec = Recorder(exc)
    with pytest.raises(error):
        run(answer(rec, urls=("http://a", "http://b")))
    assert len(rec.requests) == 1


def test_round_robin_over_healthy_urls() -> None:
    rec = Recorder()

    async def scenario() -> None:
        eng = engine(rec, urls=("http://a", "http://b", "http://c"))
        await asyncio.gather(*(eng.answer(CALL) for _ in range(6)))
        await eng.aclose()

    run(scenario())
    assert sorted(rec.hosts) == ["a", "a", "b", "b", "c", "c"]


def test_the_probe_marks_urls_down_and_brings_them_back() -> None:
    state = {"b_status": 500}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            status = state["b_status"] if request.url.host == "b" else 404  # 4xx counts as up
            return httpx.Response(status)
        return reply()

    rec = Recorder(handler)

    async def scenario() -> None:
        eng = engine(rec, urls=("http://a", "http://b"), health_path="/healthz",
                     health_interval_s=0.05)  # fmt: skip
        assert not eng.ready()
        await eng.start()
        assert eng.ready()
        assert [u["up"] for u in eng.health()["urls"]] == [True, False]
        await eng.answer(CALL)
        await eng.answer(CALL)
        state["b_status"] = 200
        await asyncio.sleep(0.2)
        assert [u["up"] for u in eng.health()["urls"]] == [True, True]
        await eng.aclose()
        assert not eng.ready()

    run(scenario())
    posts = [r.url.host for r in rec.requests if r.method == "POST"]
    assert posts == ["a", "a"]


def test_not_ready_while_every_url_is_down() -> None:
    async def scenario() -> bool:
        eng = engine(Recorder(httpx.ConnectError("refused")), health_interval_s=60)
        assert isinstance(eng, Engine)
        await eng.start()
        ready = eng.ready()
        await eng.aclose()
        return ready

    assert run(scenario()) is False


def test_an_engine_needs_a_url() -> None:
    with pytest.raises(ValueError, match="at least one URL"):
        HttpEngine("up", [])


# ---------------------------------------------------------------- real loopback servers


def test_against_jevcompats_mock_on_loopback() -> None:
    call = EngineCall(state="charged twice", questions=QUESTIONS, model="jev-latest")
    wire = json.loads(json.dumps({"state": call.state, "questions": {
        "team": {"type": "choice", "instructions": "Which team?",
                 "criteria": {"billing": "Payments", "technical": None}},
        "anger": {"type": "score", "instructions": "How angry?",
                  "criteria": ["calm", "upset", "furious"]},
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    }}))  # fmt: skip
    with jev_mock.Running() as server:
        expected = jev_mock.respond(jev_mock.MockConfig(), wire)["answers"]

        async def scenario() -> tuple[EngineAnswer, Exception]:
            eng = HttpEngine("jev", [server.url], health_interval_s=60)
            await eng.start()
            assert eng.ready()  # the mock's /health is a 404: reachable, so up
            result = await eng.answer(call)
            try:
                await eng.answer(EngineCall(state="s", questions=QUESTIONS, model="jev-99"))
            except UpstreamClientError as exc:
                error = exc
            await eng.aclose()
            return result, error

        result, error = run(scenario())
    assert result.model == "jevcompat-mock-0.1"
    team = expected["team"]["probabilities"]
    assert result.results["team"].probabilities == pytest.approx(
        [team["billing"], team["technical"]]
    )
    anger = expected["anger"]["probabilities"]
    assert result.results["anger"].probabilities == pytest.approx([anger[str(i)] for i in range(3)])
    assert result.results["urgent"].probabilities[1] == pytest.approx(expected["urgent"]["noul"])
    assert isinstance(error, UpstreamClientError)
    assert (error.upstream_status, error.error_type) == (400, "api_usage_error")


def test_a_closed_port_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the engine connects
    with pytest.raises(EngineUnavailable, match="could not connect"):
        run(answer_real(f"http://127.0.0.1:{port}"))


async def answer_real(url: str) -> EngineAnswer:
    eng = HttpEngine("closed", [url], connect_timeout_s=1.0)
    try:
        return await eng.answer(CALL)
    finally:
        await eng.aclose()


def test_proxies_from_the_environment_carry_the_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``HTTP_PROXY`` set, a request goes to the proxy in absolute form (httpx's proxies);
    without, straight to the upstream (aiohttp's connections)."""
    lines: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        lines.append(head.split(b"\r\n", 1)[0])
        body = json.dumps(REPLY).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)

    async def scenario() -> tuple[EngineAnswer, EngineAnswer]:
        server = await asyncio.start_server(proxy, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            direct = await answer_real(url)
            monkeypatch.setenv("HTTP_PROXY", url)
            proxied = await answer_real("http://upstream.invalid")
            return direct, proxied
        finally:
            server.close()
            await server.wait_closed()

    direct, proxied = run(scenario())
    assert direct.model == proxied.model == "upstream-1.0"
    assert lines[0] == b"POST /v1/systemone HTTP/1.1"
    assert lines[1] == b"POST http://upstream.invalid/v1/systemone HTTP/1.1"


def test_a_real_upstreams_error_statuses_and_retry_after_are_read() -> None:
    """Through aiohttp's connections (not MockTransport): a 429's ``Retry-After`` and a 422's
    ``detail`` items reach the caller as they do from a mocked upstream."""
    limit = {"detail": {"error_type": "rate_limit_error", "message": "slow down"}}
    item = {"loc": ["body", "state"], "msg": "bad", "type": "value_error"}
    answers = [
        (429, b"retry-after: 7", json.dumps(limit).encode()),
        (422, b"x-a: 1", json.dumps({"detail": [item]}).encode()),
    ]

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for status, header, body in answers:
            await read_request(reader)
            writer.write(
                b"HTTP/1.1 %d X\r\n%s\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (status, header, len(body), body)
            )
            await writer.drain()

    async def scenario() -> list[Exception]:
        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        eng = HttpEngine("up", [f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"])
        errors: list[Exception] = []
        try:
            for _ in answers:
                try:
                    await eng.answer(CALL)
                except Exception as exc:  # each one is checked below
                    errors.append(exc)
        finally:
            await eng.aclose()
            server.close()
            await server.wait_closed()
        return errors

    limited, invalid = run(scenario())
    assert isinstance(limited, RateLimited) and limited.retry_after == 7
    assert isinstance(invalid, ValidationFailed)
    assert invalid.items == [item]
