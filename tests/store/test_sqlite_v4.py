"""Decision log schema 4: a request is its tenant's (labels and shadow answers find it by tenant
and request id), a label names who gave it, and a file of schema 3 is still read and is
migrated in place, its requests still labelled."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.policy.model import Checkpoints, ClefTier, LayaTier, Policy, Route, Shadow
from cascade.schema import NoulQuestion
from cascade.store.sqlite import SCHEMA_VERSION, SqliteStore, read_rows

# The layout of schema 3 (tenants, token shares, labels without who gave them), as it was
# written, with one labelled row of tenant acme.
SCHEMA_3 = """
CREATE TABLE decisions (
    id INTEGER PRIMARY KEY,
    request_id TEXT, ts REAL, model TEXT, policy_hash TEXT, checkpoints TEXT,
    question_id TEXT, type TEXT, band TEXT, question TEXT,
    state TEXT, state_mode TEXT, cheap TEXT, strong TEXT,
    final_tier TEXT, reason TEXT, degraded INTEGER, shadow INTEGER, latency_s REAL,
    tenant TEXT, cheap_tokens REAL, strong_tokens REAL
);
CREATE INDEX decisions_request_id ON decisions (request_id);
CREATE TABLE states (key TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE labels (
    decision INTEGER PRIMARY KEY, request_id TEXT, question_id TEXT, label TEXT NOT NULL,
    ts REAL, source TEXT, count INTEGER
);
INSERT INTO decisions VALUES (1, 'old', 1.5, 'jev-latest', 'p', '{}', 'u', 'noul', '2',
    '{"type":"noul","instructions":"Urgent?"}', NULL, 'none',
    '{"tier":"laya","checkpoint":"english","probabilities":[0.3,0.7]}', NULL, 'laya', NULL, 0, 0,
    0.01, 'acme', 2.0, NULL);
INSERT INTO labels VALUES (1, 'old', 'u', 'true', 2.5, 'feedback', 1);
PRAGMA user_version = 3;
"""


def _log(path: Path) -> SqliteStore:
    return SqliteStore(path)


def test_a_log_of_schema_3_is_read_and_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_3)
    conn.close()
    (row,) = read_rows(path)
    assert row.tenant == "acme" and row.label is not None
    assert (row.label.value, row.label.count, row.label.tenant) == (True, 1, "")
    log = _log(path)  # schema 4 migrates the file: its requests can still be labelled
    assert log.label("old", {"u": False}, tenant="beta").result(timeout=5).found is False
    done = log.label("old", {"u": False}, tenant="acme").result(timeout=5)
    log.close()
    assert done.found and done.relabelled == ["u"]
    (row,) = read_rows(path)
    assert row.label is not None
    assert (row.label.value, row.label.count, row.label.tenant) == (False, 2, "acme")
    assert not (tmp_path / "d.db.1").exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (8,)


def test_a_shadow_answer_lands_on_its_own_tenants_row(tmp_path: Path) -> None:
    """Two tenants send the same request id; both shadow answers arrive after both rows are
    written. Each fills in its own tenant's row (before: both the latest row, beta's)."""
    log = _log(tmp_path / "d.db")
    release = asyncio.Event()

    async def strong(call: EngineCall) -> EngineAnswer:
        await release.wait()
        return deterministic_answer(call)

    policy = Policy(
        tiers={
            "laya": LayaTier(checkpoints=Checkpoints(english="x")),
            "clef": ClefTier(release="x"),
        },
        route=Route(cheap="laya", strong="clef"),
        shadow=Shadow(fraction=1.0),
    )
    gateway = Gateway(
        policy, {"laya": FakeEngine("laya"), "clef": FakeEngine("clef", strong)}, decisions=log
    )
    call = EngineCall(
        state="ticket",
        model="jev-latest",
        request_id="ticket-1001",
        questions={"u": NoulQuestion(instructions="Urgent?")},
    )

    async def run() -> None:
        await gateway.start()
        for tenant in ("acme", "beta"):
            await gateway.decide(call, tenant=tenant)
        release.set()
        await gateway.shadows.settled()  # the shadow calls just released
        await gateway.aclose()

    asyncio.run(run())
    log.close()
    assert [(r.tenant, r.shadow) for r in read_rows(tmp_path / "d.db")] == [
        ("acme", True),
        ("beta", True),
    ]
