"""The one protocol serving, feedback and the live refit use to reach the decision store.

Two backends implement it: ``cascade.store.sqlite.SqliteStore`` (a file, the embedded default)
and ``cascade.store.postgres.PostgresStore`` (one database for a fleet of replicas). Offline
readers go through ``cascade.store.read_rows``.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cascade.calls import EngineAnswer, EngineCall
    from cascade.control.labels import LabelOutcome
    from cascade.policy.flow import Decision
    from cascade.policy.stamp import Stamp
    from cascade.schema import Label


class DecisionStore(Protocol):
    """``record`` is awaited before a response goes out: it returns once the request's rows
    are durable (in the store, or for PostgreSQL in the local spool), never blocking the event
    loop; ``shadowed`` returns at once; ``label``'s future resolves once the labels are
    committed (None: the store cannot take them now)."""

    async def record(self, call: EngineCall, decision: Decision, latency_s: float) -> None: ...

    def shadowed(self, call: EngineCall, strong: EngineAnswer, stamp: Stamp) -> None: ...

    def label(
        self,
        request_id: str,
        labels: Mapping[str, Label],
        *,
        source: str = "feedback",
        tenant: str = "",
    ) -> concurrent.futures.Future[LabelOutcome] | None: ...

    def health(self) -> dict[str, Any]: ...

    def close(self, timeout_s: float = 10.0) -> None: ...
