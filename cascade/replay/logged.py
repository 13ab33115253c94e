"""LoggedRequest requests: the decision log's rows grouped back into the requests they answered.

A request is its rows with one tenant, request id and time (a request's rows are written
together, stamped with one ``ts``; a retried id is another request). ``limit`` counts requests,
oldest first, so reading stops after it: a bounded read of a live store.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from cascade.calls import EngineCall
from cascade.schema import Question
from cascade.store import LogRow, read_rows


class LoggedRequest(msgspec.Struct, kw_only=True):
    """One logged request: its id, its tenant, its rows by question id (the latest wins if an
    id repeats)."""

    request_id: str
    tenant: str
    rows: dict[str, LogRow]

    def state_stored(self) -> bool:
        """Whether the log holds the request's state (``[decision_log] state = "text"``)."""
        first = next(iter(self.rows.values()))
        return first.state_mode == "text" and first.state is not None

    def call(self) -> EngineCall:
        """The request as the flow sees it: its questions, its model, its state when stored as
        text (else "": pre-routing then sees no state)."""
        first = next(iter(self.rows.values()))
        state: Any = first.state if first.state_mode == "text" else ""
        return EngineCall(
            state=state if state is not None else "",
            model=first.model,
            request_id=self.request_id,
            questions={
                qid: msgspec.convert(row.question, Question) for qid, row in self.rows.items()
            },
        )


def logged_requests(
    sources: Iterable[str | Path],
    *,
    since: float | None = None,
    tenant: str | None = None,
    limit: int | None = None,
) -> tuple[list[LoggedRequest], bool]:
    """The requests of ``sources`` (files or URLs, in order), at most ``limit``; the second
    value is True when the limit cut the read short."""
    found: dict[tuple[str, str, str, float], LoggedRequest] = {}
    for source in sources:
        for row in read_rows(source, since=since, tenant=tenant):
            key = (str(source), row.tenant, row.request_id, row.ts)  # sources stay apart
            request = found.get(key)
            if request is None:
                if limit is not None and len(found) >= limit:
                    return list(found.values()), True
                request = found[key] = LoggedRequest(
                    request_id=row.request_id, tenant=row.tenant, rows={}
                )
            request.rows[row.question_id] = row
    return list(found.values()), False
