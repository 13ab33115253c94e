"""Each arm's counts from a real SQLite file and a real PostgreSQL database, its rows written
through the store's own record, shadow and label paths."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from cascade.rollout.arms import arm_counts
from cascade.rollout.verdict import ArmCounts
from cascade.store.postgres import PostgresStore
from cascade.store.sqlite import SqliteStore
from tests.rollout.rows import CANDIDATE, CURRENT, OLD_TS, SINCE, UNSEEN, write
from tests.servers import Postgres

EXPECTED = {
    CURRENT: ArmCounts(questions=4, strong=1, degraded=1, labelled=3, correct=2),
    CANDIDATE: ArmCounts(questions=3, strong=2, degraded=0, labelled=3, correct=2),
    UNSEEN: ArmCounts(),
}


def test_arm_counts_in_a_sqlite_file(tmp_path: Path):
    path = tmp_path / "decisions.db"
    store = SqliteStore(path)
    write(store)
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE decisions SET ts = ? WHERE request_id = 'old'", (OLD_TS,))
    assert arm_counts(str(path), [CURRENT, CANDIDATE, UNSEEN], SINCE) == EXPECTED
    assert arm_counts(str(path), [CURRENT], SINCE) == {CURRENT: EXPECTED[CURRENT]}
    assert arm_counts(str(path), [CURRENT], OLD_TS)[CURRENT].questions == 5  # the old row in
    assert arm_counts(str(path), [], SINCE) == {}


def test_arm_counts_in_postgres(postgres: Postgres, tmp_path: Path):
    url = postgres.database("arms")
    store = PostgresStore(url, spool=tmp_path / "spool", replica="r1")
    write(store)
    store.close()
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE decisions SET ts = %s WHERE request_id = 'old'", (OLD_TS,))
    assert arm_counts(url, [CURRENT, CANDIDATE, UNSEEN], SINCE) == EXPECTED
    assert arm_counts(url, [CURRENT], OLD_TS)[CURRENT].questions == 5


def test_a_missing_file_is_an_error(tmp_path: Path):
    with pytest.raises(Exception, match="unable to open"):
        arm_counts(str(tmp_path / "none.db"), [CURRENT], 0.0)
