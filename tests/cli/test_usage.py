"""``cascade usage``: spend per tenant and tier from a decision log the gateway wrote, as a
table and as JSON, filtered by time and tenant, priced by a policy's [cost]; its mistakes are a
line each, no traceback."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest

from cascade.calls import EngineCall
from cascade.cli import main
from cascade.cli.errors import UsageError
from cascade.cli.usage import since_of
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.policy.model import (
    Bands,
    Checkpoints,
    ClefTier,
    LayaTier,
    Policy,
    Route,
    Thresholds,
    TypeBands,
)
from cascade.schema import ChoiceQuestion, NoulQuestion
from cascade.store.sqlite import SqliteStore

NOUL = NoulQuestion(instructions="Urgent?")
TEAM = ChoiceQuestion(instructions="Which team?", criteria=["billing", "tech", "sales"])
POLICY_TOML = """
[tiers.laya]
kind = "laya"
checkpoints = { english = "x" }

[tiers.clef]
kind = "clef"
release = "x"

[route]
cheap = "laya"
strong = "clef"

[cost]
laya = 2.0
clef = 50.0
"""


def _call(rid: str, state: str) -> EngineCall:
    return EngineCall(
        state=state, model="jev-latest", request_id=rid, questions={"u": NOUL, "t": TEAM}
    )


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """acme: two requests, u escalated in each; zeta: one; one request with no tenant."""
    path = tmp_path_factory.mktemp("usage") / "d.db"
    policy = Policy(
        tiers={
            "laya": LayaTier(checkpoints=Checkpoints(english="x")),
            "clef": ClefTier(release="x"),
        },
        route=Route(cheap="laya", strong="clef"),
        thresholds=Thresholds(confidence=TypeBands(noul=Bands(two=0.999))),  # u escalates
    )
    writer = SqliteStore(path)
    gateway = Gateway(
        policy, {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")}, decisions=writer
    )

    async def serve() -> None:
        await gateway.start()
        for rid, state, tenant in (
            ("a1", "one", "acme"),
            ("a2", "two two", "acme"),
            ("z1", "three", "zeta"),
            ("n1", "four", ""),
        ):
            await gateway.systemone(_call(rid, state), tenant=tenant)
        await gateway.aclose()

    asyncio.run(serve())
    writer.close()
    return path


def _tokens(state: str) -> tuple[int, int]:
    """(cheap, strong) input tokens of one request: the cheap tier read both questions, the
    strong tier u alone."""
    cheap = deterministic_answer(_call("x", state)).usage.input_tokens
    only_u = EngineCall(state=state, model="jev-latest", questions={"u": NOUL})
    return cheap, deterministic_answer(only_u).usage.input_tokens


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["usage", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_spend_per_tenant_and_tier_as_json(log: Path, capsys: pytest.CaptureFixture[str]):
    report = _json(capsys, "--from-log", str(log))
    rows = {(r["tenant"], r["tier"]): r for r in report["rows"]}
    assert set(rows) == {(t, tier) for t in ("", "acme", "zeta") for tier in ("laya", "clef")}
    acme_cheap = sum(_tokens(s)[0] for s in ("one", "two two"))
    acme_strong = sum(_tokens(s)[1] for s in ("one", "two two"))
    assert rows[("acme", "laya")] == {
        "tenant": "acme",
        "tier": "laya",
        "requests": 2,
        "questions": 4,
        "final": 2,
        "input_tokens": pytest.approx(acme_cheap),
        "cost": pytest.approx(acme_cheap / 1000),
    }
    assert rows[("acme", "clef")] == {
        "tenant": "acme",
        "tier": "clef",
        "requests": 2,
        "questions": 2,
        "final": 2,
        "input_tokens": pytest.approx(acme_strong),
        "cost": pytest.approx(acme_strong * 20 / 1000, abs=1e-4),
    }
    total = {r["tier"]: r for r in report["total"]}
    assert total["laya"]["requests"] == 4 and total["clef"]["questions"] == 4
    assert report["prices_per_1k_tokens"] == {"laya": 1.0, "clef": 20.0}
    assert report["log_rows"] == 8 and report["rows_without_tokens"] == 0


def test_the_table_names_each_tenant_and_tier(log: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["usage", "--from-log", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"8 rows of {log}; cost per 1000 input tokens: laya 1, clef 20")
    assert out[1].split() == [
        "tenant",
        "tier",
        "requests",
        "questions",
        "final",
        "input",
        "tokens",
        "cost",
    ]
    lines = {tuple(line.split()[:2]): line.split()[2:] for line in out[2:]}
    assert lines[("acme", "laya")][:3] == ["2", "4", "2"]
    assert lines[("zeta", "clef")][:3] == ["1", "1", "1"]
    assert lines[("(none)", "laya")][:3] == ["1", "2", "1"]
    assert lines[("(all)", "laya")][:3] == ["4", "8", "4"]


def test_tenant_since_and_policy_prices(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    report = _json(capsys, "--from-log", str(log), "--tenant", "zeta")
    assert {r["tenant"] for r in report["rows"]} == {"zeta"} and report["log_rows"] == 2
    assert _json(capsys, "--from-log", str(log), "--since", "1h")["log_rows"] == 8
    assert _json(capsys, "--from-log", str(log), "--since", str(time.time() + 60))["rows"] == []
    policy = tmp_path / "p.toml"
    policy.write_text(POLICY_TOML)
    priced = _json(capsys, "--from-log", str(log), "--policy", str(policy), "--cost", "clef=10")
    assert priced["prices_per_1k_tokens"] == {"laya": 2.0, "clef": 10.0}
    zeta = {r["tier"]: r for r in priced["rows"] if r["tenant"] == "zeta"}
    cheap, strong = _tokens("three")
    assert zeta["laya"]["cost"] == pytest.approx(cheap * 2 / 1000, abs=1e-4)
    assert zeta["clef"]["cost"] == pytest.approx(strong * 10 / 1000, abs=1e-4)


def test_since_reads_ages_dates_and_unix_seconds():
    now = 1_800_000_000.0
    assert since_of("90m", now) == now - 5400
    assert since_of("7d", now) == now - 7 * 86400
    assert since_of("2026-12-01", now) == 1_796_083_200.0  # midnight UTC
    assert since_of("2026-12-01T01:00:00+01:00", now) == 1_796_083_200.0
    assert since_of("1796083200", now) == 1_796_083_200.0
    with pytest.raises(UsageError, match="--since 'yesterday'"):
        since_of("yesterday", now)


@pytest.mark.parametrize(
    ("make", "argv", "status", "says"),
    [
        (None, ["--from-log", "{tmp}/missing.db"], 1, "missing.db: no such file"),
        ("text", ["--from-log", "{tmp}/f.db"], 1, "f.db: not a decision log"),
        (
            "sqlite",
            ["--from-log", "{tmp}/f.db"],
            1,
            "f.db: not a decision log (no decisions table)",
        ),
        ("sqlite", ["--from-log", "{tmp}/f.db", "--since", "last week"], 2, "--since 'last week'"),
        ("sqlite", ["--from-log", "{tmp}/f.db", "--cost", "clef"], 2, "--cost wants TIER=PRICE"),
    ],
)
def test_mistakes_are_one_line_without_a_traceback(
    tmp_path: Path,
    make: str | None,
    argv: list[str],
    status: int,
    says: str,
    capsys: pytest.CaptureFixture[str],
):
    if make == "text":
        (tmp_path / "f.db").write_text("these are my notes\n" * 20)
    elif make == "sqlite":
        sqlite3.connect(tmp_path / "f.db").execute("CREATE TABLE other (x)").connection.close()
    assert main(["usage", *(a.format(tmp=tmp_path) for a in argv)]) == status
    err = capsys.readouterr().err
    assert err.startswith("cascade usage: error: ") and says in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
