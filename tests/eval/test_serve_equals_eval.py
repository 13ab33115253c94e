"""The offline cascade is the served one: ``cascade eval --demo`` (and ``--strong-down``) decide
every question of the request sample exactly as a live demo gateway on the same tiers answers
it, tier, reason, degradation and answer (a refusal is a null ``cascade``)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.bench.sample import SAMPLE
from cascade.build import build_gateway
from cascade.calls import EngineAnswer, EngineCall
from cascade.cli import main
from cascade.errors import EngineUnavailable
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.settings import Settings
from tests.servers import serve_app

N = 24  # items: every source of the sample, bounded for the CPU


class Down:
    """The strong tier, unavailable."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def start(self) -> None: ...

    async def answer(self, call: EngineCall) -> EngineAnswer:
        raise EngineUnavailable(f"{self.name} is down")

    def ready(self) -> bool:
        return False

    def health(self) -> dict[str, Any]:
        return {"engine": "down"}

    async def aclose(self) -> None: ...


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo")  # the demo writes its tiny checkpoints here


def items(tmp: Path) -> Path:
    """``N`` items spread over the sample's sources (it is grouped by source)."""
    lines = SAMPLE.read_text().splitlines()
    picked = lines[:: len(lines) // N][:N]
    path = tmp / "sample.jsonl"
    path.write_text("\n".join(picked) + "\n")
    return path


def evaluated(demo_dir: Path, data: Path, out: Path, *flags: str) -> list[dict[str, Any]]:
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(io.StringIO()):
        env.setenv("CASCADE_DEMO_DIR", str(demo_dir))
        assert main(["eval", str(data), "--demo", "--out", str(out), "--no-progress", *flags]) == 0
    return [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]


@contextlib.contextmanager
def served(demo_dir: Path, *, strong_down: bool) -> Iterator[tuple[httpx.Client, Gateway]]:
    """The demo gateway under a real server on loopback, and a client for it."""
    settings = Settings(demo=True, demo_dir=str(demo_dir))
    gateway = build_gateway(settings)
    if strong_down:
        strong = gateway.policy.route.strong
        assert strong is not None
        gateway = Gateway(gateway.policy, {**gateway.engines, strong: Down(strong)}, demo=True)
    with (
        serve_app(create_app(settings, gateway), timeout_s=120) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        yield client, gateway


def served_rows(client: httpx.Client, gateway: Gateway, data: Path) -> list[dict[str, Any] | None]:
    """What the gateway returned for each question, in ``items.jsonl``'s terms."""
    route, found = gateway.policy.route, []
    model = gateway.policy.models.cascade[0]
    for line in data.read_text().splitlines():
        item = json.loads(line)
        r = client.post(
            "/v1/systemone",
            json={"model": model, "state": item["state"], "questions": item["questions"]},
        )
        for qid in item["questions"]:
            if r.status_code != 200:
                found.append(None)
                continue
            body = r.json()
            extra, answer = body["x_cascade"], body["answers"][qid]
            found.append(
                {
                    "tier": "cheap" if extra["tiers"][qid] == route.cheap else "strong",
                    "reason": extra["reasons"].get(qid),
                    "degraded": qid in extra["degraded"],
                    "answer": answer.get("choice", answer.get("noul")),
                }
            )
    return found


def offline_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    for row in rows:
        c = row["cascade"]
        if c is None:
            out.append(None)
            continue
        chosen = row["cheap"] if c["tier"] == "cheap" else row["strong"]
        p = chosen["probabilities"]
        # the wire's noul is P(true), rounded; a choice is its label
        answer = round(p[1], 4) if row["type"] == "noul" else c["answer"]
        out.append(
            {"tier": c["tier"], "reason": c["reason"], "degraded": c["degraded"], "answer": answer}
        )
    return out


@pytest.mark.parametrize("strong_down", [False, True], ids=["strong_up", "strong_down"])
def test_eval_decides_every_question_as_the_gateway_answers_it(
    demo_dir: Path, tmp_path: Path, strong_down: bool
) -> None:
    data = items(tmp_path)
    flags = ("--strong-down",) if strong_down else ()
    offline = offline_rows(evaluated(demo_dir, data, tmp_path / "eval", *flags))
    with served(demo_dir, strong_down=strong_down) as (client, gateway):
        live = served_rows(client, gateway, data)
    assert len(offline) == len(live) == N
    assert offline == live
    decided = [row for row in live if row is not None]
    if strong_down:  # the demo shows both: answers standing in, and refusals
        assert any(row["degraded"] for row in decided) and None in live
        assert all(row["tier"] == "cheap" for row in decided)
    else:
        assert {row["tier"] for row in decided} == {"cheap", "strong"}
