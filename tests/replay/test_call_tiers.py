"""``cascade replay --call-tiers``: the answers the log lacks are asked of the candidate's own
tiers (real upstream servers on loopback), and the replay then decides every question as a
gateway serving the candidate on those tiers does; without the stored state it cannot ask."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cascade.build import build_gateway
from cascade.cli import main
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings
from cascade.store.rows import StateMode
from cascade.store.sqlite import SqliteStore
from tests.replay.helpers import ask, policy_text, strong_answer
from tests.servers import serve_app

N = 6  # requests: 18 questions, so the report's first 20 changes are all of them


@pytest.fixture(scope="module")
def tiers() -> Iterator[tuple[str, str]]:
    """The cheap and the strong tier, each a one-tier server of fake answers."""

    def tier(handler: object) -> contextlib.AbstractContextManager[str]:
        policy = Policy.single_tier("t", UpstreamTier(urls=["http://127.0.0.1:9"]))
        gateway = Gateway(policy, {"t": FakeEngine("t", handler)})  # type: ignore[arg-type]
        return serve_app(create_app(Settings(), gateway))

    with tier(deterministic_answer) as cheap, tier(strong_answer) as strong:
        yield f"{cheap}/v1/systemone", f"{strong}/v1/systemone"


@contextlib.contextmanager
def gateway(
    policy: Path, log: Path | None = None, state: StateMode = "hash"
) -> Iterator[httpx.Client]:
    """The gateway ``cascade serve --policy`` builds (its tiers upstream), under a real
    server, logging to ``log`` (the state stored as ``state``)."""
    store = None if log is None else SqliteStore(log, state_mode=state)
    settings = Settings(policy=str(policy))
    try:
        with (
            serve_app(create_app(settings, build_gateway(settings, decisions=store))) as url,
            httpx.Client(base_url=url, timeout=30) as client,
        ):
            yield client
    finally:
        if store is not None:
            store.close()


def logged(tmp_path: Path, urls: tuple[str, str], state: StateMode) -> Path:
    """N requests served with every answer kept cheap: no strong answer logged."""
    policy, log = tmp_path / "a.toml", tmp_path / "d.db"
    policy.write_text(policy_text(0.0, urls=urls))
    with gateway(policy, log, state) as client:
        for n in range(N):
            ask(client, n)
    return log


def replayed(candidate: Path, log: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    assert (
        main(["replay", "--policy", str(candidate), "--from-log", str(log), "--json", *flags]) == 0
    )
    return json.loads(capsys.readouterr().out)


def test_asked_answers_decide_as_the_candidate_serving_live(
    tiers: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = logged(tmp_path, tiers, "text")
    candidate = tmp_path / "b.toml"
    candidate.write_text(policy_text(0.7, urls=tiers))
    without = replayed(candidate, log, capsys)
    assert without["judged"] < 3 * N and without["not_judged"]["no_strong_answer"] > 0
    report = replayed(candidate, log, capsys, "--call-tiers")
    with gateway(candidate) as client:
        live = {(f"r{n}", q): found for n in range(N) for q, found in ask(client, n).items()}
    assert report["judged"] == 3 * N and sum(report["not_judged"].values()) == 0
    escalated = [k for k, (tier, _) in live.items() if tier == "strong"]
    assert report["called"] == {"cheap": 0, "strong": len(escalated)} and escalated
    changed = {
        (c["request"], c["question"]): (
            "cheap" if c["candidate"]["tier"] == "cheap" else "strong",
            c["candidate"]["answer"],
        )
        for c in report["changed"]
    }
    assert len(changed) == report["tier_changes"]["cheap_to_strong"] == len(escalated)
    assert {k: live[k] for k in changed} == changed  # what changes, as live
    with gateway(tmp_path / "a.toml") as client:  # the rest: served A's answers, as live
        served = {(f"r{n}", q): found for n in range(N) for q, found in ask(client, n).items()}
    assert {k: v for k, v in live.items() if k not in changed} == {
        k: v for k, v in served.items() if k not in changed
    }


def test_without_the_stored_state_it_cannot_ask(
    tiers: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = logged(tmp_path, tiers, "hash")
    candidate = tmp_path / "b.toml"
    candidate.write_text(policy_text(1.0, urls=tiers))
    report = replayed(candidate, log, capsys, "--call-tiers")
    assert report["judged"] == 0 and report["not_judged"]["no_state"] == 3 * N
    assert report["called"] == {"cheap": 0, "strong": 0}
