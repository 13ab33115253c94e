"""The decision log: rows per answered question, shadow rows with both tiers, a full queue that
drops without slowing requests, rotation, a full disk the writer outlives, states stored once, and
a real gateway killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from cascade import metrics
from cascade.calls import EngineCall
from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http import status
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
from cascade.policy.routing import QuestionRoute
from cascade.schema import ChoiceQuestion, NoulQuestion
from cascade.store.rows import state_hash
from cascade.store.sqlite import SqliteStore, read_rows
from tests.servers import free_port, run_process
from tests.store.helpers import decided

BIN = Path(sys.executable).parent
NOUL = NoulQuestion(instructions="Urgent?")
WIDE = ChoiceQuestion(instructions="Which?", criteria=[f"o{i}" for i in range(60)])  # > 48: strong


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


def _call(rid: str, state: object = "ticket text", **questions: object) -> EngineCall:
    return EngineCall(
        state=state,
        model="jev-latest",
        request_id=rid,  # type: ignore[arg-type]
        questions=questions or {"u": NOUL},
    )  # type: ignore[arg-type]


def _log(path: Path, policy: Policy, **kw: object) -> SqliteStore:
    return SqliteStore(path, **kw)  # type: ignore[arg-type]


async def _serve(gateway: Gateway, calls: list[EngineCall]) -> list[float]:
    await gateway.start()
    took = []
    for call in calls:
        started = time.perf_counter()
        await gateway.systemone(call)
        took.append(time.perf_counter() - started)
    await asyncio.sleep(0.05)  # shadow tasks
    await gateway.aclose()
    return took


def test_rows_carry_routes_tiers_and_shadow_answers(tmp_path: Path):
    policy = _policy(shadow=1.0)
    gateway = Gateway(
        policy,
        {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")},
        weights={"laya": "h1", "clef": "h2"},
    )
    gateway.decisions = _log(tmp_path / "d.db", policy, state_mode="text")
    state = {"ticket": "charged twice", "n": 2}
    asyncio.run(_serve(gateway, [_call("r1", state, u=NOUL, w=WIDE)]))
    gateway.decisions.close()
    rows = {r.question_id: r for r in read_rows(tmp_path / "d.db")}
    assert set(rows) == {"u", "w"}
    u, w = rows["u"], rows["w"]
    assert (u.final_tier, u.reason, u.cheap.tier, u.cheap.checkpoint) == (
        "laya",
        None,
        "laya",
        "english",
    )
    assert (w.final_tier, w.reason, w.cheap, w.band) == ("clef", "too_many_options", None, "11+")
    assert w.strong is not None and len(w.strong.probabilities) == 60
    assert u.state == state and u.state_mode == "text" and u.question["type"] == "noul"
    assert u.checkpoints == {"laya": "h1", "clef": "h2"} and u.latency_s > 0
    # not cheap-final as a whole (w went strong): no shadow sample
    assert not u.shadow and u.strong is None


def test_a_shadow_sample_fills_in_the_strong_answer(tmp_path: Path):
    policy = _policy(shadow=1.0)
    gateway = Gateway(
        policy,
        {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")},
        weights={"laya": "h1", "clef": "h2"},
    )
    gateway.decisions = _log(tmp_path / "d.db", policy)
    asyncio.run(_serve(gateway, [_call("r1", "state one"), _call("r2", "state two")]))
    gateway.decisions.close()
    rows = list(read_rows(tmp_path / "d.db"))
    assert [(r.request_id, r.shadow, r.final_tier) for r in rows] == [
        ("r1", True, "laya"),
        ("r2", True, "laya"),
    ]
    assert all(r.cheap is not None and r.strong is not None for r in rows)
    assert rows[0].state == state_hash("state one") and rows[0].state_mode == "hash"


def test_escalated_rows_carry_both_tiers_and_state_none_stores_nothing(tmp_path: Path):
    policy = _policy(noul_floor=0.999)
    gateway = Gateway(
        policy,
        {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")},
        weights={"laya": "h1", "clef": "h2"},
    )
    gateway.decisions = _log(tmp_path / "d.db", policy, state_mode="none")
    asyncio.run(_serve(gateway, [_call("r1")]))
    gateway.decisions.close()
    (row,) = read_rows(tmp_path / "d.db")
    assert (row.final_tier, row.reason, row.shadow, row.state) == (
        "clef",
        "low_confidence",
        False,
        None,
    )
    assert row.cheap is not None and row.strong is not None


@pytest.mark.slow
def test_a_full_queue_drops_and_counts_and_never_slows_a_request(tmp_path: Path):
    policy = _policy()
    release = threading.Event()
    log = _log(tmp_path / "d.db", policy, queue_size=2)
    write = log._write

    def stalled(batch):  # the disk is stuck: the writer thread blocks
        release.wait(10)
        write(batch)

    log._write = stalled  # type: ignore[method-assign]
    engines = {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")}
    calls = [_call(f"r{i}") for i in range(200)]
    dropped_before = metrics.DECISION_LOG_ROWS.labels(outcome="dropped")._value.get()
    baseline = asyncio.run(_serve(Gateway(policy, engines), calls))
    gateway = Gateway(policy, engines)
    gateway.decisions = log
    logged = asyncio.run(_serve(gateway, calls))
    release.set()
    log.close()
    assert log.dropped >= 190
    dropped = metrics.DECISION_LOG_ROWS.labels(outcome="dropped")._value.get() - dropped_before
    assert dropped == log.dropped  # one question per request
    assert len(list(read_rows(tmp_path / "d.db"))) == 200 - log.dropped
    # never blocked: each request as fast as without a log (medians; generous for a noisy CI)
    assert sorted(logged)[100] < sorted(baseline)[100] * 3 + 0.001
    assert max(logged) < 0.5


def test_the_file_rotates_past_its_size_cap(tmp_path: Path):
    policy = _policy()
    log = _log(tmp_path / "d.db", policy, state_mode="text", max_bytes=64 * 1024, keep=2)
    big = "x" * 2000  # each state distinct: equal states are stored once
    for i in range(150):
        done = log.queue_record(
            _call(f"r{i}", f"{i} {big}"), decided({"u": QuestionRoute("laya")}), 0.001
        )
        if i % 10 == 9:  # the writer commits in batches of 10 at most, however busy the machine
            assert done is not None
            done.result(timeout=10)
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm")))
    assert files == ["d.db", "d.db.1", "d.db.2"]
    ids = [r.request_id for f in ("d.db.2", "d.db.1", "d.db") for r in read_rows(tmp_path / f)]
    assert ids == sorted(ids, key=lambda r: int(r[1:])) and ids[-1] == "r149"
    assert len(ids) < 150  # the oldest file was dropped
    assert os.path.getsize(tmp_path / "d.db.1") < 2 * 64 * 1024


def test_read_rows_names_a_missing_file(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no decision log"):
        list(read_rows(tmp_path / "nope.db"))


def test_a_gateway_killed_with_sigkill_keeps_a_row_per_answered_question(tmp_path: Path):
    port = free_port()
    db = tmp_path / "decisions.db"
    env = {**os.environ, "CASCADE_DEMO_DIR": str(tmp_path / "demo")}
    cmd = [
        str(BIN / "cascade"),
        "serve",
        "--demo",
        "--decision-log",
        str(db),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    url = f"http://127.0.0.1:{port}"
    body = {
        "model": "jev-latest",
        "questions": {
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"billing": "Payments", "tech": "Bugs", "sales": "Sales"},
            },
        },
    }
    answered: list[str] = []
    with run_process(cmd, ready_url=url + "/health", env=env, timeout_s=240) as proc:
        deadline = time.monotonic() + 240
        while httpx.get(url + "/ready").status_code != 200:
            assert time.monotonic() < deadline, "the demo gateway never became ready"
            time.sleep(0.2)
        with httpx.Client(base_url=url, timeout=60) as client:
            for i in range(30):
                rid = f"req-{i}"
                response = client.post(
                    "/v1/systemone",
                    json={**body, "state": f"ticket {i}"},
                    headers={"x-request-id": rid},
                )
                assert response.status_code == 200, response.text
                answered.append(rid)
            health = client.get("/health").json()["decision_log"]
            assert health["alive"] and not health["failing"] and health["errors"] == 0
            assert health["written"] >= 2 and health["last_error"] is None
        proc.send_signal(signal.SIGKILL)  # at once: no chance to flush or close
        proc.wait(10)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
    rows = {(r.request_id, r.question_id) for r in read_rows(db)}
    assert rows >= {(rid, q) for rid in answered for q in ("urgent", "team")}


class _Disk:
    """A disk that fills on demand: its connections refuse writes (``write``) and checkpoints
    (``checkpoint``) with SQLite's own full-disk error while those faults are on."""

    def __init__(self) -> None:
        self.faults: set[str] = set()

    def connection(self) -> type[sqlite3.Connection]:
        disk = self

        class Connection(sqlite3.Connection):
            def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
                disk.check(sql)
                return super().execute(sql, *args)  # type: ignore[arg-type]

            def executemany(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
                disk.check(sql)
                return super().executemany(sql, *args)  # type: ignore[arg-type]

        return Connection

    def check(self, sql: str) -> None:
        verb = sql.split()[0].upper()
        if ("checkpoint" in self.faults and "wal_checkpoint" in sql) or (
            "write" in self.faults and verb in {"INSERT", "UPDATE", "COMMIT"}
        ):
            raise sqlite3.OperationalError("database or disk is full")


def test_a_full_disk_during_rotation_never_stops_the_writer(tmp_path: Path, monkeypatch):
    disk = _Disk()
    connect = sqlite3.connect
    monkeypatch.setattr(
        sqlite3, "connect", lambda *a, **kw: connect(*a, **kw, factory=disk.connection())
    )
    policy = _policy()
    log = _log(tmp_path / "d.db", policy, state_mode="text", max_bytes=1, keep=3)  # rotate always
    gateway = Gateway(
        policy,
        {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")},
        weights={"laya": "h1", "clef": "h2"},
    )
    gateway.decisions = log
    errors = {
        stage: metrics.DECISION_LOG_ERRORS.labels(stage=stage)._value.get()
        for stage in ("write", "rotate")
    }
    n = 0

    def send(k: int) -> None:
        nonlocal n
        for _ in range(k):
            n += 1
            done = log.queue_record(_call(f"r{n}"), decided({"u": QuestionRoute("laya")}), 0.001)
            assert done is not None
            done.result(timeout=5)  # the writer finished with it (a dead one never does)

    disk.faults = {"checkpoint"}  # the rows commit, the checkpoint of each rotation fails
    send(3)
    health = status.health(gateway)["decision_log"]
    assert health["alive"] and health["failing"] and health["written"] == 3
    assert health["last_error"] == "rotate: database or disk is full"
    assert metrics.DECISION_LOG_ERRORS.labels(stage="rotate")._value.get() - errors["rotate"] == 3
    disk.faults = {"checkpoint", "write"}  # nothing fits any more
    send(2)
    health = log.health()
    assert (health["alive"], health["written"], health["failed"]) == (True, 3, 2)
    assert health["last_error"] == "write: database or disk is full"
    assert metrics.DECISION_LOG_ERRORS.labels(stage="write")._value.get() - errors["write"] == 2
    disk.faults = set()  # space freed: writing and rotating resume
    send(2)
    health = log.health()
    assert (health["alive"], health["failing"], health["written"]) == (True, False, 5)
    log.close()
    # r4 and r5 failed; r6 rotated r1-r3 and itself to d.db.1 (now .2), r7 rotated alone
    ids = [[r.request_id for r in read_rows(tmp_path / f)] for f in ("d.db.2", "d.db.1", "d.db")]
    assert ids == [["r1", "r2", "r3", "r6"], ["r7"], []]


def test_a_text_state_is_stored_once_per_request(tmp_path: Path):
    """A 0.3 MB state asked 64 questions: stored once (before: once per row, 38.7 MB)."""
    log = _log(tmp_path / "d.db", _policy(), state_mode="text")
    state = {"ticket": "charged twice " * 21_500}
    questions = {f"q{i}": NoulQuestion(instructions=f"Urgent {i}?") for i in range(64)}
    routes = {q: QuestionRoute("laya") for q in questions}
    done = log.queue_record(_call("r1", state, **questions), decided(routes), 0.01)
    assert done is not None
    done.result(timeout=10)
    stored = sum(p.stat().st_size for p in tmp_path.iterdir())
    log.close()
    assert stored < 2 * len(state["ticket"])
    conn = sqlite3.connect(tmp_path / "d.db")
    assert conn.execute("SELECT count(*) FROM states").fetchone() == (1,)
    conn.close()
    rows = list(read_rows(tmp_path / "d.db"))
    assert [r.question_id for r in rows] == list(questions)
    assert all(r.state == state and r.state_mode == "text" for r in rows)


def test_a_log_of_the_schema_before_states_is_read_and_rotated_aside(tmp_path: Path):
    log = _log(tmp_path / "d.db", _policy(), state_mode="text")
    done = log.queue_record(
        _call("old", {"t": "a state"}), decided({"u": QuestionRoute("laya")}), 0.01
    )
    assert done is not None
    done.result(timeout=5)
    log.close()
    conn = sqlite3.connect(tmp_path / "d.db")  # as written before: the state text in each row
    conn.executescript(
        "UPDATE decisions SET state = (SELECT state FROM states WHERE key = "
        "decisions.state); DROP TABLE states; PRAGMA user_version = 0;"
    )
    conn.close()
    assert [r.state for r in read_rows(tmp_path / "d.db")] == [{"t": "a state"}]
    log = _log(tmp_path / "d.db", _policy(), state_mode="text")  # set aside, not mixed
    done = log.queue_record(_call("new", {"t": "b"}), decided({"u": QuestionRoute("laya")}), 0.01)
    assert done is not None
    done.result(timeout=5)
    log.close()
    assert [(r.request_id, r.state) for r in read_rows(tmp_path / "d.db.1")] == [
        ("old", {"t": "a state"})
    ]
    assert [(r.request_id, r.state) for r in read_rows(tmp_path / "d.db")] == [("new", {"t": "b"})]
