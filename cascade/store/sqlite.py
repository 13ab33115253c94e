"""The decision store in a SQLite file: one row per answered question, written off the event loop.

Off by default (``cascade serve --decision-log FILE`` or ``[decision_log]`` in a policy). The
gateway awaits ``record`` once per answered request, before its response is sent, and calls
``shadowed`` when a shadow answer of the strong tier arrives. Both put a small tuple on a
bounded queue (``put_nowait``): a full queue drops the request's rows and counts them
(``cascade_decision_log_rows_total{outcome="dropped"}``). One writer thread owns the connection:
it serializes rows (state hashing included), inserts them and commits each drained batch at
once. ``record`` then waits for that commit, at most ``COMMIT_WAIT_S``, so a response is sent
after its rows are on disk and a ``kill -9`` right after it loses none. A writer that misses
that bound is marked lagging and nobody waits for it until its queue is empty again: a stuck
disk costs one request ``COMMIT_WAIT_S`` at most, then rows are queued (or dropped) without
slowing anything, and commit as soon as the writer moves.

Crash safety: WAL journal with ``synchronous=NORMAL``. A commit is in the WAL file when it
returns, so after ``kill -9`` every committed row is readable and ``pragma integrity_check``
passes (only an OS crash or power loss can lose the last commits). Size cap: when the database
passes ``max_bytes`` it is checkpointed, closed and renamed ``FILE.1`` (older files shift to
``FILE.2`` ... ``FILE.<keep>``; the oldest is deleted) and a fresh ``FILE`` starts.

Failures never stop the writer: a batch that cannot be written (a full disk, a file that cannot
be reopened, anything) is rolled back and its rows counted ``failed`` (not retried: the queue
stays bounded), a rotation that fails (its checkpoint on a full disk) is retried after the next
batch, a closed connection is reopened before it; each failure counts in
``cascade_decision_log_errors_total{stage}`` and shows in ``health()`` (``/health``), and rows
are written again as soon as the disk takes them.

The tables (agreed with ``cascade distill --from-log``; read them through ``read_rows`` only)::

    decisions(id INTEGER PRIMARY KEY, request_id TEXT, ts REAL, model TEXT, policy_hash TEXT,
              checkpoints TEXT,  -- JSON {tier name: content hash}
              question_id TEXT, type TEXT, band TEXT,
              question TEXT,     -- JSON of the wire question
              state TEXT, state_mode TEXT,  -- text: key into states; hash: sha256 hex; none
              cheap TEXT,        -- JSON {"tier", "checkpoint", "probabilities"} or NULL
              strong TEXT,       -- JSON {"tier", "probabilities"} or NULL
              final_tier TEXT, reason TEXT, degraded INTEGER, shadow INTEGER, latency_s REAL,
              tenant TEXT,       -- the authenticated key's tenant name ("": none)
              cheap_tokens REAL, strong_tokens REAL,  -- this row's share of the tier's input
                                 -- tokens (the call's, split evenly over its questions)
              calibration_hash TEXT, tenant_policy_hash TEXT,  -- the version that decided it
              replica TEXT,      -- the gateway that answered (hostname or CASCADE_REPLICA)
              trace_id TEXT)     -- its request's OpenTelemetry trace id (NULL: tracing off)
    states(key TEXT PRIMARY KEY,  -- sha256 hex of the stored JSON text
           state TEXT)            -- the state as JSON, once per distinct state (not per row)
    labels(decision INTEGER PRIMARY KEY,  -- decisions.id of the labelled row
           request_id TEXT, question_id TEXT,
           label TEXT,            -- JSON: the choice key, true/false (noul), the level (score)
           ts REAL, source TEXT,  -- when it was given (the latest), by what ("feedback")
           count INTEGER,         -- how many times it was given: the latest label wins
           tenant TEXT)           -- who gave the latest (the key's tenant name; "": none)
    audit(id INTEGER PRIMARY KEY, ts REAL, action TEXT, actor TEXT, outcome TEXT,
          replica TEXT, record TEXT)  -- cascade.audit: the whole record as JSON, append-only
    rollouts(id INTEGER PRIMARY KEY, current_hash TEXT, candidate_hash TEXT,  -- policy hashes
             started REAL, share REAL,  -- when it began; the candidate's share now
             status TEXT,        -- running, promoted, rolled_back or aborted (final)
             decided REAL, reason TEXT, actor TEXT,  -- when, why and by whom it ended
             looks INTEGER, replica TEXT)  -- cascade.rollout.state: one running row per pair

Every row is stamped by the version that decided it, carried on the request's decision
(``cascade.policy.stamp``): the policy's and calibration's hashes, the tier names (in
``cheap``/``strong``) and weights (``checkpoints``), the tenant and its own policy's hash.

Schema versions (``PRAGMA user_version``): 0, files written before the ``states`` table, kept
the state text in every row; 2 added ``states``; 3 rows' tenants, token shares and ``labels``; 4
``labels.tenant``; 5 the stamp's calibration hash, tenant policy hash and replica; 6 the
request's trace id; 7 the ``audit`` table; ``SCHEMA_VERSION`` (8) is the layout above (the
``rollouts`` table).
``read_rows`` reads every one of them (an older file's rows have no tenant, no token shares, no
labels and no stamp beyond the policy hash; a label of schema 3 has tenant ""). The writer never
mixes layouts in one file: it migrates a file of schema 3 to 7 in place (``ALTER TABLE``s: old
rows keep NULL there, labels of schema 3 keep tenant "") and rotates a file of any other version
aside when it opens it (labels then go to requests of the new file only).

A request is known by its tenant and its id: two tenants' requests with the same id never meet.
``label`` (``POST /v1/feedback``) goes through the writer's queue, behind the rows queued before
it, so a request answered before its feedback is always found. It labels the latest row of each
question with that tenant and request id (as shadow answers do); a question labelled again keeps
the latest label and counts the times. Another tenant's request is not found, exactly as an id
never seen (one query, the same for both).

``shadow = 1``: the strong answer came from shadow sampling (a random sample of cheap-final
requests; the client got the cheap answer). It is filled in by an UPDATE of the request's rows
(the latest rows with that tenant and request id) when the shadow answer arrives; a shadow call
that fails or is skipped leaves ``shadow = 0`` and ``strong`` NULL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from cascade import metrics
from cascade.control.labels import LabelOutcome
from cascade.store.labelling import store_labels
from cascade.store.rows import (
    COLUMNS,
    LogRow,
    NotADecisionLog,
    StateMode,
    decode_row,
    request_rows,
    shadow_rows,
    to_json,
)

if TYPE_CHECKING:
    from cascade.calls import EngineAnswer, EngineCall
    from cascade.policy.flow import Decision
    from cascade.policy.stamp import Stamp

log = logging.getLogger(__name__)

SCHEMA_VERSION = 8
AUDIT = """CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY, ts REAL NOT NULL, action TEXT NOT NULL, actor TEXT NOT NULL,
    outcome TEXT NOT NULL, replica TEXT, record TEXT NOT NULL
);"""
# One row per rollout (cascade.rollout.state); at most one running per (current, candidate).
ROLLOUTS = """CREATE TABLE IF NOT EXISTS rollouts (
    id INTEGER PRIMARY KEY, current_hash TEXT NOT NULL, candidate_hash TEXT NOT NULL,
    started REAL NOT NULL, share REAL NOT NULL, status TEXT NOT NULL, decided REAL,
    reason TEXT NOT NULL DEFAULT '', actor TEXT NOT NULL, looks INTEGER NOT NULL DEFAULT 0,
    replica TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS rollouts_running ON rollouts (current_hash, candidate_hash)
    WHERE status = 'running';"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY,
    request_id TEXT, ts REAL, model TEXT, policy_hash TEXT, checkpoints TEXT,
    question_id TEXT, type TEXT, band TEXT, question TEXT,
    state TEXT, state_mode TEXT, cheap TEXT, strong TEXT,
    final_tier TEXT, reason TEXT, degraded INTEGER, shadow INTEGER, latency_s REAL,
    tenant TEXT, cheap_tokens REAL, strong_tokens REAL,
    calibration_hash TEXT, tenant_policy_hash TEXT, replica TEXT, trace_id TEXT
);
CREATE INDEX IF NOT EXISTS decisions_request_id ON decisions (request_id);
CREATE TABLE IF NOT EXISTS states (key TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS labels (
    decision INTEGER PRIMARY KEY, request_id TEXT, question_id TEXT, label TEXT NOT NULL,
    ts REAL, source TEXT, count INTEGER, tenant TEXT NOT NULL DEFAULT ''
);
{AUDIT}
{ROLLOUTS}
PRAGMA user_version = {SCHEMA_VERSION};
"""
# Files of schema 3 to 7 become files of schema 8 in place, by version: labels of schema 3 were
# given by no one named; rows before 5 have no stamp beyond the policy hash, before 6 no trace,
# before 7 there is no audit table, before 8 no rollouts table.
MIGRATE = {
    3: "ALTER TABLE labels ADD COLUMN tenant TEXT NOT NULL DEFAULT '';",
    4: "ALTER TABLE decisions ADD COLUMN calibration_hash TEXT;\n"
    "ALTER TABLE decisions ADD COLUMN tenant_policy_hash TEXT;\n"
    "ALTER TABLE decisions ADD COLUMN replica TEXT;",
    5: "ALTER TABLE decisions ADD COLUMN trace_id TEXT;",
    6: AUDIT,
    7: ROLLOUTS,
}
# What a file of an older version has in place of the columns it lacks (by the first version
# that has them).
ADDED = {
    "tenant": (3, "''"),
    "cheap_tokens": (3, "NULL"),
    "strong_tokens": (3, "NULL"),
    "calibration_hash": (5, "NULL"),
    "tenant_policy_hash": (5, "NULL"),
    "replica": (5, "NULL"),
    "trace_id": (6, "NULL"),
}
INSERT = f"INSERT INTO decisions ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
INSERT_STATE = "INSERT OR IGNORE INTO states (key, state) VALUES (?, ?)"
SHADOW_UPDATE = (
    "UPDATE decisions SET strong = ?, strong_tokens = ?, shadow = 1 WHERE id = (SELECT max(id) "
    "FROM decisions WHERE request_id = ? AND tenant = ? AND question_id = ?)"
)
UPSERT_LABEL = (
    "INSERT INTO labels (decision, request_id, question_id, label, ts, source, count, tenant) "
    "VALUES (?, ?, ?, ?, ?, ?, 1, ?) ON CONFLICT (decision) DO UPDATE SET "
    "label = excluded.label, ts = excluded.ts, source = excluded.source, count = count + 1, "
    "tenant = excluded.tenant"
)
MAX_BATCH = 1024  # queue items per transaction
COMMIT_WAIT_S = 0.25  # the longest a response waits for its rows' commit


def read_rows(
    path: str | Path, *, since: float | None = None, tenant: str | None = None
) -> Iterator[LogRow]:
    """Every row of one log file, oldest first (``since``: from that unix time on; ``tenant``:
    that tenant's only; both in SQL), streamed. Rotated files (``FILE.1`` ...) are read by
    passing their own paths. Safe while a gateway is writing (WAL readers see committed rows)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no decision log there")
    conn = sqlite3.connect(path)
    try:
        version = log_version(conn, path)
        where, params = _where(version, since, tenant)
        try:
            cursor = conn.execute(f"{_select(version)} {where} ORDER BY d.id", params)
        except sqlite3.DatabaseError as exc:
            raise NotADecisionLog(f"{path}: not a decision log ({exc})") from exc
        decode = _RowDecoder(conn, version)
        for values in cursor:
            yield decode(values)
    finally:
        conn.close()


def write_audit(
    path: str | Path, ts: float, action: str, actor: str, outcome: str, replica: str, record: str
) -> None:
    """Append one audit record (``cascade.audit``) on a connection of its own; raises on any
    failure (the caller counts it)."""
    conn = sqlite3.connect(path, timeout=5.0)
    try:
        with conn:
            conn.execute(
                "INSERT INTO audit (ts, action, actor, outcome, replica, record) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (ts, action, actor, outcome, replica, record),
            )
    finally:
        conn.close()


def read_audit(path: str | Path, since: float, limit: int) -> list[str]:
    """The newest ``limit`` audit records (JSON) at or after ``since``, oldest first; none in a
    file older than schema 7."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no decision log there")
    conn = sqlite3.connect(path)
    try:
        if log_version(conn, path) < 7:
            return []
        found = conn.execute(
            "SELECT record FROM audit WHERE ts >= ? ORDER BY id DESC LIMIT ?", (since, limit)
        ).fetchall()
    finally:
        conn.close()
    return [record for (record,) in reversed(found)]


def log_version(conn: sqlite3.Connection, path: str | Path) -> int:
    """The schema version of an open decision log; ``NotADecisionLog`` when it is none."""
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        (tables,) = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'decisions'"
        ).fetchone()
    except sqlite3.DatabaseError as exc:  # not SQLite at all
        raise NotADecisionLog(f"{path}: not a decision log ({exc})") from exc
    if not tables:
        raise NotADecisionLog(f"{path}: not a decision log (no decisions table)")
    if version > SCHEMA_VERSION:
        raise NotADecisionLog(
            f"{path}: decision log schema {version} is newer than this "
            f"cascade reads ({SCHEMA_VERSION})"
        )
    return int(version)


def _where(version: int, since: float | None, tenant: str | None) -> tuple[str, tuple[Any, ...]]:
    """The filters as a WHERE clause and its parameters (a file before tenants: tenant "")."""
    found: list[str] = []
    params: list[Any] = []
    if since is not None:
        found.append("d.ts >= ?")
        params.append(since)
    if tenant is not None:
        found.append("coalesce(d.tenant, '') = ?" if version >= 3 else "'' = ?")
        params.append(tenant)
    return ("WHERE " + " AND ".join(found) if found else ""), tuple(params)


def _select(version: int) -> str:
    """The rows of a file of ``version``, each with its label (if the version has labels)."""
    columns = [
        f"d.{name}" if ADDED.get(name, (0, ""))[0] <= version else f"{ADDED[name][1]} AS {name}"
        for name in COLUMNS
    ]
    if version >= 3:
        labeller = "l.tenant" if version >= 4 else "''"
        return (
            f"SELECT d.id, {', '.join(columns)}, l.label, l.ts, l.source, l.count, "
            f"{labeller} FROM decisions d LEFT JOIN labels l ON l.decision = d.id"
        )
    return f"SELECT d.id, {', '.join(columns)}, NULL, NULL, NULL, NULL, NULL FROM decisions d"


class _RowDecoder:
    """``LogRow``s from ``_select``'s tuples; a text state is looked up once for its rows."""

    names = ("id", *COLUMNS)

    def __init__(self, conn: sqlite3.Connection, version: int) -> None:
        self.conn, self.version = conn, version
        self.text: tuple[str | None, Any] = (None, None)  # the last state read

    def __call__(self, values: Sequence[Any]) -> LogRow:
        raw = dict(zip(self.names, values[: len(self.names)], strict=True))
        if raw["state_mode"] == "text" and raw["state"] is not None:
            if self.text[0] != raw["state"]:
                self.text = (raw["state"], _stored_state(self.conn, self.version, raw["state"]))
            raw["state"] = self.text[1]
        return decode_row(raw, tuple(values[len(self.names) :]))


def _stored_state(conn: sqlite3.Connection, version: int, column: str) -> Any:
    """The state a text row's ``state`` column names: its JSON (version 0) or its key."""
    if version == 0:
        return msgspec.json.decode(column)
    found = conn.execute("SELECT state FROM states WHERE key = ?", (column,)).fetchone()
    return None if found is None else msgspec.json.decode(found[0])


class SqliteStore:
    """The writer: ``record``/``shadowed`` from the event loop (non-blocking), one thread writes.

    ``replica``: this gateway's name in its rows; ``queue_size``: requests waiting to be
    written before new ones are dropped.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        state_mode: StateMode = "hash",
        replica: str = "",
        max_bytes: int = 1 << 30,
        keep: int = 3,
        queue_size: int = 10_000,
    ) -> None:
        self.path = Path(path)
        self.replica = replica
        self.state_mode: StateMode = state_mode
        self.max_bytes, self.keep = max_bytes, max(1, keep)
        self.dropped = 0
        self.written = self.failed = self.errors = 0  # rows, rows, failures of any stage
        self.last_error: tuple[float, str] | None = None  # (unix time, "stage: message")
        self.failing = False  # the last write or rotation failed and nothing succeeded since
        self.lagging = False  # the writer missed COMMIT_WAIT_S and has not caught up since
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=queue_size)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn: sqlite3.Connection | None = self._open()  # a bad path fails at boot
        self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the request path

    async def record(self, call: EngineCall, decision: Decision, latency_s: float) -> None:
        """Queue the rows of one answered request and wait, at most ``COMMIT_WAIT_S`` and never
        for a lagging writer, for their commit."""
        done = self.queue_record(call, decision, latency_s)
        if done is None or self.lagging:
            return
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(done)), COMMIT_WAIT_S)
        except TimeoutError:
            self.lagging = True

    def queue_record(
        self, call: EngineCall, decision: Decision, latency_s: float
    ) -> concurrent.futures.Future[None] | None:
        """``record`` without the wait: the future resolves once the rows are committed (or
        failed); None when the queue was full and the rows were dropped."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        item = ("record", call, decision, latency_s, time.time(), done)
        return done if self._put(item) else None

    def label(
        self,
        request_id: str,
        labels: Mapping[str, Any],
        *,
        source: str = "feedback",
        tenant: str = "",
    ) -> concurrent.futures.Future[LabelOutcome] | None:
        """Queue ``tenant``'s labels for the latest rows of its request ``request_id`` (question
        id -> label, the shapes of ``cascade eval`` data). The future resolves once they are
        committed, to what was found and stored (nothing when a label does not fit, or the
        tenant has no request of that id), or fails with the write's error; None when the
        queue is full."""
        done: concurrent.futures.Future[LabelOutcome] = concurrent.futures.Future()
        item = ("label", request_id, dict(labels), source, tenant, time.time(), done)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return None
        return done

    def shadowed(self, call: EngineCall, strong: EngineAnswer, stamp: Stamp) -> None:
        """Queue the strong tier's shadow answer for the stamped request already recorded."""
        self._put(("shadow", call, strong, stamp))

    def _put(self, item: tuple[Any, ...]) -> bool:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            metrics.DECISION_LOG_ROWS.labels(outcome="dropped").inc(len(item[1].questions))
            return False
        return True

    def health(self) -> dict[str, Any]:
        """The writer's state for ``/health``: alive, failing (the last attempt failed), counts
        of rows (written, failed), of requests dropped and of failures, and the last failure."""
        return {
            "alive": self._thread.is_alive(),
            "failing": self.failing,
            "lagging": self.lagging,
            "written": self.written,
            "failed": self.failed,
            "dropped_requests": self.dropped,
            "errors": self.errors,
            "last_error": None if self.last_error is None else self.last_error[1],
            "last_error_at": None if self.last_error is None else self.last_error[0],
        }

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop the thread and close the file (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)

    # ------------------------------------------------------------ the writer thread

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _open(self) -> sqlite3.Connection:
        """Connect; a fresh file gets the schema, a file of schema 3 is migrated, a file of
        another schema version is rotated aside (one file, one layout). Writes nothing to a file
        already set up, so reopening works on a full disk."""
        conn = self._connect()
        try:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            (tables,) = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            if tables and version in MIGRATE:
                log.info(
                    "decision log: %s has schema %d; migrating it to %d",
                    self.path,
                    version,
                    SCHEMA_VERSION,
                )
                steps = "\n".join(MIGRATE[v] for v in range(version, SCHEMA_VERSION))
                conn.executescript(
                    f"BEGIN;\n{steps}\nPRAGMA user_version = {SCHEMA_VERSION};\nCOMMIT;"
                )
            elif tables and version != SCHEMA_VERSION:
                log.info(
                    "decision log: %s has schema %d, not %d; rotating it aside",
                    self.path,
                    version,
                    SCHEMA_VERSION,
                )
                if not self._set_aside(conn):
                    raise sqlite3.OperationalError(f"{self.path}: a reader holds it open")
                conn = self._connect()
                tables = 0
            if not tables:
                conn.executescript(SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            items = [item for item in batch if item is not None]
            try:
                if items and self._write(items):
                    self._rotate_if_full()
            finally:  # committed, or failed and counted: nobody waits any longer
                for item in items:
                    if item[0] == "record":
                        item[-1].set_result(None)
                    elif item[0] == "label" and not item[-1].done():  # _write raised
                        item[-1].set_exception(sqlite3.OperationalError("labels not written"))
            if self._queue.empty():
                self.lagging = False
        if self._conn is not None:
            self._conn.close()

    def _write(self, batch: list[tuple[Any, ...]]) -> bool:
        """One transaction for the batch; True when it committed. Any failure (``Exception``:
        the thread must outlive whatever the disk or a row throws) is counted, never raised."""
        rows = sum(len(item[1].questions) for item in batch if item[0] == "record")
        conn = self._conn
        labelled: list[tuple[concurrent.futures.Future[LabelOutcome], LabelOutcome]] = []
        try:
            if conn is None:  # a failed rotation or reopen left none
                conn = self._conn = self._open()
            conn.execute("BEGIN IMMEDIATE")  # the write lock first: waits out other writers
            for item in batch:
                if item[0] == "record":
                    _, call, decision, latency_s, ts, _ = item
                    records, state = request_rows(
                        call, decision, latency_s, ts, self.state_mode, self.replica
                    )
                    if state is not None:
                        conn.execute(INSERT_STATE, state)
                    conn.executemany(INSERT, records)
                elif item[0] == "label":
                    labelled.append((item[-1], _store_labels(conn, *item[1:-1])))
                else:
                    conn.executemany(SHADOW_UPDATE, shadow_rows(*item[1:]))
            conn.execute("COMMIT")
        except Exception as exc:
            self._failed("write", exc, f"{len(batch)} requests not written")
            self.failed += rows
            metrics.DECISION_LOG_ROWS.labels(outcome="failed").inc(rows)
            self._roll_back()
            for item in batch:
                if item[0] == "label":
                    item[-1].set_exception(exc)
            return False
        for done, outcome in labelled:
            done.set_result(outcome)
        self.written += rows
        self.failing = False
        metrics.DECISION_LOG_ROWS.labels(outcome="written").inc(rows)
        return True

    def _roll_back(self) -> None:
        """End a failed transaction; a connection that cannot is dropped (reopened next batch)."""
        try:
            if self._conn is not None and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            self._drop()

    def _failed(self, stage: str, exc: BaseException, what: str) -> None:
        self.errors += 1
        self.failing = True
        self.last_error = (time.time(), f"{stage}: {exc}")
        metrics.DECISION_LOG_ERRORS.labels(stage=stage).inc()
        log.warning("decision log: %s failed (%s): %s", stage, what, exc)

    def _rotate_if_full(self) -> None:
        """Rotate past ``max_bytes``. A failure (a checkpoint on a full disk) is counted and the
        connection closed; the next batch reopens ``FILE`` and the rotation is tried again."""
        try:
            assert self._conn is not None  # a batch just committed on it
            (pages,) = self._conn.execute("PRAGMA page_count").fetchone()
            (size,) = self._conn.execute("PRAGMA page_size").fetchone()
            if pages * size >= self.max_bytes and self._set_aside(self._conn):
                self._conn = None
                self._conn = self._open()
                log.info("decision log: %s passed %d bytes; rotated", self.path, self.max_bytes)
        except Exception as exc:
            self._failed("rotate", exc, f"{self.path} not rotated")
            self._drop()

    def _set_aside(self, conn: sqlite3.Connection) -> bool:
        """Checkpoint and close ``conn``, then shift ``FILE`` to ``FILE.1`` (and older files on).
        False, ``conn`` left open, while a reader blocks the checkpoint: renaming then would
        leave rows in the WAL behind."""
        (busy, _, _) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            return False
        conn.close()
        for n in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        for suffix in ("-wal", "-shm"):
            self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
        return True

    def _drop(self) -> None:
        """Close the connection, whatever state it is in; the next batch opens a fresh one."""
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error as exc:
                log.warning("decision log: closing %s: %s", self.path, exc)
            self._conn = None


def _store_labels(
    conn: sqlite3.Connection,
    request_id: str,
    labels: dict[str, Any],
    source: str,
    tenant: str,
    ts: float,
) -> LabelOutcome:
    """Label the latest row of each question of ``tenant``'s request ``request_id`` (inside
    the writer's transaction; ``store_labels``). Nothing of another tenant's request is read:
    it is not found, as an id never seen."""
    latest = (
        "WHERE d.id IN (SELECT max(id) FROM decisions WHERE request_id = ? AND tenant = ? "
        "GROUP BY question_id) ORDER BY d.id"
    )
    decode = _RowDecoder(conn, SCHEMA_VERSION)
    rows = {
        row.question_id: row
        for row in map(
            decode, conn.execute(f"{_select(SCHEMA_VERSION)} {latest}", (request_id, tenant))
        )
    }
    return store_labels(
        rows,
        labels,
        lambda row, value: conn.execute(
            UPSERT_LABEL, (row.id, request_id, row.question_id, to_json(value), ts, source, tenant)
        ),
    )
