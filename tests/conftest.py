"""Shared fixtures: a clean environment, free loopback ports, servers started and stopped."""

from __future__ import annotations

import os

import pytest

from tests.servers import free_port, serve_app  # noqa: F401  (re-exported for tests)

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CASCADE_* variable from the developer's shell leaks into a test."""
    for key in list(os.environ):
        if key.startswith(("CASCADE_", "TYPESAFE_")):
            monkeypatch.delenv(key)
