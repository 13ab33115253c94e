"""MicroBatcher with plain functions: batch formation, max wait, error fan-out, cancel, overload."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest
from prometheus_client import REGISTRY

from cascade.engines.batcher import MicroBatcher
from cascade.errors import EngineFailed, EngineUnavailable, Overloaded
from tests.engines.conftest import FakeClock, Recorder, settle

pytestmark = pytest.mark.anyio


async def test_concurrent_requests_share_a_batch_off_the_loop() -> None:
    run = Recorder()
    b = MicroBatcher(run, name="t", max_batch_items=16, max_batch_cost=10**6, max_wait_s=0.05)
    out = await asyncio.gather(b.submit([1, 2]), b.submit([3]), b.submit([4, 5, 6]))
    assert out == [[10, 20], [30], [40, 50, 60]]
    assert sorted(run.batches[0]) == [1, 2, 3, 4, 5, 6]  # one forward pass for all three
    assert threading.get_ident() not in run.threads and len(run.threads) == 1
    await b.aclose()


async def test_limits_split_batches_and_sort_groups_by_length() -> None:
    run = Recorder()
    seen: list[tuple[int, int]] = []
    b = MicroBatcher(
        run,
        name="t",
        max_batch_items=3,
        max_batch_cost=10**6,
        max_wait_s=0.05,
        sort_key=lambda i: i,
        cost=lambda i: i,
        on_batch=lambda n, cost, _s: seen.append((n, cost)),
    )
    out = await b.submit([1, 100, 2, 101, 3, 102])
    assert out == [10, 1000, 20, 1010, 30, 1020]
    assert sorted(map(sorted, run.batches)) == [[1, 2, 3], [100, 101, 102]]
    assert seen == [(3, 9), (3, 306)]  # cost = rows x widest row
    await b.aclose()


async def test_padded_cost_limit() -> None:
    run = Recorder()
    b = MicroBatcher(
        run, name="t", max_batch_items=100, max_batch_cost=20, cost=lambda i: i, max_wait_s=0.01
    )
    await b.submit([5, 5, 5, 5, 5, 9])
    assert all(len(x) * max(x) <= 20 or len(x) == 1 for x in run.batches)
    assert sum(map(len, run.batches)) == 6
    await b.aclose()


async def test_max_wait_bounds_latency_of_a_lone_request() -> None:
    """A lone request waits for company until ``max_wait_s`` has passed on the batcher's clock,
    then goes in the next batch however few rows it holds."""
    clock, run = FakeClock(), Recorder()
    b = MicroBatcher(
        run, name="t", max_batch_items=64, max_batch_cost=10**6, max_wait_s=60.0, clock=clock
    )
    lone = asyncio.ensure_future(b.submit([7]))
    for _ in range(5):
        await settle()
    assert run.batches == [] and not lone.done()  # held: 0 of its 60 s have passed
    clock.advance(60.0)
    late = asyncio.ensure_future(b.submit([8]))  # wakes the worker, which finds the wait over
    assert await lone == [70] and await late == [80]
    assert run.batches == [[7, 8]]  # 2 of 64 rows: taken for the time, not for being full
    await b.aclose()


async def test_an_exception_reaches_every_caller_in_the_batch() -> None:
    b = MicroBatcher(
        Recorder(fail=RuntimeError("boom")),
        name="t",
        max_batch_items=8,
        max_batch_cost=10**6,
        max_wait_s=0.05,
    )
    results = await asyncio.gather(b.submit([1]), b.submit([2, 3]), return_exceptions=True)
    assert [str(r) for r in results] == ["boom", "boom"]
    await b.aclose()


async def test_wrong_output_count_is_an_engine_failure() -> None:
    b = MicroBatcher(lambda items: items[:-1], name="t", max_batch_items=8, max_batch_cost=99)
    with pytest.raises(EngineFailed, match="1 outputs for 2 rows"):
        await b.submit([1, 2])
    await b.aclose()


async def test_cancelled_callers_rows_are_dropped_before_batching() -> None:
    run = Recorder()
    run.gate.clear()  # hold the worker inside the first batch
    b = MicroBatcher(run, name="t", max_batch_items=1, max_batch_cost=10**6, max_wait_s=0)
    first = asyncio.create_task(b.submit([1]))
    await run.inside()
    doomed = asyncio.create_task(b.submit([2, 3]))
    await settle()
    assert b.queue_depth() == 2
    doomed.cancel()
    await settle()
    assert b.queue_depth() == 0 and b.dropped_rows == 2
    run.gate.set()
    assert await first == [10]
    assert run.batches == [[1]]
    await b.aclose()


async def test_full_queue_answers_overloaded_at_once() -> None:
    run = Recorder()
    run.gate.clear()
    b = MicroBatcher(
        run, name="t", max_batch_items=1, max_batch_cost=10**6, max_wait_s=0, max_queue=2
    )
    busy = asyncio.create_task(b.submit([1]))
    await run.inside()
    waiting = asyncio.create_task(b.submit([2, 3]))
    await settle()
    with pytest.raises(Overloaded) as info:
        await b.submit([4])
    assert info.value.retry_after >= 1.0
    run.gate.set()
    assert await busy == [10] and await waiting == [20, 30]
    await b.aclose()


async def test_padding_limit_keeps_long_and_short_rows_apart() -> None:
    run = Recorder()
    b = MicroBatcher(
        run,
        name="t",
        max_batch_items=8,
        max_batch_cost=10**6,
        cost=lambda i: i,
        sort_key=lambda i: i,
        max_wait_s=0.05,
        max_pad_fraction=0.25,
    )
    await b.submit([100, 10, 11, 95, 12, 400])
    assert sorted(map(sorted, run.batches)) == [[10, 11, 12], [95, 100], [400]]
    await b.aclose()


async def test_batchers_of_one_tier_share_the_queue_depth_gauge() -> None:
    def depth() -> float | None:
        return REGISTRY.get_sample_value("cascade_queue_depth", {"tier": "twin"})

    runs = Recorder(), Recorder()
    a, b = (
        MicroBatcher(run, name=f"twin/{n}", max_batch_items=1, max_batch_cost=10**6, max_wait_s=0)
        for run, n in zip(runs, "ab", strict=True)
    )
    for run in runs:
        run.gate.clear()  # hold each worker inside its first batch
    busy = [asyncio.create_task(a.submit([1])), asyncio.create_task(b.submit([4]))]
    for run in runs:
        await run.inside()
    assert depth() == 0  # both rows are in flight, not waiting
    doomed = asyncio.create_task(a.submit([2, 3]))
    last = asyncio.create_task(a.submit([8]))
    closed = asyncio.create_task(b.submit([5, 6, 7]))
    await settle()
    assert depth() == 6  # 3 rows waiting in a, 3 in b
    doomed.cancel()
    await settle()
    assert depth() == 4
    await b.aclose()
    assert depth() == 1
    for run in runs:
        run.gate.set()
    assert await busy[0] == [10] and await last == [80]
    assert depth() == 0
    with pytest.raises(EngineUnavailable):
        await closed
    await asyncio.gather(busy[1], return_exceptions=True)
    await a.aclose()


# ---------------------------------------------------------------- fair shares and admission


async def test_a_small_request_behind_a_big_batch_is_served_next() -> None:
    """Fair queuing: a one-row request arriving behind a 10-state batch request (one flow, 40
    rows) is served after the batch's first state, not after all of it."""
    run = Recorder()
    run.gate.clear()
    b = MicroBatcher(run, name="t", max_batch_items=4, max_batch_cost=10**6, max_wait_s=0)
    first = asyncio.create_task(b.submit([0]))
    await run.inside()  # row 0 is in flight, the worker blocked in it
    states = [
        asyncio.create_task(b.submit(list(range(100 + 4 * s, 104 + 4 * s)), flow="batch"))
        for s in range(10)
    ]
    await settle()
    small = asyncio.create_task(b.submit([7]))
    await settle()
    run.gate.set()
    assert await small == [70]
    await asyncio.gather(first, *states)
    served = [row for batch in run.batches for row in batch]
    assert served.index(7) <= 1 + 4 + 1  # row 0, the first state's 4 rows, then it
    await b.aclose()


@pytest.mark.slow
async def test_a_burst_on_warm_up_figures_too_kind_is_held_to_its_deadline() -> None:
    """Warm-up timed on an idle machine says a row takes 3.3 ms; under the burst it takes 20 ms.
    Measured before the fix: requests admitted on the warm-up's word waited up to 1.5 times
    their deadline for their batch to start (1.6 with two CPU hogs); now about 1.0 either way.
    The first batches' overrun must scale admission at once."""
    row_s, deadline_s = 0.02, 1.0
    batch_started: dict[int, float] = {}

    def run(items: list[int]) -> list[int]:
        now = time.monotonic()
        batch_started.update((i, now) for i in items)
        time.sleep(row_s * len(items))
        return items

    kind = [([1] * n, n * row_s / 6) for n in (1, 2, 3)]
    b = MicroBatcher(
        run, name="t", max_batch_items=4, max_batch_cost=10**6, max_wait_s=0.002, calibration=kind
    )
    loop = asyncio.get_running_loop()
    stop = loop.time() + 2.5
    ids = itertools.count()
    waits: list[float] = []

    async def client() -> None:  # ignores Retry-After: tries again 20 ms after a refusal
        while loop.time() < stop:
            item, started = next(ids), time.monotonic()
            try:
                await b.submit([item], deadline=loop.time() + deadline_s)
            except Overloaded:
                await asyncio.sleep(0.02)
                continue
            waits.append(batch_started[item] - started)

    await asyncio.gather(*(client() for _ in range(128)))
    await b.aclose()
    assert len(waits) > 60  # the tier stayed busy: 2.5 s of 20 ms rows in fours
    # Before the fix the longest wait was 1.5-1.6 deadlines; now about 1.0. The bound leaves
    # room for a busy CI machine's scheduling (1.23 seen once) and still fails the old code.
    assert max(waits) < 1.35 * deadline_s, max(waits)


async def test_an_idle_batcher_accepts_any_request_and_learns_its_cost() -> None:
    b = MicroBatcher(
        lambda items: [i * 10 for i in items],
        name="t",
        max_batch_items=2,
        max_batch_cost=10**6,
        max_wait_s=0,
    )
    loop = asyncio.get_running_loop()
    assert b.cost_model.seconds([1]) is None  # nothing measured yet
    # 20 rows: far more than any budget would allow behind others, but nothing is ahead
    assert await b.submit(list(range(20)), deadline=loop.time() + 0.001) == [
        i * 10 for i in range(20)
    ]
    assert b.cost_model.seconds([1]) is not None
    await b.aclose()


async def test_a_batch_stops_growing_past_its_time_budget() -> None:
    """Every row of a batch waits for all of it: at 0.05 s a row, a 0.12 s budget takes two
    rows at a time."""
    clock = FakeClock()
    run = Recorder(clock=clock, seconds_per_row=0.05)
    b = MicroBatcher(
        run,
        name="t",
        max_batch_items=8,
        max_batch_cost=10**6,
        max_wait_s=0,
        calibration=[([1], 0.05), ([1, 1], 0.1)],
        max_batch_s=0.12,
        clock=clock,
    )
    run.gate.clear()
    first = asyncio.create_task(b.submit([0]))
    await run.inside()
    rest = [asyncio.create_task(b.submit([i])) for i in range(1, 7)]
    await settle()
    run.gate.set()
    await asyncio.gather(first, *rest)
    assert [len(batch) for batch in run.batches] == [1, 2, 2, 2]
    await b.aclose()
