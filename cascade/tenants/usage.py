"""What each tenant used, by UTC day and tier, kept in this process for ``GET /v1/usage``.

The same figures as the ``cascade_tenant_*`` counters (``cascade.tenants.spend`` feeds both):
per tier that ran, a request, its input tokens and their cost; per tier whose answer was
returned, its questions; per day, the requests decided (a batch counts its states). Per replica
and since the process started; only the last ``days`` UTC days are kept, so memory is bounded
by tenants (the keys file's names) x days x tiers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from cascade.schema import TierUsage, UsageFigures, UsageReport

DAYS = 31  # UTC days kept, today included


@dataclass
class Tally:
    requests: int = 0
    questions: int = 0
    input_tokens: int = 0
    cost: float = 0.0

    def add(self, other: Tally) -> None:
        self.requests += other.requests
        self.questions += other.questions
        self.input_tokens += other.input_tokens
        self.cost += other.cost

    def wire(self) -> TierUsage:
        return TierUsage(
            requests=self.requests,
            questions=self.questions,
            input_tokens=self.input_tokens,
            cost=round(self.cost, 6),
        )


@dataclass
class Day:
    requests: int = 0
    tiers: dict[str, Tally] = field(default_factory=dict)

    def wire(self, when: date | None) -> UsageFigures:
        total = Tally()
        for tally in self.tiers.values():
            total.add(tally)
        return UsageFigures(
            date=None if when is None else when.isoformat(),
            requests=self.requests,
            questions=total.questions,
            input_tokens=total.input_tokens,
            cost=round(total.cost, 6),
            tiers={name: t.wire() for name, t in self.tiers.items()},
        )


class UsageBook:
    """Tenant -> UTC day -> tier -> ``Tally``. ``clock``: unix seconds (injected in tests)."""

    def __init__(self, days: int = DAYS, clock: Callable[[], float] = time.time) -> None:
        self.days = days
        self.clock = clock
        self.started = clock()
        self._by: dict[str, dict[date, Day]] = {}

    def _today(self) -> date:
        return datetime.fromtimestamp(self.clock(), UTC).date()

    def request(self, tenant: str, tiers: dict[str, Tally]) -> None:
        """One decided request of ``tenant``: what each tier did for it."""
        today = self._today()
        days = self._by.setdefault(tenant, {})
        day = days.get(today)
        if day is None:
            day = days[today] = Day()
            self._forget(days, today)
        day.requests += 1
        for name, tally in tiers.items():
            day.tiers.setdefault(name, Tally()).add(tally)

    def _forget(self, days: dict[date, Day], today: date) -> None:
        for old in [d for d in days if (today - d).days >= self.days]:
            del days[old]

    def report(self, tenant: str) -> UsageReport:
        """``tenant``'s figures, oldest day first, and their total (the retained days only)."""
        today = self._today()
        days = self._by.get(tenant, {})
        self._forget(days, today)
        total = Day(requests=sum(d.requests for d in days.values()))
        for day in days.values():
            for name, tally in day.tiers.items():
                total.tiers.setdefault(name, Tally()).add(tally)
        oldest = today - timedelta(days=self.days - 1)
        first = datetime(oldest.year, oldest.month, oldest.day, tzinfo=UTC)
        since = max(datetime.fromtimestamp(self.started, UTC), first)
        return UsageReport(
            tenant=tenant,
            scope="replica",
            retained_days=self.days,
            since=since.isoformat(timespec="seconds"),
            days=[day.wire(when) for when, day in sorted(days.items())],
            total=total.wire(None),
        )
