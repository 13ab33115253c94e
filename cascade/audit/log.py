"""``AuditLog``: where admin actions are recorded. ``record`` is the one call every admin action
makes (reloads, dry runs, freeze/unfreeze, a rollout's start/step/promote/abort/rollback): it
logs the record as one structured line (logger ``cascade.audit``) and, with a decision log
configured, appends it to the store's ``audit`` table on a writer thread of its own, never
blocking the event loop. A store write that fails is counted
(``cascade_audit_records_total{outcome="failed"}``) and logged; the admin action goes on.
``read`` runs on the same thread, so it sees every record made before it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from cascade import metrics
from cascade.schema import AuditOutcome, AuditRecord
from cascade.store import is_url

log = logging.getLogger("cascade.audit")
_decode = msgspec.json.Decoder(AuditRecord)


def write(target: str, record: AuditRecord) -> None:
    """Append ``record`` to the decision store at ``target`` (a SQLite file or a URL)."""
    text = msgspec.json.encode(record).decode()
    fields = (record.ts, record.action, record.actor, record.outcome, record.replica, text)
    if is_url(target):
        from cascade.store import postgres

        postgres.write_audit(target, *fields)
    else:
        from cascade.store import sqlite

        sqlite.write_audit(target, *fields)


def read(target: str, *, since: float = 0.0, limit: int = 100) -> list[AuditRecord]:
    """The newest ``limit`` records at or after ``since`` (unix seconds), oldest first."""
    if is_url(target):
        from cascade.store import postgres

        found = postgres.read_audit(target, since, limit)
    else:
        from cascade.store import sqlite

        found = sqlite.read_audit(target, since, limit)
    return [_decode.decode(text) for text in found]


class AuditLog:
    """Audit records of one gateway: ``target`` its decision store (None: the log only),
    ``replica`` its name in them."""

    def __init__(self, target: str | None, replica: str) -> None:
        self.target, self.replica = target, replica
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="audit")

    def record(
        self,
        action: str,
        actor: str,
        outcome: AuditOutcome,
        *,
        client: str | None = None,
        message: str = "",
        before: Mapping[str, str] | None = None,
        after: Mapping[str, str] | None = None,
        changed: Iterable[str] = (),
        detail: Mapping[str, Any] | None = None,
    ) -> concurrent.futures.Future[None]:
        """Record one admin action (module docstring); the future resolves once it is stored
        (or failed, counted and logged)."""
        entry = AuditRecord(
            ts=time.time(),
            action=action,
            actor=actor,
            client=client,
            outcome=outcome,
            message=message,
            replica=self.replica,
            before=dict(before or {}),
            after=dict(after or {}),
            changed=list(changed),
            detail=dict(detail or {}),
        )
        log.info("audit %s", msgspec.json.encode(entry).decode())
        if self.target is None:
            metrics.AUDIT_RECORDS.labels(outcome="log_only").inc()
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            done.set_result(None)
            return done
        return self._writer.submit(self._store, self.target, entry)

    def read(
        self, *, since: float = 0.0, limit: int = 100
    ) -> concurrent.futures.Future[list[AuditRecord]]:
        """``read`` on the writer thread (after every record made before it); needs a target."""
        assert self.target is not None
        return self._writer.submit(read, self.target, since=since, limit=limit)

    def flush(self) -> None:
        """Wait until every record made so far is stored (or failed)."""
        self._writer.submit(lambda: None).result()

    @staticmethod
    def _store(target: str, entry: AuditRecord) -> None:
        try:
            write(target, entry)
        except Exception as exc:  # any store failure: counted and logged, never raised
            metrics.AUDIT_RECORDS.labels(outcome="failed").inc()
            log.warning(
                "audit: the record of %s by %s was not stored (%s); it is in this log",
                entry.action,
                entry.actor,
                exc,
            )
            return
        metrics.AUDIT_RECORDS.labels(outcome="stored").inc()
