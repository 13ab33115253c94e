"""A rollout's state in the decision store (its ``rollouts`` table, schema 8): what every
replica of a fleet, and a restarted gateway, reads and decides on.

One row per rollout of a (current, candidate) pair of policy hashes. A unique index over the
running rows of a pair makes ``open_rollout`` join the running one (same ``started``) instead
of opening a second; ``update`` is one conditional ``UPDATE ... WHERE status = 'running'``, so of
two replicas deciding at once exactly one wins and the other gets ``RolloutFinished``. A status
other than running is final. Blocking: callers run these in a thread. The store must be set up
(a gateway's store migrates it at boot; ``cascade store migrate URL``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import quote

import msgspec

from cascade.settings import is_database_url

RolloutStatus = Literal["running", "promoted", "rolled_back", "aborted"]
STATUSES: tuple[str, ...] = get_args(RolloutStatus)


class RolloutState(msgspec.Struct, frozen=True, kw_only=True):
    """A ``rollouts`` row: the pair, when it started and its current share; how it ended (when,
    why, by whom: an admin's name or ``auto``); how many looks the guards took; the replica
    that opened it."""

    id: int
    current_hash: str
    candidate_hash: str
    started: float
    share: float
    status: RolloutStatus = "running"
    decided: float | None = None
    reason: str = ""
    actor: str = ""
    looks: int = 0
    replica: str = ""


class RolloutFinished(ValueError):
    """The rollout is no longer running (or there is none of that id): its status is final."""


FIELDS = tuple(RolloutState.__struct_fields__)
COLUMNS = ", ".join(FIELDS)


def open_rollout(
    target: str,
    current_hash: str,
    candidate_hash: str,
    share: float,
    *,
    actor: str,
    replica: str,
    now: float,
) -> RolloutState:
    """The running rollout of (current, candidate): the one already there (a restart or another
    replica joins it), else a new one started ``now``."""
    with _connect(target) as (conn, p):
        conn.execute(
            f"INSERT INTO rollouts (current_hash, candidate_hash, started, share, status, "
            f"reason, actor, looks, replica) VALUES ({p}, {p}, {p}, {p}, 'running', '', {p}, 0, "
            f"{p}) ON CONFLICT DO NOTHING",
            (current_hash, candidate_hash, now, share, actor, replica),
        )
        found = conn.execute(
            f"SELECT {COLUMNS} FROM rollouts WHERE current_hash = {p} AND candidate_hash = {p} "
            "AND status = 'running'",
            (current_hash, candidate_hash),
        ).fetchone()
    assert found is not None  # inserted, or the running row it conflicted with
    return _state(found)


def latest(target: str, current_hash: str, candidate_hash: str) -> RolloutState | None:
    """The newest rollout of (current, candidate), whatever its status; None: there was none."""
    with _connect(target) as (conn, p):
        found = conn.execute(
            f"SELECT {COLUMNS} FROM rollouts WHERE current_hash = {p} AND candidate_hash = {p} "
            "ORDER BY id DESC LIMIT 1",
            (current_hash, candidate_hash),
        ).fetchone()
    return None if found is None else _state(found)


def update(
    target: str,
    rollout_id: int,
    *,
    status: RolloutStatus | None = None,
    share: float | None = None,
    looks: int | None = None,
    reason: str | None = None,
    actor: str | None = None,
    now: float,
) -> RolloutState:
    """Change a running rollout (a final ``status`` also sets ``decided = now``); raises
    ``RolloutFinished`` when it is not running any more: another decider got there first."""
    if status is not None and status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    changes: dict[str, Any] = {
        name: value
        for name, value in (
            ("status", status),
            ("share", share),
            ("looks", looks),
            ("reason", reason),
            ("actor", actor),
        )
        if value is not None
    }
    if status is not None and status != "running":
        changes["decided"] = now
    with _connect(target) as (conn, p):
        sets = ", ".join(f"{name} = {p}" for name in changes) or "looks = looks"
        found = conn.execute(
            f"UPDATE rollouts SET {sets} WHERE id = {p} AND status = 'running' RETURNING {COLUMNS}",
            (*changes.values(), rollout_id),
        ).fetchall()
    if not found:
        raise RolloutFinished(f"rollout {rollout_id} is not running: its status is final")
    return _state(found[0])


def _state(values: Sequence[Any]) -> RolloutState:
    return msgspec.convert(dict(zip(FIELDS, values, strict=True)), RolloutState)


def open_file(path: str, mode: Literal["ro", "rw"]) -> sqlite3.Connection:
    """A connection to the SQLite store at ``path`` (never creates it: a missing file raises
    ``sqlite3.OperationalError``)."""
    uri = f"file:{quote(str(Path(path).resolve()))}?mode={mode}"
    return sqlite3.connect(uri, uri=True, timeout=5.0)


@contextmanager
def _connect(target: str) -> Iterator[tuple[Any, str]]:
    """One transaction on the store at ``target`` and its placeholder (committed on success)."""
    if is_database_url(target):
        from cascade.store import postgres

        with postgres.connect(target) as pg, pg.transaction():
            yield pg, "%s"
        return
    lite = open_file(target, "rw")
    try:
        with lite:
            yield lite, "?"
    finally:
        lite.close()
