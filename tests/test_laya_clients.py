"""Laya's side of compatibility, against a real ``laya-serve`` 0.4.15 on a tiny checkpoint.

- Laya's own remote client (``RemoteRouter``, what ``LAYA_BASE_URL`` selects) works against the
  gateway in front of ``laya-serve`` (``--upstream``) and gets laya-serve's answers.
- The gateway's in-process Laya tier (``serve --laya DIR``) answers ``/v1/systemone`` and
  ``/v1/systemone/batch`` as laya-serve does on the same directory.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.http.app import create_app
from cascade.laya.tiny import make_tiny
from cascade.settings import Settings
from tests.servers import free_port, run_process, serve_app

BIN = Path(sys.executable).parent
QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "payments and refunds", "technical": "bugs", "sales": None},
    },
    "anger": {
        "type": "score",
        "instructions": "How angry is the customer?",
        "criteria": ["calm", "annoyed", "furious", {"level": "legal threats"}],
    },
    "urgent": {
        "type": "noul",
        "instructions": "Is it urgent?",
        "criteria": {"true": "needs action today"},
    },
    "labels": {
        "type": "choice",
        "instructions": "Pick one",
        "criteria": ["x", "y", "z", "w"],
        "option_order": [3, 1, 0, 2],
    },
}
STATES: list[Any] = [
    "I was charged twice for my March invoice [MASK] and nobody answers my emails.",
    {"ticket": {"subject": "refund", "body": "double charge " * 30}, "tier": "pro"},
    [
        {"role": "user", "content": "hello"},
        {"role": "agent", "content": "hi, how can I help"},
        {"role": "user", "content": "my refund is late " * 20},
    ],
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("laya") / "tiny")


@pytest.fixture(scope="module")
def laya_serve(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # laya may rewrite tokenizer files in place: give it its own copy.
    copy = tmp_path_factory.mktemp("laya-serve") / "ckpt"
    shutil.copytree(checkpoint, copy)
    port = free_port()
    env = {
        **os.environ,
        "LAYA_EXTRA_MODELS": json.dumps(
            {"english": str(copy), "multilingual": str(copy), "typed-decisions": str(copy)}
        ),
        "LAYA_HOST": "127.0.0.1",
        "LAYA_PORT": str(port),
        "LAYA_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    url = f"http://127.0.0.1:{port}"
    with run_process([str(BIN / "laya-serve")], ready_url=url + "/health", env=env, timeout_s=180):
        yield url


def assert_same_answers(ours: dict, theirs: dict, *, tol: float = 1.5e-4) -> None:
    assert ours["answers"].keys() == theirs["answers"].keys()
    for qid, a in theirs["answers"].items():
        b = ours["answers"][qid]
        assert b["type"] == a["type"], qid
        for key in ("choice", "legend"):
            assert b.get(key) == a.get(key), (qid, key)
        for key in ("noul", "score", "confidence", "answer_confidence"):
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=tol), (qid, key)
        for option, p in a.get("probabilities", {}).items():
            assert b["probabilities"][option] == pytest.approx(p, abs=tol), (qid, option)
    for key in (
        "input_tokens",
        "state_tokens",
        "state_tokens_dropped",
        "truncated",
        "truncated_questions",
    ):
        assert ours["usage"][key] == theirs["usage"][key], key


def test_laya_remote_client_through_the_gateway(laya_serve: str) -> None:
    from laya.mcp.remote import RemoteRouter

    with serve_app(create_app(Settings(upstream=laya_serve))) as gateway:
        via = RemoteRouter(gateway)
        direct = RemoteRouter(laya_serve)
        for state in STATES:
            assert_same_answers(via.predict(state, QUESTIONS), direct.predict(state, QUESTIONS))
        assert via.health()["status"] == "ok"


@pytest.mark.parametrize("route", ["/v1/systemone", "/v1/systemone/batch"])
def test_in_process_laya_tier_answers_like_laya_serve(
    checkpoint: Path, laya_serve: str, route: str
) -> None:
    settings = Settings(laya={"english": str(checkpoint)})
    with serve_app(create_app(settings), timeout_s=300) as gateway:
        if route.endswith("batch"):
            body = {"states": STATES, "questions": QUESTIONS}
            ours = httpx.post(gateway + route, json=body, timeout=60).json()
            theirs = httpx.post(laya_serve + route, json=body, timeout=60).json()
            for a, b in zip(ours["results"], theirs["results"], strict=True):
                assert_same_answers(a, b)
            assert ours["total_usage"]["input_tokens"] == theirs["total_usage"]["input_tokens"]
        else:
            for state in STATES:
                body = {"state": state, "questions": QUESTIONS, "model": "english"}
                ours = httpx.post(gateway + route, json=body, timeout=60).json()
                theirs = httpx.post(laya_serve + route, json=body, timeout=60).json()
                assert_same_answers(ours, theirs)
                # make-tiny weights: labelled as --demo labels them (issue 29)
                assert ours["model"] == "DEMO-random-weights/english-demo-random"
        health = httpx.get(gateway + "/health").json()
        assert health["loaded"] == ["english"]
