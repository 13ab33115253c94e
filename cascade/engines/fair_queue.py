"""Rows waiting in start-time fair queuing order: the order a batcher serves them in.

Every request belongs to a *flow*, and its rows are tagged with the work (in units of cost) its
flow's earlier requests already claimed, or with the virtual time (the tag of the last row
served) when that is later: a one-row request arriving behind a batch of 64 states is served
next, not after the 64, and between flows with nothing else queued it is first come, first
served. Ties between equal tags go by arrival, then by the row's ``key`` (its sort order within
a request). Not thread-safe: use it from the event loop.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    cost: int
    key: int
    tag: float  # set by ``FairQueue.push``
    seq: int  # likewise: its request's arrival order


R = TypeVar("R", bound=Queued)


def _order(row: Queued) -> tuple[float, int, int]:
    return row.tag, row.seq, row.key


class FairQueue(Generic[R]):
    """``rows``: the rows waiting, in serving order (read it; change it through the methods)."""

    def __init__(self) -> None:
        self.rows: list[R] = []
        self._vtime = 0.0  # the tag of the last row served
        self._finish: dict[Hashable, float] = {}  # each flow's last claimed tag
        self._seq = itertools.count()

    def start_tag(self, flow: Hashable) -> float:
        """The tag a new request of ``flow`` would get: rows tagged no later are served first."""
        return max(self._vtime, self._finish.get(flow, self._vtime))

    def push(self, flow: Hashable, tag: float, rows: Sequence[R]) -> None:
        """Queue one request's rows (of ``flow``, at ``tag``) in serving order."""
        seq = next(self._seq)
        for row in rows:
            row.tag, row.seq = tag, seq
            bisect.insort(self.rows, row, key=_order)
        self._finish[flow] = tag + sum(row.cost for row in rows)

    def pop(self, n: int) -> list[R]:
        """Take the first ``n`` rows to serve."""
        taken = self.rows[:n]
        del self.rows[:n]
        self._vtime = max(self._vtime, taken[0].tag)
        if len(self._finish) > 4 * len(self.rows) + 64:  # forget flows that are all served
            self._finish = {f: t for f, t in self._finish.items() if t > self._vtime}
        return taken

    def remove(self, gone: Callable[[R], bool]) -> int:
        """Drop the rows for which ``gone`` is true; how many."""
        kept = [r for r in self.rows if not gone(r)]
        dropped = len(self.rows) - len(kept)
        self.rows = kept
        return dropped
