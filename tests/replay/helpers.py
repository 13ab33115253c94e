"""Gateways on two fake tiers that answer differently, logging to a decision log, and the
requests they serve (the replay tests')."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.files import load_policy
from cascade.settings import Settings
from cascade.store.base import DecisionStore
from cascade.store.postgres import PostgresStore
from cascade.store.sqlite import SqliteStore
from tests.servers import serve_app

ADMIN = {"authorization": "Bearer admin-key"}
QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": ["billing", "technical", "sales"],
    },
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "anger": {
        "type": "score",
        "instructions": "How angry?",
        "criteria": ["calm", "upset", "furious"],
    },
}


def policy_text(
    threshold: float,
    *,
    cheap: str = "cheap",
    extra: str = "",
    urls: tuple[str, str] = ("http://127.0.0.1:9", "http://127.0.0.1:9"),
) -> str:
    """Two upstream tiers at ``urls`` (or fake engines in their place); every cell's confidence
    threshold is ``threshold``: 0 keeps every cheap answer, 1 escalates every question."""
    cells = ", ".join(f'"{band}" = {threshold}' for band in ("2", "3-5", "6-10", "11+"))
    return f"""[tiers.{cheap}]
kind = "upstream"
urls = ["{urls[0]}"]

[tiers.strong]
kind = "upstream"
urls = ["{urls[1]}"]

[route]
cheap = "{cheap}"
strong = "strong"

[thresholds.confidence]
choice = {{ {cells} }}
score = {{ {cells} }}
noul = {{ "2" = {threshold} }}
{extra}"""


def strong_answer(call: EngineCall) -> EngineAnswer:
    """The strong tier: stable answers of its own (not the cheap tier's)."""
    return deterministic_answer(msgspec.structs.replace(call, state={"strong": call.state}))


def gateway_of(path: Path, log: DecisionStore | None = None) -> Gateway:
    policy = load_policy(path)
    engines = {
        name: FakeEngine(name, strong_answer if name == "strong" else deterministic_answer)
        for name in policy.tiers
    }
    return Gateway(policy, engines, decisions=log)


@contextlib.contextmanager
def served(path: Path, log: Path | str | None = None) -> Iterator[httpx.Client]:
    """The gateway serving ``path`` (logging to ``log``: a SQLite file or a PostgreSQL URL)
    under a real server on loopback."""
    with tempfile.TemporaryDirectory() as spool:
        store: DecisionStore | None = (
            None
            if log is None
            else SqliteStore(log)
            if isinstance(log, Path)
            else PostgresStore(log, spool=Path(spool) / "spool", replica="r1")
        )
        settings = Settings(
            policy=str(path),
            admin_keys=("admin-key",),
            decision_log=None if log is None else str(log),
        )
        try:
            with (
                serve_app(create_app(settings, gateway_of(path, store))) as url,
                httpx.Client(base_url=url, timeout=30) as client,
            ):
                yield client
        finally:
            if store is not None:
                store.close()


def body(n: int) -> dict[str, Any]:
    return {
        "model": "jev-latest",
        "state": f"ticket {n}: I was charged twice",
        "questions": QUESTIONS,
    }


def ask(client: httpx.Client, n: int) -> dict[str, Any]:
    """Request ``n`` (its id ``r{n}``); each question's tier and answer as returned."""
    r = client.post("/v1/systemone", json=body(n), headers={"x-request-id": f"r{n}"})
    assert r.status_code == 200, r.text
    extra, answers = r.json()["x_cascade"], r.json()["answers"]
    return {q: (extra["tiers"][q], _label(QUESTIONS[q], answers[q])) for q in QUESTIONS}


def _label(question: dict[str, Any], answer: dict[str, Any]) -> Any:
    """The wire answer as ``answer_label`` names it (a choice key, a noul bool, a level)."""
    if question["type"] == "noul":
        return answer["noul"] > 0.5
    if question["type"] == "score":
        p = answer["probabilities"]
        return max(range(len(p)), key=lambda i: (p[str(i)], -i))  # the first maximum
    return answer["choice"]
