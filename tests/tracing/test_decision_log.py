"""The decision log's rows name their request's trace (schema 6), in both backends; logs of
schema 5 are migrated in place (SQLite ``ALTER TABLE``, PostgreSQL ``ADD COLUMN IF NOT
EXISTS``), their rows read with no trace."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx

from cascade.store import postgres as pg
from cascade.store.sqlite import SCHEMA, SCHEMA_VERSION, SqliteStore, read_rows
from tests.servers import Postgres, serve_app
from tests.tracing.helpers import BODY, app, tracing_to
from tests.tracing.receiver import run_receiver

TRACE = "2af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE}-b7ad6b7169203331-01"
# one row as schema 5 wrote it (no trace_id)
OLD_COLUMNS = (
    "request_id, ts, model, policy_hash, checkpoints, question_id, type, band, "
    "question, state_mode, final_tier, degraded, shadow, latency_s, tenant"
)
OLD_ROW = (
    "'old', 1.0, 'jev-latest', 'p', '{}', 'u', 'noul', '2', "
    "'{\"type\":\"noul\",\"instructions\":\"Urgent?\"}', 'none', 'laya', 0, 0, 0.01, ''"
)


def _answer(url: str, rid: str, traced: bool = True) -> None:
    headers = {"x-request-id": rid} | ({"traceparent": PARENT} if traced else {})
    assert httpx.post(url + "/v1/systemone", json=BODY, headers=headers).status_code == 200


def _schema_5(path: Path) -> None:
    """A fresh file as schema 5 wrote it: no trace_id column."""
    with sqlite3.connect(path) as conn:
        conn.executescript(
            SCHEMA.replace(", trace_id TEXT", "").replace(
                f"user_version = {SCHEMA_VERSION}", "user_version = 5"
            )
        )
        conn.execute(f"INSERT INTO decisions ({OLD_COLUMNS}) VALUES ({OLD_ROW})")


def test_rows_carry_the_trace_id_and_a_schema_5_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "d.db"
    _schema_5(path)
    log = SqliteStore(path)
    try:
        with (
            run_receiver() as receiver,
            tracing_to(receiver.url),
            serve_app(app(decisions=log)) as url,
        ):
            _answer(url, "traced")
        with serve_app(app(decisions=log)) as url:
            _answer(url, "untraced")
    finally:
        log.close()
    ids = {(row.request_id, row.question_id): row.trace_id for row in read_rows(path)}
    assert ids == {
        ("old", "u"): "",
        ("traced", "urgent"): TRACE,
        ("traced", "unsure"): TRACE,
        ("untraced", "urgent"): "",
        ("untraced", "unsure"): "",
    }
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert not (tmp_path / "d.db.1").exists()  # migrated, not rotated aside


def test_postgres_rows_carry_the_trace_id_after_migrating_schema_5(
    postgres: Postgres, tmp_path: Path
) -> None:
    url = postgres.database("traces")
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:  # what schema 5 created
        conn.execute(
            "\n".join(
                line
                for line in pg.CREATE.replace(", trace_id text", "").splitlines()
                if not line.startswith("ALTER TABLE")
            )
        )
        conn.execute("CREATE TABLE cascade_schema (version integer NOT NULL)")
        conn.execute("INSERT INTO cascade_schema VALUES (5)")
        conn.execute(f"INSERT INTO decisions (row_key, {OLD_COLUMNS}) VALUES ('k', {OLD_ROW})")
    assert [row.trace_id for row in pg.read_rows(url)] == [""]  # read before migrating
    store = pg.PostgresStore(url, spool=tmp_path / "spool", replica="r1")
    try:
        with (
            run_receiver() as receiver,
            tracing_to(receiver.url),
            serve_app(app(decisions=store)) as url_,
        ):
            _answer(url_, "traced")
    finally:
        store.close()
    ids = {(row.request_id, row.question_id): row.trace_id for row in pg.read_rows(url)}
    assert ids == {("old", "u"): "", ("traced", "urgent"): TRACE, ("traced", "unsure"): TRACE}
    assert pg.migrate(url) == (pg.SCHEMA_VERSION, pg.SCHEMA_VERSION)
