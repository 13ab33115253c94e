"""Shared fixtures: a clean environment, a private cache, free loopback ports, servers."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
KEEP = {"CASCADE_CACHE"}


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """ONNX exports and other caches go to a temporary directory, never the user's home."""
    old = os.environ.get("CASCADE_CACHE")
    os.environ["CASCADE_CACHE"] = str(tmp_path_factory.mktemp("cascade-cache"))
    yield
    if old is None:
        del os.environ["CASCADE_CACHE"]
    else:
        os.environ["CASCADE_CACHE"] = old


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CASCADE_* or TYPESAFE_* variable from the developer's shell leaks into a test."""
    for key in list(os.environ):
        if key.startswith(("CASCADE_", "TYPESAFE_")) and key not in KEEP:
            monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """One PostgreSQL server for the session (``tests.servers.Postgres``); tests make their own
    database (``postgres.database(name)``), and a test that stops it starts it again."""
    from tests.servers import run_postgres

    with run_postgres() as server:
        yield server
