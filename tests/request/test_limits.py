"""Limits on client texts (instructions, options, labels, ids, names, totals) and on a batch's
answer size: refused in the contract's shape before any tier sees the request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from cascade.calls import EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.errors import ValidationFailed
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.request.decode import text_call
from cascade.request.validation import answer_bytes, parse_envelope, parse_questions
from cascade.schema import LIMITS
from cascade.settings import Settings, from_env

CALLS: list[EngineCall] = []


def _recording(call: EngineCall):
    CALLS.append(call)
    return deterministic_answer(call)


def make_client(**settings: Any) -> TestClient:
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(policy, {"upstream": FakeEngine("upstream", _recording)})
    return TestClient(create_app(Settings(**settings), gateway))


@pytest.fixture
def client() -> Iterator[TestClient]:
    CALLS.clear()
    with make_client() as c:
        yield c


def body(question: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"state": "s", "questions": {"q": question}, **extra}


LABEL, OPTION = LIMITS.max_label_chars, LIMITS.max_option_chars
INSTR = LIMITS.max_instructions_chars
TEXTS = [  # (question, loc after ["body", "questions", "q"], limit) with a text one over its limit
    ({"type": "noul", "instructions": "i" * (INSTR + 1)}, ["instructions"], INSTR),
    ({"type": "noul", "instructions": {"k": "i" * INSTR}}, ["instructions"], INSTR),
    ({"type": "choice", "criteria": {"a": None, "b" * (LABEL + 1): None}}, ["criteria", 1], LABEL),
    (
        {"type": "choice", "criteria": {"a": "d" * (OPTION + 1), "b": None}},
        ["criteria", "a"],
        OPTION,
    ),
    ({"type": "choice", "criteria": ["a", "b" * (LABEL + 1)]}, ["criteria", 1], LABEL),
    ({"type": "score", "criteria": ["low", "l" * (OPTION + 1)]}, ["criteria", 1], OPTION),
    ({"type": "score", "criteria": ["low", {"level": "l" * OPTION}]}, ["criteria", 1], OPTION),
    ({"type": "noul", "criteria": {"true": "t" * (OPTION + 1)}}, ["criteria", "true"], OPTION),
    ({"type": "noul", "criteria": {"t" * (LABEL + 1): "x"}}, ["criteria", 0], LABEL),
    (
        {"type": "noul", "labels": {"false": "no", "true": "y" * (LABEL + 1)}},
        ["labels", "true"],
        LABEL,
    ),
]


@pytest.mark.parametrize(("question", "loc", "limit"), TEXTS)
def test_a_text_over_its_limit_is_a_422_at_its_location(
    client: TestClient, question: dict[str, Any], loc: list[Any], limit: int
) -> None:
    """Before the limits a 15 MB instruction was tokenized (11-13.5 s of CPU), then a 503."""
    r = client.post("/v1/systemone", json=body(question))
    assert r.status_code == 422, r.text
    [item] = r.json()["detail"]
    assert item["loc"] == ["body", "questions", "q", *loc]
    assert item["type"] == "string_too_long"
    assert f"at most {limit} characters" in item["msg"]
    assert CALLS == []  # no tier saw it


def test_texts_at_their_limits_are_answered(client: TestClient) -> None:
    questions = {
        "i": {"type": "noul", "instructions": "i" * INSTR},
        "c": {"type": "choice", "criteria": {"a" * LABEL: "d" * OPTION, "b": None}},
        "l": {"type": "choice", "criteria": ["a" * LABEL, "b"]},
        "s": {"type": "score", "criteria": ["l" * OPTION, "h"]},
        "n": {"type": "noul", "labels": {"false": "n" * LABEL, "true": "y"}},
        "q" * LIMITS.max_question_id_chars: {"type": "noul"},
    }
    r = client.post(
        "/v1/systemone",
        json={"state": "s", "questions": questions, "model": "m" * LIMITS.max_name_chars},
    )
    assert r.status_code == 200, r.text  # a single-tier policy takes any model name
    assert CALLS


@pytest.mark.parametrize(
    ("extra", "loc"),
    [
        ({"model": "m" * 257}, ["model"]),
        ({"task": "t" * 257}, ["task"]),
        ({"lang": "l" * 257}, ["lang"]),
        ({"lang_guess": "l" * 257}, ["lang_guess"]),
    ],
)
def test_names_are_limited_while_decoding(
    client: TestClient, extra: dict[str, Any], loc: list[str]
) -> None:
    r = client.post("/v1/systemone", json=body({"type": "noul"}, **extra))
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == [
        {"loc": ["body", *loc], "type": "string_too_long", "msg": "Expected `str` of length <= 256"}
    ]


def test_an_overlong_question_id_is_refused_without_echoing_it(client: TestClient) -> None:
    qid = "q" * 1_000_000
    r = client.post("/v1/systemone", json={"state": "s", "questions": {qid: {"type": "noul"}}})
    assert r.status_code == 422
    assert len(r.content) < 1_000  # the loc holds the id's first 256 characters only
    assert r.json()["detail"][0]["loc"] == ["body", "questions", "q" * 256]


def test_the_questions_texts_together_are_limited_413(client: TestClient) -> None:
    per = LIMITS.max_question_text_chars // 10 - 5_000  # each question within its own limit
    questions = {f"q{i}": {"type": "noul", "instructions": "i" * per} for i in range(11)}
    r = client.post("/v1/systemone", json={"state": "s", "questions": questions})
    assert r.status_code == 413, r.text
    detail = r.json()["detail"]
    assert detail["error_type"] == "request_too_large"
    assert f"at most {LIMITS.max_question_text_chars}" in detail["message"]
    assert CALLS == []


def test_states_and_questions_together_are_limited_413() -> None:
    states = ["s" * 500_000] * 9  # 4.5 M characters, each state within its own limit
    with make_client() as c:
        r = c.post(
            "/v1/systemone/batch", json={"states": states, "questions": {"q": {"type": "noul"}}}
        )
    assert r.status_code == 413, r.text
    assert f"at most {LIMITS.max_request_text_chars}" in r.json()["detail"]["message"]
    with make_client(max_request_text_chars=400) as c:
        r = c.post(
            "/v1/systemone",
            json={
                "state": "s" * 390,
                "questions": {"q": {"type": "noul", "instructions": "i" * 20}},
            },
        )
    assert r.status_code == 413 and "at most 400" in r.text


def test_the_text_limits_are_settings() -> None:
    settings = from_env(
        {
            "CASCADE_MAX_INSTRUCTIONS_CHARS": "10",
            "CASCADE_MAX_LABEL_CHARS": "3",
            "CASCADE_MAX_OPTION_CHARS": "4",
        }
    )
    fields = {
        k: getattr(settings, k)
        for k in ("max_instructions_chars", "max_label_chars", "max_option_chars")
    }
    with make_client(**fields) as c:
        ok = c.post(
            "/v1/systemone",
            json=body(
                {"type": "choice", "instructions": "i" * 10, "criteria": {"abc": "dddd", "b": None}}
            ),
        )
        long = c.post(
            "/v1/systemone",
            json=body({"type": "choice", "instructions": "i" * 11, "criteria": ["a", "b"]}),
        )
        label = c.post("/v1/systemone", json=body({"type": "choice", "criteria": ["abcd", "b"]}))
        option = c.post("/v1/systemone", json=body({"type": "score", "criteria": ["ddddd", "b"]}))
    assert ok.status_code == 200, ok.text
    assert [r.status_code for r in (long, label, option)] == [422, 422, 422]


def test_command_line_readers_keep_the_default_limits() -> None:
    line = msgspec.json.encode(
        {"state": "s", "questions": {"q": {"type": "noul", "instructions": "i" * (INSTR + 1)}}}
    )
    with pytest.raises(ValidationFailed, match="at most 100000 characters"):
        text_call(line, "1")


# ---------------------------------------------------------------- a batch's answer size


def _batch(states: int, questions: dict[str, Any]) -> dict[str, Any]:
    return {"states": [f"state {i}" for i in range(states)], "questions": questions}


def test_a_batch_with_max_length_labels_is_answered_within_its_bound(client: TestClient) -> None:
    """The issue's batch (20 labels of 10 KB, 64 states) answered 13.5 MB, 67x its body; now its
    labels are refused, and at the label limit the answer stays under the computed bound."""
    big = {"q": {"type": "choice", "criteria": [f"{i:02d}" + "x" * 10_000 for i in range(20)]}}
    r = client.post("/v1/systemone/batch", json=_batch(64, big))
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "string_too_long"
    questions = {
        "team": {"type": "choice", "criteria": [f"{i:02d}" + "x" * (LABEL - 2) for i in range(20)]},
        "tone": {
            "type": "choice",
            "criteria": {f"{i:02d}" + "\u00e9" * (LABEL - 2): "d" * 100 for i in range(8)},
        },
        "mood": {"type": "score", "criteria": ["\n" * OPTION, "l" * OPTION, "h"]},
        "flag": {"type": "noul", "labels": {"false": "n" * LABEL, "true": "y" * LABEL}},
        "\u00e9" * LIMITS.max_question_id_chars: {"type": "noul"},
    }
    request = _batch(64, questions)
    r = client.post("/v1/systemone/batch", json=request)
    assert r.status_code == 200, r.text
    parsed = parse_questions(parse_envelope(msgspec.json.encode(request)))[0]
    bound = 64 * answer_bytes(parsed)
    assert len(r.content) <= bound <= LIMITS.max_batch_answer_bytes
    results = r.json()["results"]
    assert len(results) == 64 and all(len(msgspec.json.encode(x)) <= bound / 64 for x in results)


def test_a_batch_whose_answers_could_pass_the_cap_is_refused_before_any_work(
    client: TestClient,
) -> None:
    questions = {
        f"q{j}": {
            "type": "choice",
            "criteria": [f"{i:03d}" + "x" * (LABEL - 3) for i in range(255)],
        }
        for j in range(8)
    }  # 2040 labels of 256 characters: 0.5 MB, ~1.1 MB per state
    r = client.post("/v1/systemone/batch", json=_batch(64, questions))
    assert r.status_code == 413, r.text
    message = r.json()["detail"]["message"]
    assert f"at most {LIMITS.max_batch_answer_bytes}" in message and "64 states" in message
    assert CALLS == []
    r = client.post("/v1/systemone/batch", json=_batch(6, questions))  # within the cap
    assert r.status_code == 200, r.text
    assert len(r.content) <= LIMITS.max_batch_answer_bytes
