"""Judged cheap answers read back from decision logs (a live controller's warm start at boot):
each row's label or shadow answer judged as ``cascade.store.judged`` does."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from cascade.control.evidence import Labelled
from cascade.control.labels import Source
from cascade.policy.model import Policy
from cascade.store import read_rows
from cascade.store.judged import SOURCES, evidence


def read_labelled(
    paths: Sequence[str | Path], policy: Policy, sources: Collection[Source] = SOURCES
) -> list[Labelled]:
    """The judged answers of decision log files, oldest first (pass rotated files oldest
    first: ``FILE.2``, ``FILE.1``, ``FILE``)."""
    return [found for path in paths for found in evidence(policy, read_rows(path), sources)]
