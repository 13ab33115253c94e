"""The circuit breaker, driven with an injected clock."""

from __future__ import annotations

import pytest

from cascade.policy.breaker import CircuitBreaker
from cascade.policy.model import BreakerConfig

CONFIG = BreakerConfig(
    window_s=10.0, min_calls=4, failure_ratio=0.5, cooldown_s=5.0, half_open_probes=1
)


def feed(breaker: CircuitBreaker, outcomes: str, start: float = 0.0, step: float = 0.1) -> float:
    """Record ``outcomes`` ("o" ok, "x" failed) one ``step`` apart; returns the last time."""
    now = start
    for mark in outcomes:
        assert breaker.allow(now)
        breaker.record(now, mark == "o")
        now += step
    return now - step


def test_stays_closed_below_min_calls_even_if_all_fail() -> None:
    breaker = CircuitBreaker(CONFIG)
    now = feed(breaker, "xxx")
    assert breaker.state(now) == "closed"
    assert breaker.failure_ratio(now) == 1.0
    assert breaker.allow(now)


def test_opens_at_the_failure_ratio_and_refuses_until_cooldown() -> None:
    breaker = CircuitBreaker(CONFIG)
    now = feed(breaker, "ooxx")  # 2 of 4 failed: ratio 0.5 reaches the threshold
    assert breaker.state(now) == "open"
    assert not breaker.allow(now + 1.0)
    assert breaker.retry_after(now + 1.0) == pytest.approx(4.0)
    assert breaker.state(now + 4.99) == "open"
    assert breaker.state(now + 5.0) == "half_open"
    assert breaker.retry_after(now + 5.0) == 0.0


def test_a_failure_ratio_below_the_threshold_stays_closed() -> None:
    breaker = CircuitBreaker(CONFIG)
    now = feed(breaker, "oooxoox")  # 2 of 7
    assert breaker.state(now) == "closed"


def test_the_window_slides() -> None:
    breaker = CircuitBreaker(CONFIG)
    now = feed(breaker, "xxx")
    # 20 s later the three failures fell out of the window: one more failure is 1 of 1 call.
    now = feed(breaker, "oox", start=now + 20.0)
    assert breaker.state(now) == "closed"
    assert breaker.failure_ratio(now) == 1 / 3


def test_half_open_lets_one_probe_through_and_closes_on_success() -> None:
    breaker = CircuitBreaker(CONFIG)
    now = feed(breaker, "xxxx") + 5.0
    assert breaker.allow(now)
    assert not breaker.allow(now)  # the single probe is out
    breaker.record(now + 0.2, True)
    assert breaker.state(now + 0.2) == "closed"
    assert breaker.failure_ratio(now + 0.2) == 0.0  # the window starts afresh
    assert breaker.allow(now + 0.3)


def test_a_failed_probe_reopens_with_a_fresh_cooldown() -> None:
    breaker = CircuitBreaker(CONFIG)
    now = feed(breaker, "xxxx") + 6.0
    assert breaker.allow(now)
    breaker.record(now + 1.0, False)
    assert breaker.state(now + 1.0) == "open"
    assert breaker.retry_after(now + 1.0) == pytest.approx(5.0)
    assert not breaker.allow(now + 5.9)
    assert breaker.allow(now + 6.0)


def test_several_probes_must_all_succeed() -> None:
    breaker = CircuitBreaker(
        BreakerConfig(min_calls=2, failure_ratio=1.0, cooldown_s=1.0, half_open_probes=2)
    )
    now = feed(breaker, "xx") + 1.0
    assert breaker.allow(now) and breaker.allow(now)
    assert not breaker.allow(now)
    breaker.record(now, True)
    assert breaker.state(now) == "half_open"
    assert breaker.allow(now)  # one probe slot freed
    breaker.record(now, True)
    assert breaker.state(now) == "closed"


def test_a_lost_probe_is_forgotten_after_the_cooldown() -> None:
    breaker = CircuitBreaker(CONFIG)
    now = feed(breaker, "xxxx") + 5.0
    assert breaker.allow(now)  # this probe's caller never reports
    assert not breaker.allow(now + 4.9)
    assert breaker.allow(now + 5.0)


def test_outcomes_of_calls_admitted_before_opening_are_ignored() -> None:
    breaker = CircuitBreaker(CONFIG)
    now = feed(breaker, "xxxx")
    breaker.record(now + 0.1, True)  # a slow call that started while closed
    assert breaker.state(now + 0.1) == "open"
    # ... and once half-open, a late report does not count as a probe either
    breaker.record(now + 5.5, True)
    assert breaker.state(now + 5.5) == "half_open"
    assert breaker.allow(now + 5.5)


def test_a_released_probe_frees_its_slot_at_once() -> None:
    """A half-open probe that ends without a verdict (overload, a client error, a cancelled
    caller) lets the next call probe now, not after another cooldown."""
    b = CircuitBreaker(BreakerConfig(min_calls=1, failure_ratio=0.5, cooldown_s=10.0))
    assert b.allow(0.0)
    b.record(0.0, False)
    assert b.state(10.0) == "half_open" and b.allow(10.0)
    assert not b.allow(10.1)  # the probe slot is taken
    b.release(10.2)
    assert b.allow(10.3)  # freed: the next call is the probe
    b.record(10.4, True)
    assert b.state(10.5) == "closed"
    b.release(11.0)  # closed: nothing to free, nothing changes
    assert b.state(11.0) == "closed"
