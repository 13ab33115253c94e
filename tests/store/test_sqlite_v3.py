"""Decision log schema 3: each row's tenant and its share of each tier's input tokens, labels
read back with their rows, files of older schemas still read, and the rows judged as evidence
(feedback labels and shadow answers) for the live refit."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from cascade.calls import EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.eval.labelled import read_labelled
from cascade.gateway import Gateway
from cascade.policy.model import (
    Bands,
    Checkpoints,
    ClefTier,
    LayaTier,
    Policy,
    Route,
    Shadow,
    Thresholds,
    TypeBands,
)
from cascade.schema import ChoiceQuestion, NoulQuestion
from cascade.store.sqlite import NotADecisionLog, SqliteStore, read_rows

NOUL = NoulQuestion(instructions="Urgent?")
TEAM = ChoiceQuestion(instructions="Which team?", criteria=["billing", "tech", "sales"])
# The layout of schema 2 (before tenants, token shares and labels), as it was written.
SCHEMA_2 = """
CREATE TABLE decisions (
    id INTEGER PRIMARY KEY,
    request_id TEXT, ts REAL, model TEXT, policy_hash TEXT, checkpoints TEXT,
    question_id TEXT, type TEXT, band TEXT, question TEXT,
    state TEXT, state_mode TEXT, cheap TEXT, strong TEXT,
    final_tier TEXT, reason TEXT, degraded INTEGER, shadow INTEGER, latency_s REAL
);
CREATE TABLE states (key TEXT PRIMARY KEY, state TEXT NOT NULL);
INSERT INTO decisions VALUES (1, 'old', 1.5, 'jev-latest', 'p', '{}', 'u', 'noul', '2',
    '{"type":"noul","instructions":"Urgent?"}', NULL, 'none',
    '{"tier":"laya","checkpoint":"english","probabilities":[0.3,0.7]}', NULL, 'laya', NULL, 0, 0,
    0.01);
PRAGMA user_version = 2;
"""


def _policy(*, shadow: float = 0.0, noul_floor: float | None = None) -> Policy:
    return Policy(
        tiers={
            "laya": LayaTier(checkpoints=Checkpoints(english="x")),
            "clef": ClefTier(release="x"),
        },
        route=Route(cheap="laya", strong="clef"),
        thresholds=Thresholds(confidence=TypeBands(noul=Bands(two=noul_floor))),
        shadow=Shadow(fraction=shadow),
    )


def _log(path: Path) -> SqliteStore:
    return SqliteStore(path)


def _call(rid: str, state: str = "ticket text", **questions: object) -> EngineCall:
    return EngineCall(
        state=state, model="jev-latest", request_id=rid, questions=questions or {"u": NOUL}
    )  # type: ignore[arg-type]


def _serve(policy: Policy, log: SqliteStore, *steps: object) -> None:
    gateway = Gateway(
        policy, {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")}, decisions=log
    )

    async def run() -> None:
        await gateway.start()
        for step in steps:
            await step(gateway)  # type: ignore[operator]
        await asyncio.sleep(0.05)  # shadow tasks
        await gateway.aclose()

    asyncio.run(run())
    log.close()


def test_rows_carry_the_tenant_and_each_tiers_share_of_its_tokens(tmp_path: Path):
    log = _log(tmp_path / "d.db")
    call = _call("r1", u=NOUL, t=TEAM)
    batch = [_call(f"b/{i}", f"state {i}") for i in range(2)]
    _serve(
        _policy(noul_floor=0.999),
        log,  # u escalates, t stays cheap
        lambda g: g.systemone(call, tenant="acme"),
        lambda g: g.batch(batch, tenant="zeta"),
        lambda g: g.decide(_call("anon"), partial=True),
    )
    rows = {(r.request_id, r.question_id): r for r in read_rows(tmp_path / "d.db")}
    u, t = rows[("r1", "u")], rows[("r1", "t")]
    assert (u.tenant, t.tenant) == ("acme", "acme")
    cheap_tokens = deterministic_answer(call).usage.input_tokens  # the cheap tier read both
    strong_tokens = deterministic_answer(_call("r1", u=NOUL)).usage.input_tokens  # u alone
    assert u.cheap_tokens == t.cheap_tokens == pytest.approx(cheap_tokens / 2)
    assert (u.strong_tokens, t.strong_tokens) == (pytest.approx(strong_tokens), None)
    assert [rows[(f"b/{i}", "u")].tenant for i in range(2)] == ["zeta", "zeta"]
    assert rows[("anon", "u")].tenant == ""


def test_a_shadow_answer_fills_in_its_token_share(tmp_path: Path):
    log = _log(tmp_path / "d.db")
    call = _call("r1", u=NOUL, t=TEAM)
    _serve(_policy(shadow=1.0), log, lambda g: g.systemone(call))
    rows = list(read_rows(tmp_path / "d.db"))
    tokens = deterministic_answer(call).usage.input_tokens
    assert all(r.shadow and r.strong_tokens == pytest.approx(tokens / 2) for r in rows)


def test_labels_and_shadow_rows_are_evidence_as_the_gate_reads_them(tmp_path: Path):
    log = _log(tmp_path / "d.db")
    call = _call("r1", u=NOUL, t=TEAM)
    _serve(_policy(shadow=1.0), log, lambda g: g.systemone(call))
    cheap = deterministic_answer(call).results
    top = ["billing", "tech", "sales"][
        cheap["t"].probabilities.index(max(cheap["t"].probabilities))
    ]
    log = _log(tmp_path / "d.db")
    done = log.label("r1", {"t": top})
    assert done is not None and done.result(timeout=5).relabelled == []
    log.close()
    policy = _policy()
    found = read_labelled([tmp_path / "d.db"], policy)
    by = {(e.source, e.type): e for e in found}
    assert set(by) == {("feedback", "choice"), ("shadow", "choice"), ("shadow", "noul")}
    assert by[("feedback", "choice")].correct is True
    assert by[("feedback", "choice")].confidence == pytest.approx(max(cheap["t"].probabilities))
    assert by[("shadow", "noul")].band == "2" and by[("feedback", "choice")].band == "3-5"
    assert read_labelled([tmp_path / "d.db"], policy, sources=("feedback",)) == [
        by[("feedback", "choice")]
    ]


def test_labels_the_latest_rows_of_a_repeated_request_id(tmp_path: Path):
    log = _log(tmp_path / "d.db")
    _serve(
        _policy(),
        log,
        lambda g: g.systemone(_call("r1", "first")),
        lambda g: g.systemone(_call("r1", "second")),
    )
    log = _log(tmp_path / "d.db")
    done = log.label("r1", {"u": True})
    assert done is not None
    outcome = done.result(timeout=5)
    log.close()
    assert outcome.found and [x.label for x in outcome.labelled] == [True]
    assert [r.label is not None for r in read_rows(tmp_path / "d.db")] == [False, True]


def test_a_log_of_schema_2_is_read_and_a_new_writer_sets_it_aside(tmp_path: Path):
    path = tmp_path / "d.db"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_2)
    conn.close()
    (row,) = read_rows(path)
    assert (row.request_id, row.tenant, row.cheap_tokens, row.strong_tokens, row.label) == (
        "old",
        "",
        None,
        None,
        None,
    )
    assert row.cheap is not None and row.cheap.probabilities == [0.3, 0.7]
    log = _log(path)  # schema 3 starts a file of its own; labels reach its requests only
    done = log.label("old", {"u": True})
    assert done is not None and done.result(timeout=5).found is False
    log.close()
    assert [r.request_id for r in read_rows(tmp_path / "d.db.1")] == ["old"]


@pytest.mark.parametrize("content", [b"not a database at all, just text\n" * 8, b""])
def test_a_file_that_is_no_decision_log_says_so(tmp_path: Path, content: bytes):
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    with pytest.raises(NotADecisionLog, match="notes.db: not a decision log"):
        list(read_rows(path))
