"""Schema 7 adds the ``audit`` table (``cascade.audit``): a schema-6 SQLite file or PostgreSQL
database is migrated in place, its rows still read; before that it reads as no records."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cascade.audit.log import read, write
from cascade.schema import AuditRecord
from cascade.store import postgres as pg
from cascade.store.sqlite import AUDIT, ROLLOUTS, SCHEMA, SCHEMA_VERSION, SqliteStore, read_rows
from tests.servers import Postgres
from tests.tracing.test_decision_log import OLD_COLUMNS, OLD_ROW

RECORD = AuditRecord(ts=5.0, action="freeze", actor="alice", outcome="applied", replica="r1")


def test_a_schema_6_file_gets_the_audit_table_in_place(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    with sqlite3.connect(path) as conn:  # as schema 6 wrote it
        conn.executescript(
            SCHEMA.replace(AUDIT, "")
            .replace(ROLLOUTS, "")
            .replace(f"user_version = {SCHEMA_VERSION}", "user_version = 6")
        )
        conn.execute(f"INSERT INTO decisions ({OLD_COLUMNS}) VALUES ({OLD_ROW})")
    assert read(str(path)) == []  # no audit table yet: no records, no error
    SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert not (tmp_path / "d.db.1").exists()  # migrated, not rotated aside
    assert [row.request_id for row in read_rows(path)] == ["old"]
    write(str(path), RECORD)
    assert read(str(path)) == [RECORD]


def test_a_schema_6_database_gets_the_audit_table(postgres: Postgres) -> None:
    url = postgres.database("audit_schema")
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:  # what schema 6 created
        conn.execute(pg.CREATE[: pg.CREATE.index("CREATE TABLE IF NOT EXISTS audit")])
        conn.execute("CREATE TABLE cascade_schema (version integer NOT NULL)")
        conn.execute("INSERT INTO cascade_schema VALUES (6)")
        conn.execute(f"INSERT INTO decisions (row_key, {OLD_COLUMNS}) VALUES ('k', {OLD_ROW})")
    assert read(url) == []
    assert pg.migrate(url) == (6, pg.SCHEMA_VERSION)
    assert [row.request_id for row in pg.read_rows(url)] == ["old"]
    write(url, RECORD)
    write(url, AuditRecord(ts=9.0, action="reload", actor="signal", outcome="refused"))
    assert read(url, since=6.0) == [
        AuditRecord(ts=9.0, action="reload", actor="signal", outcome="refused")
    ]
    assert [r.action for r in read(url, limit=1)] == ["reload"]
    assert [r.action for r in read(url)] == ["freeze", "reload"]
