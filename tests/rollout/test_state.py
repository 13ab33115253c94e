"""A rollout's state in both stores: joined by a second replica and after a restart, decided by
exactly one of two deciders, final once decided; schema-7 stores migrated in place."""

from __future__ import annotations

import concurrent.futures
import functools
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from cascade.audit.log import read
from cascade.rollout.state import RolloutFinished, RolloutStatus, latest, open_rollout, update
from cascade.store import postgres as pg
from cascade.store.sqlite import ROLLOUTS, SCHEMA, SCHEMA_VERSION, SqliteStore, read_rows
from tests.servers import Postgres
from tests.tracing.test_decision_log import OLD_COLUMNS, OLD_ROW

CUR, CAND = "a" * 64, "b" * 64


@pytest.fixture(params=["sqlite", "postgres"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, Callable[[], None]]]:
    """A set-up store's target and how to boot a store on it again (a restart)."""
    if request.param == "sqlite":
        path = str(tmp_path / "decisions.db")

        def boot() -> None:
            SqliteStore(path).close()

        boot()
        yield path, boot
    else:
        url = request.getfixturevalue("postgres").database("rollouts")

        def migrate() -> None:
            pg.migrate(url)

        migrate()
        yield url, migrate


def _open(target: str, replica: str, now: float, share: float = 0.05):
    return open_rollout(target, CUR, CAND, share, actor="auto", replica=replica, now=now)


def test_a_second_replica_and_a_restart_join_the_running_rollout(store):
    target, restart = store
    assert latest(target, CUR, CAND) is None
    first = _open(target, "r1", now=100.0)
    assert (first.status, first.started, first.share, first.looks) == ("running", 100.0, 0.05, 0)
    assert (first.actor, first.replica, first.decided, first.reason) == ("auto", "r1", None, "")
    assert _open(target, "r2", now=130.0, share=0.5) == first  # joined: same row, same start
    restart()
    assert _open(target, "r1", now=160.0) == first
    assert latest(target, CUR, CAND) == first
    other = open_rollout(target, CUR, "c" * 64, 0.1, actor="alice", replica="r1", now=170.0)
    assert other.id != first.id and latest(target, CUR, "c" * 64) == other


def test_a_final_status_is_final_and_a_new_rollout_may_follow(store):
    target, _ = store
    first = _open(target, "r1", now=100.0)
    stepped = update(target, first.id, share=0.25, looks=3, now=130.0)
    assert (stepped.share, stepped.looks, stepped.status, stepped.decided) == (
        0.25,
        3,
        "running",
        None,
    )
    done = update(
        target, first.id, status="rolled_back", reason="strong share", actor="auto", now=150.0
    )
    assert (done.status, done.decided, done.reason, done.started) == (
        "rolled_back",
        150.0,
        "strong share",
        100.0,
    )
    with pytest.raises(RolloutFinished):
        update(target, first.id, status="promoted", actor="alice", now=160.0)
    with pytest.raises(RolloutFinished):
        update(target, first.id, looks=4, now=160.0)
    with pytest.raises(RolloutFinished):
        update(target, 999, looks=1, now=160.0)
    assert latest(target, CUR, CAND) == done
    again = _open(target, "r1", now=200.0)
    assert again.id != first.id and again.started == 200.0
    assert latest(target, CUR, CAND) == again
    with pytest.raises(ValueError, match="status 'done'"):
        update(target, again.id, status="done", now=210.0)  # type: ignore[arg-type]


def _decide(target: str, rollout_id: int, start: threading.Barrier, status: RolloutStatus) -> str:
    start.wait()
    try:
        update(target, rollout_id, status=status, actor=status, now=1.0)
    except RolloutFinished:
        return "lost"
    return "won"


def test_two_deciders_at_once_one_wins(store):
    target, _ = store
    for n in range(5):
        rollout = _open(target, "r1", now=100.0 + n)
        decide = functools.partial(_decide, target, rollout.id, threading.Barrier(2))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(decide, ["promoted", "aborted"]))
        assert sorted(results) == ["lost", "won"]
        final = latest(target, CUR, CAND)
        assert final is not None and final.id == rollout.id
        winner = ["promoted", "aborted"][results.index("won")]
        assert (final.status, final.actor) == (winner, winner)


def test_replicas_opening_at_once_share_one_row(store):
    target, _ = store
    start = threading.Barrier(6)

    def join(n: int) -> int:
        start.wait()
        return _open(target, f"r{n}", now=100.0 + n).id

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        assert len(set(pool.map(join, range(6)))) == 1


def test_a_missing_file_is_not_created(tmp_path: Path):
    with pytest.raises(sqlite3.OperationalError):
        latest(str(tmp_path / "none.db"), CUR, CAND)
    assert not (tmp_path / "none.db").exists()


def test_a_schema_7_file_gets_the_rollouts_table_in_place(tmp_path: Path):
    path = tmp_path / "d.db"
    with sqlite3.connect(path) as conn:  # as schema 7 wrote it
        conn.executescript(
            SCHEMA.replace(ROLLOUTS, "").replace(
                f"user_version = {SCHEMA_VERSION}", "user_version = 7"
            )
        )
        conn.execute(f"INSERT INTO decisions ({OLD_COLUMNS}) VALUES ({OLD_ROW})")
    with pytest.raises(sqlite3.OperationalError, match="no such table: rollouts"):
        latest(str(path), CUR, CAND)
    SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (8,)
    assert not (tmp_path / "d.db.1").exists()  # migrated, not rotated aside
    assert [row.request_id for row in read_rows(path)] == ["old"]
    assert read(str(path)) == []  # the audit table still there
    assert _open(str(path), "r1", now=1.0).status == "running"


def test_a_schema_7_database_gets_the_rollouts_table(postgres: Postgres):
    url = postgres.database("rollouts_schema")
    with psycopg.connect(url, autocommit=True) as conn:  # what schema 7 created
        conn.execute(pg.CREATE[: pg.CREATE.index("CREATE TABLE IF NOT EXISTS rollouts")])
        conn.execute("CREATE TABLE cascade_schema (version integer NOT NULL)")
        conn.execute("INSERT INTO cascade_schema VALUES (7)")
        conn.execute(f"INSERT INTO decisions (row_key, {OLD_COLUMNS}) VALUES ('k', {OLD_ROW})")
    assert pg.migrate(url) == (7, 8)
    assert [row.request_id for row in pg.read_rows(url)] == ["old"]
    assert _open(url, "r1", now=1.0).status == "running"
    assert pg.migrate(url) == (8, 8)
