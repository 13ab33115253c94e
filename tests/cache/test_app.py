"""Through the real app (fake tiers): cached responses are the fresh ones byte for byte, apart
from ``timings_s``; the ``x-cascade-cache`` header; ``Cache-Control`` on the request."""

from __future__ import annotations

import json
import re

from litestar.testing import TestClient

from cascade.http.app import create_app
from cascade.settings import Settings
from tests.cache.helpers import Counting, cheap_policy, gateway, joint_policy, per_question

QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "Payments", "technical": None, "sales": "Deals"},
    },
    "anger": {
        "type": "score",
        "instructions": "How angry?",
        "criteria": ["calm", "upset", "furious"],
    },
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
}
BODY = {"model": "jev-latest", "state": "I was charged twice", "questions": QUESTIONS}
TIMINGS = re.compile(rb'"timings_s":\{[^}]*\}')
CACHED = re.compile(rb',"cached_tokens":\d+')


def without_timings(content: bytes) -> bytes:
    """The response without what says where it came from: the time taken, the cached tokens."""
    return CACHED.sub(b"", TIMINGS.sub(b'"timings_s":{}', content))


def client(policy=None, engine=None) -> TestClient:  # noqa: ANN001
    engine = engine or Counting("laya", per_question, independent=True)
    return TestClient(create_app(Settings(), gateway(policy or cheap_policy(), engine)))


def test_cached_responses_are_the_fresh_bytes() -> None:
    with client() as cached, client() as fresh:
        first = cached.post("/v1/systemone", json=BODY)
        again = cached.post("/v1/systemone", json=BODY)
        other = fresh.post("/v1/systemone", json=BODY)
    assert first.headers["x-cascade-cache"] == "miss" and again.headers["x-cascade-cache"] == "hit"
    assert without_timings(again.content) == without_timings(first.content)
    assert without_timings(again.content) == without_timings(other.content)
    assert set(json.loads(again.content)["x_cascade"]["timings_s"]) == set(
        json.loads(first.content)["x_cascade"]["timings_s"]
    )


def test_a_partial_hit_through_the_app_is_the_fresh_bytes_too() -> None:
    some = {**BODY, "questions": {"team": QUESTIONS["team"]}}
    with client() as cached, client() as fresh:
        cached.post("/v1/systemone", json=some)
        partial = cached.post("/v1/systemone", json=BODY)
        other = fresh.post("/v1/systemone", json=BODY)
    assert partial.headers["x-cascade-cache"] == "partial"
    assert without_timings(partial.content) == without_timings(other.content)


def test_joint_tier_bytes_and_the_decisions_route() -> None:
    with client(joint_policy(), Counting("upstream", per_question, independent=False)) as c:
        first = c.post("/v1/systemone", json=BODY)
        again = c.post("/v1/systemone", json=BODY)
        assert without_timings(again.content) == without_timings(first.content)
        decision = {
            "model": "jev-latest",
            "input": "I was charged twice",
            "questions": [{"type": "predicate", "name": "urgent", "instructions": "Is it urgent?"}],
        }
        answers = [c.post("/v1/decisions", json=decision) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.headers["x-cascade-cache"] for a in answers] == ["miss", "hit"]
    details = [a.json()["usage"]["input_tokens_details"]["cached_tokens"] for a in answers]
    assert details == [0, answers[1].json()["usage"]["input_tokens"]] and details[1] > 0
    assert (
        json.loads(again.content)["usage"]["cached_tokens"]
        == json.loads(first.content)["usage"]["input_tokens"]
    )
    assert "cached_tokens" not in json.loads(first.content)["usage"]


def test_request_cache_control_and_the_batch_header() -> None:
    engine = Counting("laya", per_question, independent=True)
    with client(engine=engine) as c:
        assert (
            c.post("/v1/systemone", json=BODY, headers={"cache-control": "no-store"}).headers[
                "x-cascade-cache"
            ]
            == "bypass"
        )
        assert c.post("/v1/systemone", json=BODY).headers["x-cascade-cache"] == "miss"
        assert (
            c.post("/v1/systemone", json=BODY, headers={"cache-control": "no-cache"}).headers[
                "x-cascade-cache"
            ]
            == "bypass"
        )
        assert (
            c.post("/v1/systemone", json=BODY, headers={"cache-control": "max-age=0"}).headers[
                "x-cascade-cache"
            ]
            == "bypass"
        )
        batch = {"states": ["I was charged twice", "a new state"], "questions": QUESTIONS}
        mixed = c.post("/v1/systemone/batch", json=batch)
        assert mixed.status_code == 200 and mixed.headers["x-cascade-cache"] == "partial"
        assert c.post("/v1/systemone/batch", json=batch).headers["x-cascade-cache"] == "hit"
    assert len(engine.asked) == 5
