"""``UsageBook``: a tenant's figures by UTC day and tier, the last ``days`` days only, on an
injected clock."""

from __future__ import annotations

from datetime import UTC, datetime

from cascade.tenants.usage import Tally, UsageBook

DAY = 86400.0
START = datetime(2026, 12, 5, 23, 59, 0, tzinfo=UTC).timestamp()


def test_days_are_utc_days_and_tenants_stay_apart() -> None:
    now = [START]
    book = UsageBook(days=3, clock=lambda: now[0])
    book.request("acme", {"laya": Tally(requests=1, questions=2, input_tokens=10, cost=0.01)})
    now[0] += 120  # past midnight UTC: a new day
    book.request(
        "acme",
        {
            "laya": Tally(requests=1, input_tokens=10, cost=0.01),
            "clef": Tally(requests=1, questions=2, input_tokens=10, cost=0.2),
        },
    )
    book.request("beta", {"laya": Tally(requests=1, questions=1, input_tokens=5, cost=0.005)})
    acme = book.report("acme")
    assert [d.date for d in acme.days] == ["2026-12-05", "2026-12-06"]
    assert [d.requests for d in acme.days] == [1, 1]
    assert acme.days[1].questions == 2 and acme.days[1].cost == 0.21
    assert acme.total.requests == 2 and acme.total.input_tokens == 30
    assert acme.total.tiers["laya"].requests == 2 and acme.total.tiers["laya"].questions == 2
    assert acme.total.date is None and acme.since == "2026-12-05T23:59:00+00:00"
    assert book.report("beta").total.input_tokens == 5
    assert book.report("nobody").days == [] and book.report("nobody").total.requests == 0


def test_only_the_last_days_are_kept() -> None:
    now = [START]
    book = UsageBook(days=3, clock=lambda: now[0])
    for _ in range(5):
        book.request("acme", {"laya": Tally(requests=1)})
        now[0] += DAY
    now[0] -= DAY  # the fifth day: 2026-12-09
    report = book.report("acme")
    assert [d.date for d in report.days] == ["2026-12-07", "2026-12-08", "2026-12-09"]
    assert report.total.requests == 3 and report.since == "2026-12-07T00:00:00+00:00"
    assert len(book._by["acme"]) == 3  # the older days are gone, not only hidden
