"""The Redis backend against a real ``redis-server`` on loopback (a random port, stopped after):
limits shared by two replicas, and a Redis that is down or hung fails within its timeout."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from cascade.tenants.admission import Grant, TenantAdmission
from cascade.tenants.limits import BackendFailed, Check
from cascade.tenants.model import Limits, Tenant
from cascade.tenants.redis_store import RedisStore
from tests.servers import run_redis


def test_two_replicas_share_one_limit_through_redis() -> None:
    async def main(url: str) -> None:
        one, two = (RedisStore(url, timeout_s=1.0, prefix="t1:") for _ in range(2))
        take = [Check("acme:requests", 3)]
        results = [(await store.admit(take)).allowed for store in (one, two, one, two)]
        assert results == [True, True, True, False]
        refused = await two.admit(take)
        assert 19.0 < refused.retry_after_s <= 20.0 and refused.levels[0].remaining == 0
        assert (await one.admit([Check("beta:requests", 3)])).allowed  # another tenant
        await one.charge("acme:tokens", 100, 150)
        assert not (await two.admit([Check("acme:tokens", 100, mode="peek")])).allowed
        looked = await two.admit([Check("acme:tokens", 100, mode="look")])
        assert looked.allowed and looked.levels[0].remaining == 0
        ttl = await one.client.pttl("t1:acme:requests")
        assert 60_000 < ttl <= 61_000  # expires once the bucket is full again
        await one.aclose()
        await two.aclose()

    with run_redis() as (url, _):
        asyncio.run(main(url))


def test_admission_over_redis_counts_every_limit_as_locally() -> None:
    acme = Tenant(name="acme", limits=Limits(requests_per_min=5, questions_per_min=4))

    async def main(url: str) -> None:
        admission = TenantAdmission(RedisStore(url, timeout_s=1.0, prefix="t2:"),
                                    backend="redis")
        grant = Grant()
        await admission.before_body(acme, grant)
        await admission.after_decode(acme, 3, grant)
        assert grant.headers["x-ratelimit-remaining-requests"] == "4"
        assert grant.headers["x-ratelimit-remaining-questions"] == "1"
        with pytest.raises(Exception, match="questions_per_min"):
            await admission.after_decode(acme, 2, Grant())
        await admission.store.aclose()

    with run_redis() as (url, _):
        asyncio.run(main(url))


@pytest.mark.parametrize("fault", ["stopped", "hung"])
def test_a_redis_down_or_hung_fails_within_the_timeout(fault: str) -> None:
    async def main(url: str) -> float:
        store = RedisStore(url, timeout_s=0.2, prefix="t3:")
        assert (await store.admit([Check("k", 5)])).allowed  # connected while it was up
        (proc.send_signal(signal.SIGSTOP) if fault == "hung" else proc.terminate())
        if fault == "stopped":
            proc.wait(timeout=10)
        started = time.monotonic()
        for _ in range(3):
            with pytest.raises(BackendFailed):
                await store.admit([Check("k", 5)])
        elapsed = time.monotonic() - started
        await store.aclose()
        return elapsed

    with run_redis() as (url, proc):
        elapsed = asyncio.run(main(url))
    assert elapsed < 3 * 0.2 + 0.5  # bounded: the timeout, never the OS's TCP timeouts
