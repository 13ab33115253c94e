"""``POST /v1/decisions`` driven by the official ``openai`` SDK (3.51.0) and langchain-openai's
``OpenAIDecisions``, against the gateway under uvicorn on loopback with fake tiers (a cheap
"laya" that refuses choices over 48 options, as Laya's head does, and a "clef" that can go down).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterator
from typing import Any

import msgspec
import openai
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai.decisions import Choice, OpenAIDecisions, Predicate, Score
from PIL import Image as PILImage
from prometheus_client import REGISTRY

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.errors import EngineUnavailable, RateLimited, ValidationFailed
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import (
    BreakerConfig,
    Checkpoints,
    ClefTier,
    LayaTier,
    Models,
    Policy,
    Route,
    UpstreamTier,
)
from cascade.schema import ChoiceQuestion
from cascade.settings import Settings
from tests.servers import serve_app

MODEL = "gpt-6-luna"
KEY = "decisions-key"
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "name": "urgent", "instructions": "Is this urgent?"},
    {
        "type": "choice",
        "name": "team",
        "instructions": "Which team?",
        "choices": [{"value": "billing", "description": "Payments"}, {"value": "technical"}],
    },
    {
        "type": "score",
        "name": "anger",
        "instructions": "How angry?",
        "levels": [
            {"label": "calm"},
            {"label": "upset", "description": "raised voice"},
            {"label": "furious"},
        ],
    },
]
MANY_OPTIONS = {
    "type": "choice",
    "name": "sku",
    "instructions": "Which product?",
    "choices": [{"value": f"p{i}"} for i in range(60)],
}  # > 48: pre-routed strong


class Tiers:
    """The fake tiers' handlers, recording every call; ``clef_down`` takes the strong tier down."""

    def __init__(self) -> None:
        self.calls: dict[str, list[EngineCall]] = {"laya": [], "clef": []}
        self.clef_down = False

    def laya(self, call: EngineCall) -> EngineAnswer:
        self.calls["laya"].append(call)
        wide = [
            q
            for q, v in call.questions.items()
            if isinstance(v, ChoiceQuestion) and len(v.criteria) > 48
        ]
        if wide:  # named, as Laya names a question whose options do not fit its head
            raise ValidationFailed.at(["questions", wide[0]], "options do not fit the head budget")
        return deterministic_answer(call)

    def clef(self, call: EngineCall) -> EngineAnswer:
        self.calls["clef"].append(call)
        if self.clef_down:
            raise EngineUnavailable("clef is down")
        return deterministic_answer(call)


def cascade_app(tiers: Tiers, *, max_choice_options: int = 48, **settings: Any) -> Any:
    policy = Policy(
        tiers={
            "laya": LayaTier(checkpoints=Checkpoints(english="x")),
            "clef": ClefTier(release="x"),
        },
        models=Models(cascade=[MODEL, "jev-latest"]),
        route=Route(cheap="laya", strong="clef", max_choice_options=max_choice_options),
        breaker={"clef": BreakerConfig(min_calls=10_000)},  # the tests take clef down often
    )
    engines = {"laya": FakeEngine("laya", tiers.laya), "clef": FakeEngine("clef", tiers.clef)}
    return create_app(Settings(**settings), Gateway(policy, engines))


def single_tier_app(handler: Any) -> Any:
    policy = msgspec.structs.replace(
        Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"])),
        models=Models(cascade=[MODEL]),
    )
    return create_app(Settings(), Gateway(policy, {"upstream": FakeEngine("upstream", handler)}))


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Tiers]]:
    tiers = Tiers()
    with serve_app(cascade_app(tiers, api_keys=(KEY,))) as url:
        yield url, tiers


@pytest.fixture
def tiers(served: tuple[str, Tiers]) -> Iterator[Tiers]:
    served[1].calls = {"laya": [], "clef": []}
    served[1].clef_down = False
    yield served[1]


@pytest.fixture
def client(served: tuple[str, Tiers]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=0) as c:
        yield c


def png(color: str = "red") -> str:
    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def entropy_confidence(p: list[float]) -> float:
    return 1 - -sum(x * math.log(x) for x in p if x > 0) / math.log(len(p))


def test_every_question_type_with_a_string_input(client: openai.OpenAI, tiers: Tiers) -> None:
    raw = client.decisions.with_raw_response.create(
        model=MODEL, input="I was charged twice", questions=QUESTIONS
    )
    decision = raw.parse()
    assert raw.headers["x-cascade-tiers"] == "laya=3"
    assert raw.headers["x-request-id"]
    urgent, team, anger = decision.answers
    assert (urgent.type, urgent.name) == ("predicate", "urgent")
    assert 0 <= urgent.probability <= 1
    assert (team.type, team.name) == ("choice", "team")
    assert [p.value for p in team.probabilities] == ["billing", "technical"]
    ps = [p.probability for p in team.probabilities]
    assert sum(ps) == pytest.approx(1, abs=1e-3)
    assert team.choice == team.probabilities[ps.index(max(ps))].value
    assert team.confidence == pytest.approx(entropy_confidence(ps), abs=2e-4)  # profile laya
    assert (anger.type, anger.name) == ("score", "anger")
    assert [(p.value, p.label) for p in anger.probabilities] == [
        (0, "calm"),
        (1, "upset"),
        (2, "furious"),
    ]
    assert anger.score == pytest.approx(
        sum(p.value * p.probability for p in anger.probabilities), abs=1e-3
    )
    assert decision.usage.output_tokens == 0
    assert decision.usage.total_tokens == decision.usage.input_tokens > 0
    assert decision.usage.input_tokens_details.cached_tokens == 0
    # One engine call of System One questions: what the cheap tier read.
    (call,) = tiers.calls["laya"]
    assert call.state == "I was charged twice"
    assert {q: v.type for q, v in call.questions.items()} == {
        "urgent": "noul",
        "team": "choice",
        "anger": "score",
    }
    assert call.questions["team"].criteria == {"billing": "Payments", "technical": None}
    assert call.questions["anger"].criteria == ["calm", "upset: raised voice", "furious"]


def test_the_answers_are_system_ones(served: tuple[str, Tiers], client: openai.OpenAI) -> None:
    """The same numbers as ``/v1/systemone`` for the same questions: one flow below the wire."""
    import httpx

    decision = client.decisions.create(model=MODEL, input="x", questions=QUESTIONS)
    body = {
        "model": MODEL,
        "state": "x",
        "questions": {
            "urgent": {"type": "noul", "instructions": "Is this urgent?"},
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"billing": "Payments", "technical": None},
            },
            "anger": {
                "type": "score",
                "instructions": "How angry?",
                "criteria": ["calm", "upset: raised voice", "furious"],
            },
        },
    }
    system_one = httpx.post(
        served[0] + "/v1/systemone", json=body, headers={"authorization": f"Bearer {KEY}"}
    ).json()["answers"]
    assert decision.answers[0].probability == system_one["urgent"]["noul"]
    assert [p.probability for p in decision.answers[1].probabilities] == list(
        system_one["team"]["probabilities"].values()
    )
    assert decision.answers[2].confidence == system_one["anger"]["confidence"]


def test_messages_and_tool_items_become_a_conversation_state(
    client: openai.OpenAI, tiers: Tiers
) -> None:
    conversation = [
        {"role": "system", "content": "You are support."},
        {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Order "},
                {"type": "input_json", "data": {"id": 7, "items": ["a"]}},
                {"type": "input_text", "text": " is late."},
            ],
        },
        {
            "role": "assistant",
            "phase": "final_answer",
            "content": [
                {"type": "output_text", "text": "Checking."},
                {"type": "refusal", "refusal": "No."},
            ],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "lookup",
            "arguments": '{"id":7}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "shipped"},
        {
            "type": "custom_tool_call",
            "call_id": "c2",
            "name": "sql",
            "input": "select 1",
            "namespace": "db",
        },
        {
            "type": "custom_tool_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "1"}],
        },
    ]
    decision = client.decisions.create(model=MODEL, input=conversation, questions=QUESTIONS[:1])
    assert decision.answers[0].type == "predicate"
    assert tiers.calls["laya"][0].state == [
        {"role": "system", "content": "You are support."},
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": 'Order {"id": 7, "items": ["a"]} is late.'},
        {"role": "assistant", "content": "Checking.No."},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"id":7}'},
        {"type": "function_call_output", "call_id": "c1", "output": "shipped"},
        {
            "type": "custom_tool_call",
            "call_id": "c2",
            "name": "sql",
            "input": "select 1",
            "namespace": "db",
        },
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "1"},
    ]


def test_images_go_to_the_strong_tier_in_order(client: openai.OpenAI, tiers: Tiers) -> None:
    conversation = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "See "},
                {"type": "input_image", "image_url": png("red"), "detail": "low"},
            ],
        }
    ]
    question = {
        "type": "predicate",
        "name": "broken",
        "instructions": [
            {"type": "input_text", "text": "Is this broken? "},
            {"type": "input_image", "image_url": png("blue")},
        ],
    }
    raw = client.decisions.with_raw_response.create(
        model=MODEL, input=conversation, questions=[question, QUESTIONS[1]]
    )
    assert raw.headers["x-cascade-tiers"] == "clef=2"
    assert raw.parse().x_cascade["reasons"] == {"broken": "images", "team": "images"}
    assert tiers.calls["laya"] == []
    (call,) = tiers.calls["clef"]
    assert call.state == [{"role": "user", "content": "See <image:1>"}]
    assert call.questions["broken"].instructions == "Is this broken? <image:2>"
    assert [(i.mime, i.width) for i in call.images] == [("image/png", 8), ("image/png", 8)]


def test_typed_boolean_choice_values_stay_distinct(client: openai.OpenAI, tiers: Tiers) -> None:
    question = {
        "type": "choice",
        "instructions": "Refund?",
        "choices": [{"value": True}, {"value": "true"}, {"value": False}, {"value": "no"}],
    }
    raw = client.decisions.with_raw_response.create(model=MODEL, input="x", questions=[question])
    body = raw.http_response.json()["answers"][0]
    values = [p["value"] for p in body["probabilities"]]
    assert values == [True, "true", False, "no"]
    assert [type(v) for v in values] == [bool, str, bool, str]
    best = max(body["probabilities"], key=lambda p: p["probability"])["value"]
    assert body["choice"] == best and type(body["choice"]) is type(best)
    parsed = raw.parse().answers[0]
    assert [p.value for p in parsed.probabilities] == [True, "true", False, "no"]
    # The model reads the string with its quotes beside the boolean of the same text.
    assert list(tiers.calls["laya"][0].questions["question_0"].criteria) == [
        "true",
        '"true"',
        "false",
        "no",
    ]


def test_unnamed_questions_answer_with_a_null_name(client: openai.OpenAI) -> None:
    unnamed = [{k: v for k, v in q.items() if k != "name"} for q in QUESTIONS]
    raw = client.decisions.with_raw_response.create(
        model=MODEL, input="x", questions=[*unnamed, QUESTIONS[0]]
    )
    answers = raw.http_response.json()["answers"]
    assert [a["name"] for a in answers] == [None, None, None, "urgent"]
    assert all("name" in a for a in answers)
    assert [a.name for a in raw.parse().answers] == [None, None, None, "urgent"]


def test_four_hundred_questions_come_back_in_order(client: openai.OpenAI) -> None:
    kinds = [QUESTIONS[0], QUESTIONS[1], QUESTIONS[2]]
    questions = [
        {**kinds[i % 3], "name": f"n{i}", "instructions": f"Question {i}?"} for i in range(400)
    ]
    forward = client.decisions.create(model=MODEL, input="x", questions=questions).answers
    backward = client.decisions.create(model=MODEL, input="x", questions=questions[::-1]).answers
    assert [a.name for a in forward] == [f"n{i}" for i in range(400)]
    assert [a.type for a in forward] == [q["type"] for q in questions]
    assert [a.model_dump() for a in backward[::-1]] == [a.model_dump() for a in forward]
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.decisions.create(model=MODEL, input="x", questions=[*questions, questions[0]])
    assert info.value.param == "questions"


def test_a_question_only_the_downed_strong_tier_reads_is_refused(
    client: openai.OpenAI, tiers: Tiers
) -> None:
    tiers.clef_down = True
    raw = client.decisions.with_raw_response.create(
        model=MODEL, input="x", questions=[QUESTIONS[0], MANY_OPTIONS, QUESTIONS[2]]
    )
    decision = raw.parse()
    assert [(a.type, a.name) for a in decision.answers] == [
        ("predicate", "urgent"),
        ("refusal", "sku"),
        ("score", "anger"),
    ]
    assert raw.http_response.json()["answers"][1] == {"type": "refusal", "name": "sku"}
    assert decision.x_cascade["refused"] == ["sku"]
    assert raw.headers["x-cascade-tiers"] == "laya=2"
    # Every question refused: the whole request fails, as on System One.
    with pytest.raises(openai.InternalServerError) as info:
        client.decisions.create(model=MODEL, input="x", questions=[MANY_OPTIONS, MANY_OPTIONS])
    assert info.value.status_code == 503
    assert info.value.type == "unavailable"
    assert info.value.response.headers["retry-after"]


def test_one_request_refuses_only_its_strong_only_question_and_degrades_the_rest() -> None:
    """Strong tier down; pre-routed strong: ``sku`` (60 options: the cheap tier cannot stand in)
    and ``area`` (30 options, over this policy's 20: it can). One gateway call to the strong
    tier, ``sku`` refused, ``area`` answered degraded by the cheap tier, ``urgent`` cheap."""
    tiers = Tiers()
    tiers.clef_down = True
    area = {**MANY_OPTIONS, "name": "area", "choices": MANY_OPTIONS["choices"][:30]}
    with (
        serve_app(cascade_app(tiers, max_choice_options=20)) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="any", max_retries=0) as client,
    ):
        raw = client.decisions.with_raw_response.create(
            model=MODEL, input="x", questions=[MANY_OPTIONS, QUESTIONS[0], area]
        )
        body = raw.http_response.json()
        calls = {tier: [list(c.questions) for c in made] for tier, made in tiers.calls.items()}
        # System One on the same questions: the whole request fails, as before.
        one = msgspec.json.encode(
            {
                "model": MODEL,
                "state": "x",
                "questions": {
                    "sku": {"type": "choice", "criteria": [f"p{i}" for i in range(60)]},
                    "urgent": {"type": "noul"},
                },
            }
        )
        failed = client._client.post(
            url + "/v1/systemone", content=one, headers={"content-type": "application/json"}
        )
    assert [a["type"] for a in body["answers"]] == ["refusal", "predicate", "choice"]
    assert body["answers"][0] == {"type": "refusal", "name": "sku"}
    assert body["x_cascade"]["refused"] == ["sku"]
    assert body["x_cascade"]["degraded"] == {"area": "strong_failed"}
    assert body["x_cascade"]["tiers"] == {"urgent": "laya", "area": "laya"}
    assert calls == {
        "clef": [["sku", "area"]],  # one call to the downed tier
        "laya": [["urgent"], ["sku", "area"], ["area"]],
    }
    assert failed.status_code == 503 and failed.headers["retry-after"]
    assert "cannot stand in" in failed.json()["detail"]["message"]


def test_refusals_are_counted_on_the_decisions_route(client: openai.OpenAI, tiers: Tiers) -> None:
    def count(outcome: str) -> float:
        return (
            REGISTRY.get_sample_value(
                "cascade_requests_total",
                {"route": "/v1/decisions", "outcome": outcome, "status": "200"},
            )
            or 0.0
        )

    ok, degraded = count("ok"), count("degraded")
    client.decisions.create(model=MODEL, input="x", questions=QUESTIONS[:1])
    tiers.clef_down = True
    client.decisions.create(model=MODEL, input="x", questions=[QUESTIONS[0], MANY_OPTIONS])
    assert (count("ok") - ok, count("degraded") - degraded) == (1, 1)


def test_strong_down_degrades_as_system_one_does(client: openai.OpenAI, tiers: Tiers) -> None:
    """A question the cheap tier can stand in for is answered (marked degraded), not refused."""
    tiers.clef_down = True
    many_predicates = {**MANY_OPTIONS, "choices": MANY_OPTIONS["choices"][:2]}
    decision = client.decisions.create(
        model=MODEL, input="x", questions=[QUESTIONS[0], many_predicates]
    )
    assert [a.type for a in decision.answers] == ["predicate", "choice"]


ERRORS = [
    ("unknown model", {"model": "gpt-0"}, openai.NotFoundError, "model", "model_not_found"),
    (
        "one choice",
        {"questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}]},
        openai.UnprocessableEntityError,
        "questions[0].choices",
        "value_error",
    ),
    (
        "repeated value",
        {
            "questions": [
                {"type": "choice", "instructions": "x", "choices": [{"value": "a"}, {"value": "a"}]}
            ]
        },
        openai.UnprocessableEntityError,
        "questions[0].choices[1].value",
        "value_error",
    ),
    (
        "Jev's box",
        {"questions": [{"type": "box", "name": "where", "instructions": "x"}]},
        openai.UnprocessableEntityError,
        "questions[0].type",
        "unsupported_question_type",
    ),
    (
        "label too long",
        {
            "questions": [
                {
                    "type": "choice",
                    "instructions": "x",
                    "choices": [{"value": "a" * 300}, {"value": "b"}],
                }
            ]
        },
        openai.UnprocessableEntityError,
        "questions[0].choices[0]",
        "string_too_long",
    ),
    (
        "description too long",
        {
            "questions": [
                {
                    "type": "choice",
                    "instructions": "x",
                    "choices": [{"value": "a", "description": "d" * 20_000}, {"value": "b"}],
                }
            ]
        },
        openai.UnprocessableEntityError,
        "questions[0].choices[0].description",
        "string_too_long",
    ),
    (
        "wrong part type",
        {
            "input": [
                {"role": "developer", "content": [{"type": "input_image", "image_url": "data:,"}]}
            ]
        },
        openai.UnprocessableEntityError,
        "input[0].content[0].type",
        "value_error",
    ),
    (
        "output without its call",
        {"input": [{"type": "function_call_output", "call_id": "z", "output": "1"}]},
        openai.UnprocessableEntityError,
        "input[0].call_id",
        "value_error",
    ),
    (
        "remote image",
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}],
                }
            ]
        },
        openai.UnprocessableEntityError,
        "input[0].content[0].image_url",
        "value_error",
    ),
    (
        "no questions",
        {"questions": []},
        openai.UnprocessableEntityError,
        "questions",
        "value_error",
    ),
    (
        "state too large",
        {"input": "x" * 1_000_001},
        openai.BadRequestError,
        None,
        "request_too_large",
    ),
]


@pytest.mark.parametrize(
    ("name", "change", "error", "param", "code"), ERRORS, ids=[e[0] for e in ERRORS]
)
def test_client_errors_raise_the_sdks_classes(
    client: openai.OpenAI, name: str, change: dict[str, Any], error: type, param: str, code: str
) -> None:
    body = {"model": MODEL, "input": "x", "questions": QUESTIONS[:1], **change}
    with pytest.raises(error) as info:
        client.decisions.create(**body)
    assert (info.value.param, info.value.code) == (param, code)
    assert info.value.type and info.value.message


def test_malformed_json_and_bad_keys(served: tuple[str, Tiers]) -> None:
    with openai.OpenAI(base_url=served[0] + "/v1", api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as info:
            c.decisions.create(model=MODEL, input="x", questions=QUESTIONS)
    assert info.value.response.headers["www-authenticate"] == 'Bearer realm="cascade"'
    with openai.OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=0) as c:
        with pytest.raises(openai.BadRequestError) as bad:
            c.post(
                "/decisions",
                content=b'{"model": "x", "inp',
                cast_to=object,
                options={"headers": {"content-type": "application/json"}},
            )
        assert (bad.value.code, bad.value.param) == ("json_invalid", None)
        assert "not valid JSON at character 19" in bad.value.message
        with pytest.raises(openai.NotFoundError):
            c.post("/decisions/nowhere", body={}, cast_to=object)


def _raise(exc: Exception) -> Any:
    def handler(call: EngineCall) -> EngineAnswer:
        raise exc

    return handler


def _no_answers(call: EngineCall) -> EngineAnswer:
    return msgspec.structs.replace(deterministic_answer(call), results={})


@pytest.mark.parametrize(
    ("handler", "error", "status", "kind"),
    [
        (
            _raise(RateLimited("upstream rate limit", retry_after=2)),
            openai.RateLimitError,
            429,
            "overloaded_error",
        ),
        # a malformed answer is the tier failing: with no other tier to stand in, unavailable
        (_no_answers, openai.InternalServerError, 503, "unavailable"),
        (
            _raise(EngineUnavailable("upstream down")),
            openai.InternalServerError,
            503,
            "unavailable",
        ),
    ],
    ids=["rate limited", "garbage", "down"],
)
def test_tier_failures_raise_the_sdks_classes(
    handler: Any, error: type, status: int, kind: str
) -> None:
    with (
        serve_app(single_tier_app(handler)) as url,
        openai.OpenAI(base_url=url + "/v1", api_key="any", max_retries=0) as c,
    ):
        with pytest.raises(error) as info:
            c.decisions.create(model=MODEL, input="x", questions=QUESTIONS)
    assert (info.value.status_code, info.value.type, info.value.param) == (status, kind, None)


def test_through_langchain_openai(served: tuple[str, Tiers], tiers: Tiers) -> None:
    decisions = OpenAIDecisions(model=MODEL, base_url=served[0] + "/v1", api_key=KEY, max_retries=0)
    response = decisions.invoke(
        {
            "input": [
                HumanMessage(
                    content=[
                        {"type": "text", "text": "Stripe has failed for three days. "},
                        {"type": "image_url", "image_url": {"url": png()}},
                    ]
                )
            ],
            "questions": {
                "department": Choice(
                    instructions="Which team?",
                    choices={"billing": "Payments.", "technical": "Bugs."},
                ),
                "urgent": Predicate(instructions="Is this urgent?"),
                "frustration": Score(
                    instructions="How frustrated?", levels=["Calm", "Concerned", "Angry"]
                ),
            },
        }
    )
    assert response.choices["department"].choice in {"billing", "technical"}
    assert 0 <= response.predicates["urgent"].probability <= 1
    assert set(response.scores["frustration"].legend.values()) == {"Calm", "Concerned", "Angry"}
    assert response.usage.input_tokens > 0 and response.request_id
    assert tiers.calls["clef"][0].state == [
        {"role": "user", "content": "Stripe has failed for three days. <image:1>"}
    ]
    tiers.clef_down = True
    refused = decisions.invoke(
        {
            "input": "x",
            "questions": {
                "urgent": Predicate(instructions="Is this urgent?"),
                "sku": Choice(instructions="Which?", choices={f"p{i}": None for i in range(60)}),
            },
        }
    )
    assert set(refused.refusals) == {"sku"} and set(refused.predicates) == {"urgent"}
