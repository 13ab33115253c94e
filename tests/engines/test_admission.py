"""Admission by expected wait: the pure policy with hand-made queue states, then the batcher's
use of it on a fake clock. No test here sleeps: time moves only when a test advances it."""

from __future__ import annotations

import asyncio

import pytest

from cascade.engines.admission import Admit, QueueAdmission, QueueState, Refuse
from cascade.engines.batcher import MicroBatcher
from cascade.errors import Overloaded
from tests.engines.conftest import FakeClock, Recorder, settle

pytestmark = pytest.mark.anyio
NOW = 1000.0


def state(
    others: int = 0, ahead: float = 0.0, backlog: float = 0.0, *, timed: bool = True
) -> QueueState:
    return QueueState(others=others, timed=timed, ahead=lambda: ahead, backlog=lambda: backlog)


def never() -> float:
    raise AssertionError("computed a wait the decision does not need")


# ---------------------------------------------------------------- the policy, pure


def test_an_idle_queue_admits_any_request() -> None:
    policy = QueueAdmission(max_queue=1, max_batch_items=1, max_batch_s=5.0)
    assert policy.decide(state(), now=NOW, deadline=NOW + 0.001) == Admit(0.0)
    assert policy.decide(state(), now=NOW, deadline=None) == Admit(0.0)


def test_the_wait_and_its_own_batch_must_fit_before_the_deadline() -> None:
    policy = QueueAdmission(max_queue=64, max_batch_items=8, max_batch_s=0.5)
    assert policy.decide(state(3, ahead=2.0), now=NOW, deadline=NOW + 2.6) == Admit(2.0)
    assert policy.decide(state(3, ahead=2.0), now=NOW, deadline=NOW + 2.4) == Refuse(
        "about 2.0 s of work ahead; this request may wait 1.9 s", 1.0
    )  # at least 1 s
    assert policy.decide(state(3, ahead=2.0), now=NOW, deadline=NOW + 0.2) == Refuse(
        "about 2.0 s of work ahead; this request may wait 0.0 s", 2.0
    )


def test_predicted_waits_are_scaled_by_the_correction() -> None:
    policy = QueueAdmission(max_queue=64, max_batch_items=8)
    policy.ran(0.1, 0.2)  # batches take twice what the cost model says
    assert policy.correction == pytest.approx(2.0)
    admitted = policy.decide(state(3, ahead=1.0), now=NOW, deadline=NOW + 2.5)
    assert admitted == Admit(1.0)  # the prediction as made: what ``waited`` compares with
    assert policy.decide(state(3, ahead=1.5), now=NOW, deadline=NOW + 1.0) == Refuse(
        "about 3.0 s of work ahead; this request may wait 1.0 s", 2.0
    )


def test_until_a_batch_is_timed_a_request_with_a_deadline_queues_behind_one_batch() -> None:
    policy = QueueAdmission(max_queue=10, max_batch_items=4)
    refused = policy.decide(state(4, backlog=1.26, timed=False), now=NOW, deadline=NOW + 99)
    assert refused == Refuse("4 rows queued", 1.3)
    assert policy.decide(state(3, timed=False), now=NOW, deadline=NOW + 99) == Admit(0.0)
    assert policy.decide(state(4, timed=False), now=NOW, deadline=None) == Admit(0.0)
    assert policy.decide(state(4), now=NOW, deadline=NOW + 99) == Admit(0.0)
    policy.ran(0.1, 0.3)
    assert policy.decide(state(10, backlog=1.0), now=NOW, deadline=None) == Refuse(
        "10 rows queued", 3.0
    )  # the backlog, corrected


def test_only_the_wait_the_decision_needs_is_computed() -> None:
    policy = QueueAdmission(max_queue=2, max_batch_items=2)
    full = QueueState(others=2, timed=True, ahead=never, backlog=lambda: 0.5)
    assert policy.decide(full, now=NOW, deadline=None) == Refuse("2 rows queued", 1.0)
    room = QueueState(others=1, timed=True, ahead=lambda: 0.5, backlog=never)
    assert policy.decide(room, now=NOW, deadline=None) == Admit(0.5)


def test_batch_overrun_rises_at_once_and_falls_back_three_tenths_per_batch() -> None:
    policy = QueueAdmission(max_queue=8, max_batch_items=8)
    policy.ran(0.1, 0.3)
    assert policy.batch_overrun == pytest.approx(3.0)
    policy.ran(0.1, 0.1)
    assert policy.batch_overrun == pytest.approx(2.4)
    policy.ran(0.1, 0.05)  # faster than predicted counts as on time
    assert policy.batch_overrun == pytest.approx(1.98)
    policy.ran(0.1, 10.0)
    assert policy.batch_overrun == 4.0  # capped
    policy.ran(0.005, 1.0)  # predicted too short to learn from
    assert policy.batch_overrun == 4.0


def test_wait_correction_rises_fast_and_falls_slowly_and_the_larger_one_counts() -> None:
    policy = QueueAdmission(max_queue=8, max_batch_items=8)
    policy.waited(1.0, 2.0)
    assert policy.wait_correction == pytest.approx(1.3)
    policy.waited(1.0, 0.1)  # ratio floored at 0.5
    assert policy.wait_correction == pytest.approx(1.3 + 0.05 * (0.5 - 1.3))
    policy.waited(0.01, 5.0)  # predicted too short to learn from
    assert policy.wait_correction == pytest.approx(1.26)
    assert policy.correction == pytest.approx(1.26)
    policy.ran(0.1, 0.2)
    assert policy.correction == pytest.approx(2.0)


# ---------------------------------------------------------------- the batcher, on a fake clock


async def test_admission_refuses_at_once_what_would_wait_past_the_deadline() -> None:
    clock = FakeClock()
    run = Recorder()
    run.gate.clear()
    b = MicroBatcher(
        run,
        name="t",
        max_batch_items=8,
        max_batch_cost=10**6,
        max_wait_s=0,
        calibration=[([1], 0.5)],
        clock=clock,
    )  # half a second per row, measured
    busy = asyncio.create_task(b.submit([1]))
    await run.inside()
    queued = [asyncio.create_task(b.submit([i], deadline=clock() + 5)) for i in (2, 3, 4, 5)]
    await settle()
    with pytest.raises(Overloaded, match="work ahead") as info:  # at once: before its first wait
        b.submit([6], deadline=clock() + 1.0).send(None)  # 2.5 s of others' rows ahead
    assert info.value.retry_after == 1.5  # 2.5 s ahead, 1 s allowed
    assert b.queue_depth() == 4  # nothing of the refused request was queued
    # a flow's own rows never count against it: with the 0.5 s of [8] counted, [9] would
    # expect 3.0 s of wait and be refused
    more = asyncio.create_task(b.submit([8], flow="x", deadline=clock() + 100))
    same = asyncio.create_task(b.submit([9], flow="x", deadline=clock() + 2.6))
    await settle()
    run.gate.set()
    answers = await asyncio.gather(busy, *queued, more, same)
    assert answers == [[10], [20], [30], [40], [50], [80], [90]]
    await b.aclose()


async def test_a_batch_running_past_its_prediction_is_assumed_to_need_as_long_again() -> None:
    """A stuck engine soon refuses new work instead of queueing it forever."""
    clock = FakeClock()
    run = Recorder()
    run.gate.clear()
    b = MicroBatcher(
        run,
        name="t",
        max_batch_items=8,
        max_batch_cost=10**6,
        max_wait_s=0,
        calibration=[([1], 0.5)],
        clock=clock,
    )
    busy = asyncio.create_task(b.submit([1]))
    await run.inside()
    clock.advance(0.2)
    b.check(deadline=clock() + 1.0)  # 0.3 s left of the batch in flight
    assert b.expected_wait(clock()) == pytest.approx(0.3)
    clock.advance(1.8)  # 1.5 s overrun: as long again expected
    assert b.expected_wait(clock()) == pytest.approx(1.5)
    with pytest.raises(Overloaded, match="about 1.5 s of work ahead"):
        b.check(deadline=clock() + 1.0)
    run.gate.set()
    assert await busy == [10]
    await b.aclose()


async def test_the_first_overrun_scales_admission_at_once_and_waits_teach_the_rest() -> None:
    """Warm-up said 0.5 s a row; the first batch takes 1.5 s: the overrun is 3 at once, falls
    0.3 of the way back at the next batch (on time), and the request that waited 1.5 s on a
    promise of 0.5 s raises the wait correction 0.3 of the way to 3."""
    clock = FakeClock()
    run = Recorder()
    run.gate.clear()
    b = MicroBatcher(
        run,
        name="t",
        max_batch_items=1,
        max_batch_cost=10**6,
        max_wait_s=0,
        calibration=[([1], 0.5)] * 3,
        clock=clock,
    )
    first = asyncio.create_task(b.submit([0]))
    await run.inside()
    second = asyncio.create_task(b.submit([1], deadline=clock() + 10))  # promised 0.5 s
    await settle()
    clock.advance(1.5)
    run.gate.set()
    assert await asyncio.gather(first, second) == [[0], [10]]
    assert b.batches == 2
    assert b.admission.batch_overrun == pytest.approx(3.0 + 0.3 * (1.0 - 3.0))
    assert b.admission.wait_correction == pytest.approx(1.0 + 0.3 * (3.0 - 1.0))
    await b.aclose()


async def test_until_a_batch_is_timed_one_batch_of_others_rows_may_queue() -> None:
    clock = FakeClock()
    run = Recorder()
    run.gate.clear()
    b = MicroBatcher(
        run,
        name="t",
        max_batch_items=2,
        max_batch_cost=10**6,
        max_wait_s=0,
        max_queue=100,
        calibration=[([1], 0.001)],
        clock=clock,
    )
    busy = asyncio.create_task(b.submit([1]))
    await run.inside()
    queued = [asyncio.create_task(b.submit([i], deadline=clock() + 60)) for i in (2, 3)]
    await settle()
    with pytest.raises(Overloaded, match="2 rows queued"):
        b.check(deadline=clock() + 60)
    b.check()  # without a deadline, max_queue is the bound
    run.gate.set()
    assert await asyncio.gather(busy, *queued) == [[10], [20], [30]]
    b.check(deadline=clock() + 60)
    await b.aclose()
