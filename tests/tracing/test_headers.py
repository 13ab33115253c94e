"""``Server-Timing`` and ``x-cascade-cost`` on both contracts and the batch, tracing on or off;
tracing changes no response byte but the timings."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.servers import serve_app
from tests.tracing.helpers import BODY, MODEL, app, tracing_to
from tests.tracing.receiver import run_receiver

DECISION = {
    "model": MODEL,
    "input": "I was charged twice",
    "questions": [
        {"type": "predicate", "name": "urgent", "instructions": "Is it urgent?"},
        {"type": "predicate", "name": "unsure", "instructions": "Is it spam?"},
    ],
}
BATCH = {"model": MODEL, "states": ["one", {"ticket": "two"}], "questions": BODY["questions"]}
ENTRY = re.compile(r"^([\w.-]+);dur=(\d+\.\d{3})$")


def _timing(response: httpx.Response) -> dict[str, float]:
    entries = [ENTRY.match(e) for e in response.headers["server-timing"].split(", ")]
    assert all(entries), response.headers["server-timing"]
    return {m[1]: float(m[2]) for m in entries if m}


def _cost(response: httpx.Response) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in (item.split("=") for item in response.headers["x-cascade-cost"].split(","))
    }


@pytest.mark.parametrize(("path", "body"), [("/v1/systemone", BODY), ("/v1/decisions", DECISION)])
def test_both_contracts_time_each_tier_and_price_the_answer(path: str, body: Any) -> None:
    with serve_app(app()) as url:
        response = httpx.post(url + path, json=body)
    assert response.status_code == 200, response.text
    timing = _timing(response)
    assert list(timing) == ["admission", "decode", "pre_route", "laya", "clef", "gateway"]
    assert timing["gateway"] >= max(v for k, v in timing.items() if k != "gateway")
    cost = _cost(response)
    assert list(cost) == ["laya", "clef", "total"]
    assert cost["laya"] > 0 and cost["clef"] > 0
    assert cost["total"] == pytest.approx(cost["laya"] + cost["clef"], rel=1e-5)


def test_the_batch_sums_cost_and_keeps_each_tiers_longest_time() -> None:
    with serve_app(app()) as url:
        one = httpx.post(url + "/v1/systemone", json={**BODY, "state": "one"})
        batch = httpx.post(url + "/v1/systemone/batch", json=BATCH)
    assert batch.status_code == 200, batch.text
    assert {"laya", "clef", "gateway"} <= set(_timing(batch))
    assert _cost(batch)["total"] > _cost(one)["total"]  # two states, one of them alike


def _untimed(value: Any) -> Any:
    """``value`` without its ``timings_s`` (the one part of a body that differs each time)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k != "timings_s"}
    return [_untimed(v) for v in value] if isinstance(value, list) else value


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/systemone", BODY), ("/v1/decisions", DECISION), ("/v1/systemone/batch", BATCH)],
)
def test_tracing_changes_no_byte_but_the_timings(path: str, body: Any) -> None:
    def answer() -> httpx.Response:
        with serve_app(app()) as url:
            return httpx.post(url + path, json=body, headers={"x-request-id": "same"})

    off = answer()
    with run_receiver() as receiver, tracing_to(receiver.url):
        on = answer()
    assert off.status_code == on.status_code == 200
    assert _untimed(off.json()) == _untimed(on.json())
    assert len(off.content) - len(on.content) in range(-20, 21)  # timings' digits only
    timed = {"server-timing", "date", "content-length"}  # the timings vary, in digits too
    assert {k: v for k, v in off.headers.items() if k not in timed} == {
        k: v for k, v in on.headers.items() if k not in timed
    }
    assert list(_timing(off)) == list(_timing(on))
