"""``FleetRefit``'s intervals on a fake clock, with a real ``redis-server`` holding the lease: the
holder reads the store once per ``refit_interval_s`` of its clock, and a holder whose read
failed takes no lease for one interval of it. (The lease's own ttl is Redis's clock:
tests/fleet/test_refit.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from cascade.control.evidence import Labelled
from cascade.control.fleetrefit import KEY, FleetRefit
from cascade.control.live import LiveControl
from cascade.fleet import client
from cascade.policy.model import Policy
from tests.control.load import Clock, policy
from tests.servers import run_redis

INTERVAL_S = 1.0
LABELS = [
    Labelled(
        type="noul",
        band="2",
        confidence=0.5 + i / 100,
        correct=i % 5 != 0,
        source="feedback",
        ts=float(i),
        asked=str(i),
    )
    for i in range(50)
]


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with run_redis() as (url, _):
        yield url


class Store:
    """The fleet's judged answers: counts its reads; unreachable while ``down``."""

    def __init__(self) -> None:
        self.reads = 0
        self.down = False

    def __call__(self, _: Policy) -> list[Labelled]:
        self.reads += 1
        if self.down:
            raise ConnectionError("the store is unreachable from this replica")
        return LABELS


def _refit(url: str, store: Store, clock: Clock) -> FleetRefit:
    served = policy(
        target_accuracy=0.6,
        min_labels=5,
        refit_interval_s=INTERVAL_S,
        scope="fleet",
        url=url,
        timeout_s=1.0,
        sync_s=0.25,
    )
    return FleetRefit(LiveControl(served, clock=clock), store, "one", clock=clock)


def test_the_holder_reads_the_store_once_per_refit_interval_of_its_clock(redis_url: str) -> None:
    async def run() -> None:
        store, clock = Store(), Clock()
        refit = _refit(redis_url, store, clock)
        config = refit.control.policy.control
        assert config is not None
        redis = client.connect(redis_url, 1.0)
        try:
            assert await refit.step(redis, config) and refit.holder and store.reads == 1
            for _ in range(3):  # syncs within the interval: the lease renewed, no read
                clock.now += (INTERVAL_S - 0.01) / 3
                assert await refit.step(redis, config) and refit.holder
            assert store.reads == 1
            clock.now = INTERVAL_S
            assert await refit.step(redis, config) and store.reads == 2
        finally:
            await refit.aclose(redis, config)
            await redis.aclose()

    asyncio.run(run())


def test_a_holder_whose_read_failed_takes_no_lease_for_one_interval_of_its_clock(
    redis_url: str,
) -> None:
    async def run() -> None:
        store, clock = Store(), Clock()
        refit = _refit(redis_url, store, clock)
        config = refit.control.policy.control
        assert config is not None
        redis = client.connect(redis_url, 1.0)
        try:
            store.down = True
            assert not await refit.step(redis, config)  # took the lease, could not read
            assert not refit.holder and await redis.get(KEY) is None  # given back
            store.down = False
            for at in (0.0, INTERVAL_S / 2, INTERVAL_S - 0.01):  # standing aside: free, untaken
                clock.now = at
                assert await refit.step(redis, config)
                assert not refit.holder and await redis.get(KEY) is None
            assert store.reads == 1
            clock.now = INTERVAL_S
            assert await refit.step(redis, config) and refit.holder and store.reads == 2
        finally:
            await refit.aclose(redis, config)
            await redis.aclose()

    asyncio.run(run())
