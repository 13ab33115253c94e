"""The fleet's shared counters on a real Redis: replicas whose clocks disagree add up in the same
window, and counts a failed sync could not add are added by the next one."""

from __future__ import annotations

import asyncio

import pytest

from cascade.fleet import client, counters
from cascade.fleet.counters import AnswerTally
from tests.servers import run_redis


def test_replicas_with_skewed_clocks_fill_one_window() -> None:
    with run_redis() as (url, _):

        async def run() -> tuple[counters.Counts, counters.Counts]:
            redis = client.connect(url, 1.0)
            a, b = AnswerTally(window_s=60.0), AnswerTally(window_s=60.0)
            # a's clock reads 5000 s, b's 2 s: their own clocks, one Redis clock
            a.add(4998.0, answered=10, strong=2)  # 2 s ago on a's clock
            b.add(2.0, answered=30, strong=5)
            first = await counters.sync(redis, a, 5000.0, 6.0)
            second = await counters.sync(redis, b, 2.0, 6.0)
            await redis.aclose()
            return first, second

        first, second = asyncio.run(run())
    assert (first.answered, first.strong) == (10, 2)
    assert (second.answered, second.strong) == (40, 7)
    assert second.recent == 40 and second.span > 0


def test_a_failed_sync_keeps_its_tally_for_the_next() -> None:
    with run_redis() as (url, proc):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        tally = AnswerTally(window_s=60.0)
        tally.add(10.0, answered=7, strong=3)
        proc.terminate()
        proc.wait(10)

        async def fails() -> None:
            redis = client.connect(url, 0.2)
            try:
                await counters.sync(redis, tally, 11.0, 6.0)
            finally:
                await redis.aclose()

        with pytest.raises(client.errors()):
            asyncio.run(fails())
        with run_redis(port=port) as (again, _):

            async def adds() -> counters.Counts:
                redis = client.connect(again, 1.0)
                try:
                    return await counters.sync(redis, tally, 12.0, 6.0)
                finally:
                    await redis.aclose()

            found = asyncio.run(adds())
    assert (found.answered, found.strong) == (7, 3)
