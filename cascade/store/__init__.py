"""The decision store: one row per answered question, its labels, its shadow answers.

Where it lives is one setting (``--decision-log``, ``CASCADE_DECISION_LOG``, ``[decision_log]
file``): a path is a SQLite file (``cascade.store.sqlite``, one process), a ``postgresql://``
URL one database for every replica (``cascade.store.postgres``, psycopg imported only then).
Serving, feedback and the live refit use the ``DecisionStore`` protocol (``cascade.store.base``);
offline readers ``read_rows``. Row layout: ``cascade.store.rows``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from cascade.settings import env_value
from cascade.settings import is_database_url as is_url
from cascade.store.rows import LogRow, NotADecisionLog

if TYPE_CHECKING:
    from cascade.policy.model import Policy
    from cascade.settings import Settings

__all__ = [
    "LogRow",
    "NotADecisionLog",
    "is_url",
    "log_source",
    "log_target",
    "missing",
    "read_rows",
    "replica_name",
]


def log_source(text: str) -> str | Path:
    """``--from-log``'s value: a URL kept as written, else a file path (argparse ``type``)."""
    return text if is_url(text) else Path(text)


def log_target(settings: Settings, policy: Policy) -> str | None:
    """Where a gateway keeps its decision log: ``--decision-log`` (``CASCADE_DECISION_LOG``),
    else the policy's ``[decision_log] file`` (None: it keeps none)."""
    return settings.decision_log or policy.decision_log.file


def missing(sources: list[str | Path]) -> list[str]:
    """The file sources that are no file (URLs are checked when read)."""
    return [str(s) for s in sources if not is_url(s) and not Path(s).is_file()]


def replica_name() -> str:
    """This gateway's name in the rows it writes: ``CASCADE_REPLICA``, else the hostname."""
    return env_value("replica") or socket.gethostname()


def read_rows(
    target: str | Path, *, since: float | None = None, tenant: str | None = None
) -> Iterator[LogRow]:
    """Every row of a SQLite file or a PostgreSQL URL, oldest first, streamed (``since``: from
    that unix time on, ``tenant``: that tenant's only; both filtered in SQL)."""
    if is_url(target):
        from cascade.store import postgres

        return postgres.read_rows(str(target), since=since, tenant=tenant)
    from cascade.store import sqlite

    return sqlite.read_rows(target, since=since, tenant=tenant)
