"""The gateway's permits on a fake clock: alone a tenant may use them all; while another tenant
waits, one holding more than its fair share gets no more until the waiter is served."""

from __future__ import annotations

import pytest

from cascade.errors import Overloaded
from cascade.http.permits import WAITING_S, InflightLimit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_alone_a_tenant_may_take_every_permit() -> None:
    permits = InflightLimit(8, Clock())
    permits.take("a", 8)
    with pytest.raises(Overloaded, match=r"gateway busy \(8 requests in flight\)"):
        permits.take("a", 1)
    assert not permits.waiting  # refused at its own fill: nobody else waits


def test_while_another_waits_a_tenant_over_its_share_gets_no_more() -> None:
    clock = Clock()
    permits = InflightLimit(8, clock)
    permits.take("a", 8)
    with pytest.raises(Overloaded, match="gateway busy"):
        permits.take("b", 1)  # full: b waits
    assert permits.share() == 4  # a holding, b waiting with none
    permits.give("a", 2)
    with pytest.raises(Overloaded, match="`a` holds its fair share") as refused:
        permits.take("a", 1)  # a's freed permits are left for b
    assert refused.value.retry_after == 1
    permits.take("b", 2)
    permits.give("a", 3)  # a drains to 3, under its share
    permits.take("a", 1)
    with pytest.raises(Overloaded, match="fair share"):
        permits.take("a", 1)  # 5 > 4 while b's refusal is recent
    clock.now += WAITING_S - 1
    permits.take("b", 1)  # b keeps sending: it still counts as waiting
    permits.give("b", 1)
    clock.now += WAITING_S - 1
    with pytest.raises(Overloaded, match="fair share"):
        permits.take("a", 1)
    clock.now += 1
    permits.take("a", 1)  # b sent nothing for WAITING_S: a may use what is free
    assert permits.inflight == 7 and permits.held == {"a": 5, "b": 2}


def test_a_tenant_holding_nothing_may_take_a_request_larger_than_its_share() -> None:
    permits = InflightLimit(8, Clock())
    permits.take("a", 2)
    with pytest.raises(Overloaded):
        permits.take("b", 7)  # 9 > 8: b waits
    permits.take("c", 5)  # c holds nothing: one request of 5 > share 8 // 3 is let in
    with pytest.raises(Overloaded, match="fair share"):
        permits.take("c", 1)


def test_permits_are_given_back_and_waiting_marks_expire_oldest_first() -> None:
    clock = Clock()
    permits = InflightLimit(2, clock)
    with permits.permit(2, tenant="a"):
        for name in ("b", "c"):
            with pytest.raises(Overloaded):
                permits.take(name, 1)
            clock.now += 1
    assert list(permits.waiting) == ["b", "c"] and permits.share() == 1
    clock.now += WAITING_S - 1.5
    permits.take("c", 1)  # b's mark is dropped; c still waits (its mark outlives its refusal)
    assert list(permits.waiting) == ["c"] and permits.inflight == 1 and not permits.held["a"]
