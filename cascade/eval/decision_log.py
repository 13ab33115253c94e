"""The decision log: one SQLite row per answered question, written off the event loop.

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
              final_tier TEXT, reason TEXT, degraded INTEGER, shadow INTEGER, latency_s REAL)
    states(key TEXT PRIMARY KEY,  -- sha256 hex of the stored JSON text
           state TEXT)            -- the state as JSON, once per distinct state (not per row)

Schema versions (``PRAGMA user_version``): 0, files written before the ``states`` table, kept the
state text in every row (``read_rows`` reads them as they are); ``SCHEMA_VERSION`` is the layout
above. The writer never mixes layouts in one file: it rotates a file of another version aside
when it opens it.

``shadow = 1``: the strong answer came from shadow sampling (a random sample of cheap-final
requests; the client got the cheap answer). It is filled in by an UPDATE of the request's rows
(the latest rows with that request id) when the shadow answer arrives; a shadow call that
fails or is skipped leaves ``shadow = 0`` and ``strong`` NULL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall
from cascade.questions import n_options, option_band

log = logging.getLogger(__name__)

StateMode = Literal["text", "hash", "none"]

SCHEMA_VERSION = 2
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY,
    request_id TEXT, ts REAL, model TEXT, policy_hash TEXT, checkpoints TEXT,
    question_id TEXT, type TEXT, band TEXT, question TEXT,
    state TEXT, state_mode TEXT, cheap TEXT, strong TEXT,
    final_tier TEXT, reason TEXT, degraded INTEGER, shadow INTEGER, latency_s REAL
);
CREATE INDEX IF NOT EXISTS decisions_request_id ON decisions (request_id);
CREATE TABLE IF NOT EXISTS states (key TEXT PRIMARY KEY, state TEXT NOT NULL);
PRAGMA user_version = {SCHEMA_VERSION};
"""
COLUMNS = (
    "request_id", "ts", "model", "policy_hash", "checkpoints", "question_id", "type", "band",
    "question", "state", "state_mode", "cheap", "strong", "final_tier", "reason", "degraded",
    "shadow", "latency_s",
)
INSERT = f"INSERT INTO decisions ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
INSERT_STATE = "INSERT OR IGNORE INTO states (key, state) VALUES (?, ?)"
SHADOW_UPDATE = (
    "UPDATE decisions SET strong = ?, shadow = 1 WHERE id = (SELECT max(id) FROM decisions "
    "WHERE request_id = ? AND question_id = ?)"
)
MAX_BATCH = 1024  # queue items per transaction
COMMIT_WAIT_S = 0.25  # the longest a response waits for its rows' commit


class CheapEntry(msgspec.Struct, kw_only=True):
    tier: str
    checkpoint: str | None
    probabilities: list[float]


class StrongEntry(msgspec.Struct, kw_only=True):
    tier: str
    probabilities: list[float]


class LogRow(msgspec.Struct, kw_only=True):
    """One ``decisions`` row with its JSON columns decoded (``degraded``/``shadow`` as bools)."""

    id: int
    request_id: str
    ts: float
    model: str
    policy_hash: str
    checkpoints: dict[str, str]
    question_id: str
    type: str
    band: str
    question: dict[str, Any]  # the wire question (msgspec.convert(..., Question) to type it)
    state: Any  # state_mode text: the state (one object per request); hash: sha256 hex of its
    # canonical JSON; none: None
    state_mode: StateMode
    cheap: CheapEntry | None
    strong: StrongEntry | None
    final_tier: str
    reason: str | None
    degraded: bool
    shadow: bool
    latency_s: float


def state_hash(state: Any) -> str:
    """sha256 hex of the state's canonical JSON (sorted keys, no whitespace)."""
    return hashlib.sha256(msgspec.json.encode(state, order="sorted")).hexdigest()


def read_rows(path: str | Path) -> Iterator[LogRow]:
    """Every row of one log file, oldest first. Rotated files (``FILE.1`` ...) are read by
    passing their own paths. Safe while a gateway is writing (WAL readers see committed rows)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no decision log there")
    conn = sqlite3.connect(path)
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise ValueError(f"{path}: decision log schema {version} is newer than this cascade "
                             f"reads ({SCHEMA_VERSION})")
        cursor = conn.execute(f"SELECT id, {', '.join(COLUMNS)} FROM decisions ORDER BY id")
        names = ["id", *COLUMNS]
        text: tuple[str | None, Any] = (None, None)  # the last state read, shared by its rows
        for values in cursor:
            raw = dict(zip(names, values, strict=True))
            for key in ("checkpoints", "question", "cheap", "strong"):
                if raw[key] is not None:
                    raw[key] = msgspec.json.decode(raw[key])
            if raw["state_mode"] == "text" and raw["state"] is not None:
                if text[0] != raw["state"]:
                    text = (raw["state"], _stored_state(conn, version, raw["state"]))
                raw["state"] = text[1]
            raw["degraded"], raw["shadow"] = bool(raw["degraded"]), bool(raw["shadow"])
            yield msgspec.convert(raw, LogRow)
    finally:
        conn.close()


def _stored_state(conn: sqlite3.Connection, version: int, column: str) -> Any:
    """The state a text row's ``state`` column names: its JSON (version 0) or its key."""
    if version == 0:
        return msgspec.json.decode(column)
    found = conn.execute("SELECT state FROM states WHERE key = ?", (column,)).fetchone()
    return None if found is None else msgspec.json.decode(found[0])


class DecisionLog:
    """The writer: ``record``/``shadowed`` from the event loop (non-blocking), one thread writes.

    ``cheap``/``strong``: the policy's tier names; ``checkpoints``: {tier: content hash};
    ``queue_size``: requests waiting to be written before new ones are dropped.
    """

    def __init__(
        self, path: str | Path, *, cheap: str | None, strong: str | None, policy_hash: str,
        checkpoints: Mapping[str, str], state_mode: StateMode = "hash",
        max_bytes: int = 1 << 30, keep: int = 3, queue_size: int = 10_000,
    ) -> None:
        self.path = Path(path)
        self.cheap, self.strong = cheap, strong
        self.policy_hash = policy_hash
        self._checkpoints = msgspec.json.encode(dict(checkpoints)).decode()
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

    async def record(
        self, call: EngineCall, routes: Mapping[str, Any], answers: Mapping[str, EngineAnswer],
        degraded: Mapping[str, str], checkpoint: str | None, latency_s: float,
    ) -> None:
        """Queue the rows of one answered request (``routes``: question id -> QuestionRoute)
        and wait, at most ``COMMIT_WAIT_S`` and never for a lagging writer, for their commit."""
        done = self.queue_record(call, routes, answers, degraded, checkpoint, latency_s)
        if done is None or self.lagging:
            return
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(done)), COMMIT_WAIT_S)
        except TimeoutError:
            self.lagging = True

    def queue_record(
        self, call: EngineCall, routes: Mapping[str, Any], answers: Mapping[str, EngineAnswer],
        degraded: Mapping[str, str], checkpoint: str | None, latency_s: float,
    ) -> concurrent.futures.Future[None] | None:
        """``record`` without the wait: the future resolves once the rows are committed (or
        failed); None when the queue was full and the rows were dropped."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        item = ("record", call, dict(routes), dict(answers), set(degraded), checkpoint,
                latency_s, time.time(), done)
        return done if self._put(item) else None

    def shadowed(self, call: EngineCall, strong: EngineAnswer) -> None:
        """Queue the strong tier's shadow answer for a request already recorded."""
        self._put(("shadow", call, strong))

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
            "alive": self._thread.is_alive(), "failing": self.failing, "lagging": self.lagging,
            "written": self.written, "failed": self.failed, "dropped_requests": self.dropped,
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
        """Connect; a fresh file gets the schema, a file of another schema version is rotated
        aside (one file, one layout). Writes nothing to a file already set up, so reopening
        works on a full disk."""
        conn = self._connect()
        try:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            (tables,) = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            if tables and version != SCHEMA_VERSION:
                log.info("decision log: %s has schema %d, not %d; rotating it aside",
                         self.path, version, SCHEMA_VERSION)
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
            if self._queue.empty():
                self.lagging = False
        if self._conn is not None:
            self._conn.close()

    def _write(self, batch: list[tuple[Any, ...]]) -> bool:
        """One transaction for the batch; True when it committed. Any failure (``Exception``:
        the thread must outlive whatever the disk or a row throws) is counted, never raised."""
        rows = sum(len(item[1].questions) for item in batch if item[0] == "record")
        conn = self._conn
        try:
            if conn is None:  # a failed rotation or reopen left none
                conn = self._conn = self._open()
            conn.execute("BEGIN")
            for item in batch:
                if item[0] == "record":
                    records, state = self._rows(*item[1:-1])
                    if state is not None:
                        conn.execute(INSERT_STATE, state)
                    conn.executemany(INSERT, records)
                else:
                    conn.executemany(SHADOW_UPDATE, self._shadow_rows(*item[1:]))
            conn.execute("COMMIT")
        except Exception as exc:
            self._failed("write", exc, f"{len(batch)} requests not written")
            self.failed += rows
            metrics.DECISION_LOG_ROWS.labels(outcome="failed").inc(rows)
            self._roll_back()
            return False
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

    def _rows(self, call: EngineCall, routes: dict[str, Any], answers: dict[str, EngineAnswer],
              degraded: set[str], checkpoint: str | None, latency_s: float,
              ts: float) -> tuple[list[tuple[Any, ...]], tuple[str, str] | None]:
        """The request's rows, and in text mode its ``states`` row (key, JSON): the state is
        stored once per request, each row names it by key."""
        stored = state = None
        if self.state_mode == "text":
            text = _json(call.state)
            state = hashlib.sha256(text.encode()).hexdigest()
            stored = (state, text)
        elif self.state_mode == "hash":
            state = state_hash(call.state)
        cheap = answers.get(self.cheap or "")
        strong = answers.get(self.strong or "")
        rows = []
        for qid, question in call.questions.items():
            route = routes[qid]
            cheap_json = strong_json = None
            if cheap is not None and qid in cheap.results:
                cheap_json = _json(CheapEntry(tier=self.cheap or "", probabilities=cheap.results[
                    qid].probabilities, checkpoint=checkpoint or cheap.model))
            if strong is not None and qid in strong.results:
                strong_json = _json(StrongEntry(tier=self.strong or "",
                                                probabilities=strong.results[qid].probabilities))
            rows.append((
                call.request_id, ts, call.model, self.policy_hash, self._checkpoints, qid,
                question.type, option_band(n_options(question)), _json(question), state,
                self.state_mode, cheap_json, strong_json, route.tier, route.reason,
                int(qid in degraded), 0, latency_s,
            ))
        return rows, stored

    def _shadow_rows(self, call: EngineCall, strong: EngineAnswer) -> list[tuple[Any, ...]]:
        return [
            (_json(StrongEntry(tier=self.strong or "", probabilities=result.probabilities)),
             call.request_id, qid)
            for qid, result in strong.results.items()
        ]

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


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()
