"""The decision store in PostgreSQL: one database for every replica of a fleet (psycopg 3).

The logical schema is the SQLite file's (``cascade.store.sqlite``, ``COLUMNS``), plus each
row's ``row_key`` (unique: this process's boot id, the request's number, the question) that
makes every write idempotent. ``migrate`` creates or upgrades it under
``pg_advisory_xact_lock``, so replicas booting at once (or ``cascade store migrate URL``)
serialize; ``cascade_schema.version`` is the schema version, as ``user_version`` is SQLite's.

Writes: ``record`` puts the request on a bounded queue (full: dropped and counted, as SQLite's)
and waits, at most ``DURABLE_WAIT_S``, until its rows are durable. One writer thread takes what
is queued as one batch, writes it in one transaction (``ON CONFLICT (row_key) DO NOTHING``:
pipelined inserts, or from ``COPY_ROWS`` rows on a COPY into a staging table and one
``INSERT ... SELECT``) and, when the database fails or is unreachable, appends the batch to
the local spool instead (``cascade.store.spool``: fsynced, size-capped; past the cap, or when
its disk is full, the rows are dropped and counted). Either way the batch is durable and its
requests are answered. While the spool holds batches every new batch goes behind them, and the
writer replays them in order every ``RETRY_S`` until the database takes them all; a replayed
row is written once whatever happens (its key). ``health`` says reachable or not and how far
behind.

Labels (``POST /v1/feedback``) are read and written at once, from a small pool, on a thread:
the request's rows were durable before its response, so a label finds them from any replica.
While the database is unreachable the future fails (the route answers 503, Retry-After).

Retention: ``keep_days`` deletes rows (their labels with them) and states older than that,
once an hour, from the writer thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade import metrics
from cascade.settings import env_value
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
from cascade.store.spool import Spool

if TYPE_CHECKING:
    import psycopg

    from cascade.calls import EngineAnswer, EngineCall
    from cascade.control.labels import LabelOutcome
    from cascade.policy.flow import Decision
    from cascade.policy.stamp import Stamp

log = logging.getLogger(__name__)

SCHEMA_VERSION = 8  # the SQLite file's layout this database holds (``cascade.store.sqlite``)
LOCK = 0x63617363_64656373  # pg_advisory_xact_lock's key: "cascdecs"
CREATE = """
CREATE TABLE IF NOT EXISTS decisions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, row_key text NOT NULL UNIQUE,
    request_id text NOT NULL, ts double precision NOT NULL, model text, policy_hash text,
    checkpoints text, question_id text NOT NULL, type text, band text, question text,
    state text, state_mode text, cheap text, strong text, final_tier text, reason text,
    degraded smallint, shadow smallint, latency_s double precision,
    tenant text NOT NULL DEFAULT '', cheap_tokens double precision,
    strong_tokens double precision, calibration_hash text, tenant_policy_hash text,
    replica text, trace_id text
);
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS trace_id text;  -- schema 5 -> 6
CREATE INDEX IF NOT EXISTS decisions_request ON decisions (tenant, request_id, question_id);
CREATE INDEX IF NOT EXISTS decisions_ts ON decisions (ts);
CREATE TABLE IF NOT EXISTS states (
    key text PRIMARY KEY, state text NOT NULL, ts double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS labels (
    decision bigint PRIMARY KEY REFERENCES decisions (id) ON DELETE CASCADE,
    request_id text, question_id text, label text NOT NULL, ts double precision,
    source text, count integer, tenant text NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS audit (  -- schema 6 -> 7 (cascade.audit)
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, ts double precision NOT NULL,
    action text NOT NULL, actor text NOT NULL, outcome text NOT NULL, replica text,
    record text NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (  -- schema 7 -> 8 (cascade.rollout.state)
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, current_hash text NOT NULL,
    candidate_hash text NOT NULL, started double precision NOT NULL,
    share double precision NOT NULL, status text NOT NULL, decided double precision,
    reason text NOT NULL DEFAULT '', actor text NOT NULL, looks integer NOT NULL DEFAULT 0,
    replica text NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS rollouts_running ON rollouts (current_hash, candidate_hash)
    WHERE status = 'running';
"""
INSERT = (
    f"INSERT INTO decisions (row_key, {', '.join(COLUMNS)}) VALUES "
    f"({', '.join(['%s'] * (len(COLUMNS) + 1))}) ON CONFLICT (row_key) DO NOTHING"
)
# A big batch's rows are copied into a per-connection staging table (COPY: no per-row
# statement), then moved in their order, each row once by its key.
STAGED = ", ".join(("row_key", *COLUMNS))
STAGE = (
    f"CREATE TEMP TABLE IF NOT EXISTS decisions_stage ON COMMIT DELETE ROWS AS "
    f"SELECT 0::bigint AS n, {STAGED} FROM decisions WITH NO DATA"
)
COPY = f"COPY decisions_stage (n, {STAGED}) FROM STDIN"
MOVE = (
    f"INSERT INTO decisions ({STAGED}) SELECT {STAGED} FROM decisions_stage ORDER BY n "
    "ON CONFLICT (row_key) DO NOTHING"
)
INSERT_STATE = (
    "INSERT INTO states (key, state, ts) VALUES (%s, %s, %s) ON CONFLICT (key) "
    "DO UPDATE SET ts = greatest(states.ts, excluded.ts)"
)
SHADOW_UPDATE = (
    "UPDATE decisions SET strong = %s, strong_tokens = %s, shadow = 1 WHERE id = (SELECT max(id) "
    "FROM decisions WHERE request_id = %s AND tenant = %s AND question_id = %s)"
)
SELECT = (
    f"SELECT d.id, {', '.join('d.' + c for c in COLUMNS)}, s.state, l.label, l.ts, l.source, "
    "l.count, l.tenant FROM decisions d LEFT JOIN labels l ON l.decision = d.id "
    "LEFT JOIN states s ON d.state_mode = 'text' AND s.key = d.state"
)
LATEST = (
    " WHERE d.id IN (SELECT max(id) FROM decisions WHERE tenant = %s AND request_id = %s "
    "GROUP BY question_id) ORDER BY d.id"
)
UPSERT_LABEL = (
    "INSERT INTO labels (decision, request_id, question_id, label, ts, source, count, tenant) "
    "VALUES (%s, %s, %s, %s, %s, %s, 1, %s) ON CONFLICT (decision) DO UPDATE SET "
    "label = excluded.label, ts = excluded.ts, source = excluded.source, "
    "count = labels.count + 1, tenant = excluded.tenant"
)
# The refit's rows: a cell's most recent judged ones (row ids grow with time).
JUDGED = (
    " WHERE d.id IN (SELECT id FROM (SELECT e.id, row_number() OVER (PARTITION BY e.type, "
    "e.band ORDER BY e.id DESC) AS k FROM decisions e WHERE e.cheap IS NOT NULL AND ({judge})) "
    "AS ranked WHERE k <= %s) ORDER BY d.id"
)
LABELLED = "EXISTS (SELECT 1 FROM labels m WHERE m.decision = e.id)"
JUDGES = {False: LABELLED, True: f"{LABELLED} OR e.shadow = 1"}
MAX_BATCH = 1024  # queue items per transaction
# From this many rows a batch goes by COPY (less CPU a row: measured 0.13 against 0.18 ms a
# request at 32 clients); a smaller one as pipelined inserts, one round trip (COPY's extra
# round trips cut one client's rows/s by half).
COPY_ROWS = 64
DURABLE_WAIT_S = 5.0  # the longest a response waits for its rows (store or spool)
RETRY_S = 1.0  # between tries of an unreachable database
PRUNE_EVERY_S = 3600.0
TIMEOUTS: dict[str, Any] = {"connect_timeout": 3, "options": "-c statement_timeout=5000"}


def connect(url: str, **kw: Any) -> psycopg.Connection[Any]:
    """A connection to ``url``; the password from the URL, ``PGPASSWORD`` (libpq reads it) or
    the file ``CASCADE_DECISION_LOG_PASSWORD_FILE`` names."""
    import psycopg

    return psycopg.connect(url, **TIMEOUTS, **_password(), **kw)


def safe_url(url: str) -> str:
    """``url`` without its password, for messages."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        parts = conninfo_to_dict(url)
    except Exception:
        return url.split("@")[-1]
    parts.pop("password", None)
    return make_conninfo("", **parts)


def migrate(url: str) -> tuple[int, int]:
    """Create or upgrade the schema at ``url``, serialized with every other replica by an
    advisory transaction lock; (the version found, the version now)."""
    with connect(url) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS cascade_schema (version integer NOT NULL)")
        row = conn.execute("SELECT version FROM cascade_schema").fetchone()
        found = 0 if row is None else int(row[0])
        if found > SCHEMA_VERSION:
            raise NotADecisionLog(
                f"{safe_url(url)}: decision store schema {found} is newer "
                f"than this cascade reads ({SCHEMA_VERSION})"
            )
        if found < SCHEMA_VERSION:
            conn.execute(CREATE)
            conn.execute("DELETE FROM cascade_schema")
            conn.execute("INSERT INTO cascade_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
    return found, SCHEMA_VERSION


def read_rows(
    url: str, *, since: float | None = None, tenant: str | None = None
) -> Iterator[LogRow]:
    """Every row, oldest first, through a server-side cursor (a few thousand rows in memory at
    a time); ``since``/``tenant`` filter in SQL."""
    where: list[str] = []
    params: list[Any] = []
    if since is not None:
        where.append("d.ts >= %s")
        params.append(since)
    if tenant is not None:
        where.append("d.tenant = %s")
        params.append(tenant)
    filters = (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY d.id"
    conn, select = _reader(url)
    with conn, conn.cursor(name="cascade_rows") as cursor:
        cursor.itersize = 2000
        cursor.execute(select + filters, params)
        for values in cursor:
            yield _decode(values)


def read_judged(url: str, *, per_cell: int, shadow: bool) -> list[LogRow]:
    """The rows a refit learns from, oldest first: per cell (type x band) the ``per_cell``
    most recent with a cheap answer and a label (or, ``shadow``, a shadow answer), chosen in
    SQL (``JUDGED``): never the whole table."""
    conn, select = _reader(url)
    with conn:
        return [
            _decode(values)
            for values in conn.execute(select + JUDGED.format(judge=JUDGES[shadow]), (per_cell,))
        ]


def _reader(url: str) -> tuple[psycopg.Connection[Any], str]:
    """A connection to a migrated store at ``url`` and the ``SELECT`` its schema reads
    (``ConnectionError``: unreachable; ``NotADecisionLog``: no store this cascade reads)."""
    import psycopg

    try:
        conn = connect(url)
    except psycopg.OperationalError as exc:
        raise ConnectionError(
            f"{safe_url(url)}: cannot connect: {' '.join(str(exc).split())}"
        ) from None
    try:
        old = _check_version(conn, url) < 6  # not migrated to 6 yet: no trace_id
    except BaseException:
        conn.close()
        raise
    return conn, SELECT.replace("d.trace_id", "NULL AS trace_id") if old else SELECT


def write_audit(
    url: str, ts: float, action: str, actor: str, outcome: str, replica: str, record: str
) -> None:
    """Append one audit record (``cascade.audit``); raises on any failure."""
    with connect(url) as conn:
        conn.execute(
            "INSERT INTO audit (ts, action, actor, outcome, replica, record) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (ts, action, actor, outcome, replica, record),
        )


def read_audit(url: str, since: float, limit: int) -> list[str]:
    """The newest ``limit`` audit records (JSON) at or after ``since``, oldest first; none in a
    database not migrated to schema 7 yet."""
    import psycopg

    try:
        conn = connect(url)
    except psycopg.OperationalError as exc:
        raise ConnectionError(
            f"{safe_url(url)}: cannot connect: {' '.join(str(exc).split())}"
        ) from None
    with conn:
        if _check_version(conn, url) < 7:
            return []
        found = conn.execute(
            "SELECT record FROM audit WHERE ts >= %s ORDER BY id DESC LIMIT %s", (since, limit)
        ).fetchall()
    return [record for (record,) in reversed(found)]


def _check_version(conn: psycopg.Connection[Any], url: str) -> int:
    import psycopg

    try:
        with conn.transaction():
            row = conn.execute("SELECT version FROM cascade_schema").fetchone()
    except psycopg.errors.UndefinedTable:
        raise NotADecisionLog(
            f"{safe_url(url)}: no decision store there (run cascade store "
            "migrate URL, or serve with it)"
        ) from None
    if row is None or row[0] > SCHEMA_VERSION:
        raise NotADecisionLog(
            f"{safe_url(url)}: decision store schema "
            f"{None if row is None else row[0]} is not one this cascade reads"
        )
    return int(row[0])


def _decode(values: tuple[Any, ...]) -> LogRow:
    n = 1 + len(COLUMNS)
    raw = dict(zip(("id", *COLUMNS), values[:n], strict=True))
    state_text = values[n]
    if raw["state_mode"] == "text":
        raw["state"] = None if state_text is None else _loads(state_text)
    return decode_row(raw, tuple(values[n + 1 :]))


def _full(row: list[Any]) -> list[Any]:
    """A spooled row with the columns its writer's schema lacked (NULL): a spool written
    before an upgrade is replayed after it."""
    return [*row, *[None] * (1 + len(COLUMNS) - len(row))]


def _loads(text: str) -> Any:
    import msgspec

    return msgspec.json.decode(text)


class PostgresStore:
    """The ``DecisionStore`` of a fleet. ``spool``: the local file for batches the database
    cannot take now (``spool_bytes`` at most); ``required``: an unreachable database at boot
    is an error (else a warning, and rows spool until it answers); ``keep_days``: retention
    (None: keep everything); ``clock``: unix time, for rows and retention."""

    def __init__(
        self,
        url: str,
        *,
        spool: str | Path,
        spool_bytes: int = 256 << 20,
        state_mode: StateMode = "hash",
        replica: str = "",
        queue_size: int = 10_000,
        keep_days: float | None = None,
        required: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
        from psycopg_pool import ConnectionPool

        self.url, self.replica, self.state_mode = url, replica, state_mode
        self.keep_days, self.clock = keep_days, clock
        self.reachable = True
        conninfo_to_dict(url)  # a malformed URL fails whatever ``required`` says
        self._migrated = False  # else the writer migrates before its first write
        try:
            migrate(url)
            self._migrated = True
        except psycopg.OperationalError as exc:  # unreachable (or refused): maybe spool
            if required:
                raise
            self.reachable = False
            log.warning(
                "decision store: %s unreachable at boot (%s); rows spool to %s until it answers",
                safe_url(url),
                exc,
                spool,
            )
        self.spool = Spool(spool, spool_bytes)
        self.written = self.failed = self.errors = self.dropped = self.spooled = 0
        self.last_error: tuple[float, str] | None = None
        self.lagging = False
        self._spool_failing = False  # an append hit a full or failing disk since it emptied
        self._boot = uuid.uuid4().hex[:16]
        self._seq = itertools.count()
        self._conn: psycopg.Connection[Any] | None = None
        self._replayed = 0  # spool offset already in the database
        self._next_try = 0.0  # monotonic time of the next connection attempt
        self._next_prune = 0.0
        self._queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue(maxsize=queue_size)
        self._pool = ConnectionPool(
            url, min_size=0, max_size=4, open=True, timeout=2.0, kwargs={**TIMEOUTS, **_password()}
        )
        self._labellers = concurrent.futures.ThreadPoolExecutor(4, "decision-labels")
        self._thread = threading.Thread(target=self._run, name="decision-store", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the request path

    async def record(self, call: EngineCall, decision: Decision, latency_s: float) -> None:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        key = f"{self._boot}:{next(self._seq)}"
        if (
            not self._put(
                ("record", call, decision, latency_s, self.clock(), key, done), len(call.questions)
            )
            or self.lagging
        ):
            return
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(done)), DURABLE_WAIT_S)
        except TimeoutError:
            self.lagging = True

    def shadowed(self, call: EngineCall, strong: EngineAnswer, stamp: Stamp) -> None:
        self._put(("shadow", call, strong, stamp), len(call.questions))

    def label(
        self,
        request_id: str,
        labels: Mapping[str, Any],
        *,
        source: str = "feedback",
        tenant: str = "",
    ) -> concurrent.futures.Future[LabelOutcome] | None:
        return self._labellers.submit(self._label, request_id, dict(labels), source, tenant)

    def _put(self, item: tuple[Any, ...], rows: int) -> bool:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            metrics.DECISION_LOG_ROWS.labels(outcome="dropped").inc(rows)
            return False
        return True

    def health(self) -> dict[str, Any]:
        """``reachable``; ``behind``: rows waiting in the spool (and its bytes), with the
        writer's counts and last failure."""
        return {
            "backend": "postgresql",
            "alive": self._thread.is_alive(),
            "reachable": self.reachable,
            "behind": self.spool.rows > 0 or self.lagging,
            "lagging": self.lagging,
            "spool_rows": self.spool.rows,
            "spool_bytes": self.spool.size,
            "written": self.written,
            "spooled": self.spooled,
            "failed": self.failed,
            "dropped_requests": self.dropped,
            "errors": self.errors,
            "last_error": None if self.last_error is None else self.last_error[1],
            "last_error_at": None if self.last_error is None else self.last_error[0],
        }

    def close(self, timeout_s: float = 10.0) -> None:
        """Write (or spool) what is queued, then stop the thread and the pool (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)
        self._labellers.shutdown(wait=False, cancel_futures=True)
        self._pool.close()

    # ------------------------------------------------------------ labels (a pool thread)

    def _label(
        self, request_id: str, labels: dict[str, Any], source: str, tenant: str
    ) -> LabelOutcome:
        ts = self.clock()
        with self._pool.connection() as conn, conn.transaction():
            rows = {
                row.question_id: row
                for row in map(_decode, conn.execute(SELECT + LATEST, (tenant, request_id)))
            }
            return store_labels(
                rows,
                labels,
                lambda row, value: conn.execute(
                    UPSERT_LABEL,
                    (row.id, request_id, row.question_id, to_json(value), ts, source, tenant),
                ),
            )

    # ------------------------------------------------------------ the writer thread

    def _run(self) -> None:
        stop = False
        while not stop:
            taken = self._take()
            stop = None in taken
            items = [item for item in taken if item is not None]
            batch, rows = self._serialize(items)
            try:
                if self.spool.rows:
                    self._replay()
                if batch and (self.spool.rows or not self._write(batch, rows)):
                    self._to_spool(batch, rows)
                elif self._spool_failing and not self.spool.rows:
                    log.warning(
                        "decision store: writing again, spool %s empty; it takes rows again",
                        self.spool.path,
                    )
                    self._spool_failing = False
                self._prune()
            finally:  # in the store, in the spool, or dropped and counted: nobody waits
                for item in items:
                    if item[0] == "record":
                        item[-1].set_result(None)
            if self._queue.empty():
                self.lagging = False
        if self._conn is not None:
            self._conn.close()

    def _take(self) -> list[tuple[Any, ...] | None]:
        """What is queued, waiting for the first item (at most ``RETRY_S`` while the spool
        holds batches to replay)."""
        try:
            batch = [self._queue.get(timeout=RETRY_S if self.spool.rows else None)]
        except queue.Empty:
            return []
        while len(batch) < MAX_BATCH:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _serialize(self, items: list[tuple[Any, ...]]) -> tuple[list[Any], int]:
        """The batch's write operations (plain values: the spool stores them) and its rows."""
        batch: list[Any] = []
        rows = 0
        for item in items:
            if item[0] == "record":
                call, decision, latency_s, ts, key, _ = item[1:]
                records, state = request_rows(
                    call, decision, latency_s, ts, self.state_mode, self.replica
                )
                if state is not None:
                    batch.append(["state", [*state, ts]])
                batch.append(["rows", [[f"{key}:{r[5]}", *r] for r in records]])
                rows += len(records)
            else:
                batch.append(["shadow", shadow_rows(*item[1:])])
        return batch, rows

    def _write(self, batch: list[Any], rows: int) -> bool:
        """One transaction for the batch; True when it committed. A failure is counted and
        leaves the store unreachable until the next try."""
        if time.monotonic() < self._next_try:
            return False
        try:
            if self._conn is None or self._conn.closed:
                if not self._migrated:
                    migrate(self.url)
                    self._migrated = True
                self._conn = connect(self.url)
                self._conn.execute(STAGE)
                self._conn.commit()
            if rows >= COPY_ROWS:
                with self._conn.transaction(), self._conn.cursor() as cur:
                    _copy(cur, batch)
            else:
                with self._conn.pipeline(), self._conn.transaction(), self._conn.cursor() as cur:
                    _insert(cur, batch)
        except Exception as exc:
            self._unreachable(exc)
            return False
        if not self.reachable:
            log.warning("decision store: %s answers again", safe_url(self.url))
        self.reachable = True
        metrics.DECISION_STORE_REACHABLE.set(1)
        self.written += rows
        metrics.DECISION_LOG_ROWS.labels(outcome="written").inc(rows)
        return True

    def _unreachable(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error = (time.time(), f"write: {exc}")
        metrics.DECISION_LOG_ERRORS.labels(stage="write").inc()
        metrics.DECISION_STORE_REACHABLE.set(0)
        if self.reachable:  # logged once per outage
            log.warning(
                "decision store: %s unreachable (%s); rows spool to %s",
                safe_url(self.url),
                exc,
                self.spool.path,
            )
        self.reachable = False
        self._next_try = time.monotonic() + RETRY_S
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception as closing:
                log.debug("decision store: closing: %s", closing)
            self._conn = None

    def _to_spool(self, batch: list[Any], rows: int) -> None:
        try:
            kept = self.spool.append(batch, rows)
        except OSError as exc:  # its disk is full (or failing): dropped and counted
            kept = False
            self.errors += 1
            self.last_error = (time.time(), f"spool: {exc}")
            metrics.DECISION_LOG_ERRORS.labels(stage="spool").inc()
            # Logged once until the spool empties: a small batch that fits the last free
            # bytes between two failures does not make the warning flap.
            if not self._spool_failing:
                log.warning(
                    "decision store: spool %s failed (%s); rows are dropped and "
                    "counted until it takes them again",
                    self.spool.path,
                    exc,
                )
            self._spool_failing = True
        outcome = "spooled" if kept else "dropped"
        if kept:
            self.spooled += rows
        else:
            self.failed += rows
        metrics.DECISION_LOG_ROWS.labels(outcome=outcome).inc(rows)
        metrics.DECISION_STORE_SPOOL_BYTES.set(self.spool.size)

    def _replay(self) -> None:
        """Write the spooled batches in order, each in its own transaction; stop at the first
        failure (tried again in ``RETRY_S``). Emptied once all are in."""
        for batch, rows, end in self.spool.records(self._replayed):
            if not self._write(batch, rows):
                return
            self._replayed = end
            metrics.DECISION_LOG_ROWS.labels(outcome="replayed").inc(rows)
        self.spool.clear()
        self._replayed = 0
        metrics.DECISION_STORE_SPOOL_BYTES.set(0)

    def _prune(self) -> None:
        """Delete what ``keep_days`` no longer keeps (once an hour)."""
        if (
            self.keep_days is None
            or self._conn is None
            or not self.reachable
            or time.monotonic() < self._next_prune
        ):
            return
        self._next_prune = time.monotonic() + PRUNE_EVERY_S
        try:
            prune(self._conn, self.clock() - self.keep_days * 86400)
        except Exception as exc:
            self.errors += 1
            self.last_error = (time.time(), f"prune: {exc}")
            metrics.DECISION_LOG_ERRORS.labels(stage="prune").inc()
            log.warning("decision store: retention failed: %s", exc)


def _insert(cur: psycopg.Cursor[Any], batch: list[Any]) -> None:
    """A batch's operations in order, a statement a row (in the connection's pipeline)."""
    for kind, values in batch:
        if kind == "state":
            cur.execute(INSERT_STATE, values)
        elif kind == "rows":
            cur.executemany(INSERT, [_full(row) for row in values])
        else:
            cur.executemany(SHADOW_UPDATE, values)


def _copy(cur: psycopg.Cursor[Any], batch: list[Any]) -> None:
    """A batch's operations in order, its rows through the staging table."""
    staged: list[Any] = []
    for kind, values in batch:
        if kind == "state":
            cur.execute(INSERT_STATE, values)
        elif kind == "rows":
            staged += [_full(row) for row in values]
        else:  # a shadow answer updates rows that may be staged: move them first
            _move(cur, staged)
            staged = []
            cur.executemany(SHADOW_UPDATE, values)
    _move(cur, staged)


def _move(cur: psycopg.Cursor[Any], rows: list[Any]) -> None:
    """Copy ``rows`` (row key first, then ``COLUMNS``) into the staging table and insert them
    in order, skipping keys already written. The commit empties the table; a second move in
    one transaction (after a shadow update) finds the first's rows written and skips them."""
    if not rows:
        return
    with cur.copy(COPY) as copy:
        for n, row in enumerate(rows):
            copy.write_row((n, *row))
    cur.execute(MOVE)


def prune(conn: psycopg.Connection[Any], before: float) -> int:
    """Delete the rows older than ``before`` (unix time; their labels go with them) and the
    states no longer seen since; how many rows went."""
    with conn.transaction():
        gone = conn.execute("DELETE FROM decisions WHERE ts < %s", (before,)).rowcount
        conn.execute("DELETE FROM states WHERE ts < %s", (before,))
    return gone


def _password() -> dict[str, Any]:
    secret = env_value("decision_log_password_file")
    return {"password": Path(secret).read_text().strip()} if secret else {}
