"""The gateway's in-flight permits (``CASCADE_MAX_INFLIGHT``), shared fairly between tenants.

Sans-IO on an injected clock: ``take`` answers at once, never queues. A request holds one permit
per state (a batch: one per state), taken once its body is decoded. A full gateway answers 503
+ Retry-After, and its tenant is marked *waiting* when it holds less than its fair share, until
``WAITING_S`` after its last request (refused or served). While another tenant waits, a tenant
that already holds permits may take more only up to its fair share, ``limit // active``
(active: the tenants holding permits, plus those waiting with none), so what it holds beyond
that drains as its requests finish and the waiting tenant's retry finds room. Alone, a tenant
may use every permit. Each step is O(1).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cascade.errors import Overloaded

WAITING_S = 5.0  # a refused tenant counts as waiting this long (a few of its Retry-Afters)


class InflightLimit:
    """A non-blocking in-flight limit over every tenant, with fair shares while one waits."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self.inflight = 0
        self.held: Counter[str] = Counter()
        self.waiting: OrderedDict[str, float] = OrderedDict()  # tenant -> refused at
        self._idle_waiting = 0  # waiting tenants that hold no permit

    def share(self) -> int:
        """A tenant's fair share of the permits now."""
        return max(1, self.limit // max(1, len(self.held) + self._idle_waiting))

    @contextmanager
    def permit(self, count: int = 1, *, tenant: str = "") -> Iterator[None]:
        self.take(tenant, count)
        try:
            yield
        finally:
            self.give(tenant, count)

    def take(self, tenant: str, count: int) -> None:
        """Take ``count`` permits for ``tenant``, or raise ``Overloaded`` (503) at once."""
        self._forget(self.clock())
        held = self.held[tenant]
        others_wait = len(self.waiting) > (tenant in self.waiting)
        if others_wait and held and held + count > self.share():
            raise Overloaded(
                f"gateway busy: tenant `{tenant}` holds its fair share "
                f"({self.share()} of {self.limit} in flight) while others wait",
                retry_after=1,
            )
        if self.inflight + count > self.limit:
            if held < self.share():
                self._wait(tenant)
            raise Overloaded(f"gateway busy ({self.limit} requests in flight)", retry_after=1)
        if tenant in self.waiting:  # still waiting while it keeps sending
            self._idle_waiting -= not held
            self.waiting[tenant] = self.clock()
            self.waiting.move_to_end(tenant)
        self.held[tenant] = held + count
        self.inflight += count

    def give(self, tenant: str, count: int) -> None:
        self.inflight -= count
        self.held[tenant] -= count
        if not self.held[tenant]:
            del self.held[tenant]
            if tenant in self.waiting:
                self._idle_waiting += 1

    def _wait(self, tenant: str) -> None:
        if tenant not in self.waiting and not self.held[tenant]:
            self._idle_waiting += 1
        self.waiting[tenant] = self.clock()
        self.waiting.move_to_end(tenant)

    def _forget(self, now: float) -> None:
        """Drop the waiting marks older than ``WAITING_S`` (oldest first: amortised O(1))."""
        while self.waiting:
            tenant, since = next(iter(self.waiting.items()))
            if now - since < WAITING_S:
                return
            del self.waiting[tenant]
            if not self.held[tenant]:
                self._idle_waiting -= 1
