"""A gateway on fake tiers under a real server on loopback, logging to a decision store, with
admin keys from a file or inline (the audit tests')."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from cascade.http.app import create_app
from cascade.settings import Settings
from cascade.store.base import DecisionStore
from cascade.store.postgres import PostgresStore
from cascade.store.sqlite import SqliteStore
from cascade.tenants.keys import hashed
from tests.replay.helpers import gateway_of
from tests.servers import serve_app

ADMIN_FILE = f"""[[tenant]]
name = "alice"
keys = ["{hashed("alice-key")}"]

[[tenant]]
name = "bob"
keys = ["{hashed("bob-key")}"]
"""
ALICE = {"authorization": "Bearer alice-key"}
BOB = {"authorization": "Bearer bob-key"}


def keys_file(path: Path, tenants: dict[str, list[str]]) -> Path:
    """An API keys file: each tenant and its keys (stored hashed)."""
    path.write_text(
        "".join(
            f'[[tenant]]\nname = "{name}"\nkeys = {[hashed(k) for k in keys]}\n\n'.replace("'", '"')
            for name, keys in tenants.items()
        )
    )
    return path


@contextlib.contextmanager
def served(
    policy: Path, log: Path | str | None, spool: Path | None = None, **settings: Any
) -> Iterator[httpx.Client]:
    """The gateway serving ``policy``, logging to ``log`` (a SQLite file, a PostgreSQL URL with
    ``spool``, or none)."""
    store: DecisionStore | None = (
        None
        if log is None
        else SqliteStore(log)
        if isinstance(log, Path)
        else PostgresStore(log, spool=spool or policy.parent / "spool", replica="r1")
    )
    config = Settings(
        policy=str(policy), decision_log=None if log is None else str(log), replica="r1", **settings
    )
    try:
        with (
            serve_app(create_app(config, gateway_of(policy, store))) as url,
            httpx.Client(base_url=url, timeout=30) as client,
        ):
            yield client
    finally:
        if store is not None:
            store.close()
