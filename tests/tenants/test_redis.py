"""The Redis backend against a real ``redis-server`` on loopback (a random port, stopped after):
limits shared by two replicas, a Redis that is down or hung fails within its timeout and is then
left alone for ``retry_s``, and a restarted one is reconnected to without refusing anyone."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time

import pytest

from cascade import metrics
from cascade.errors import Overloaded
from cascade.tenants.admission import Grant, TenantAdmission
from cascade.tenants.limits import BackendFailed, Check
from cascade.tenants.model import Tenant, TenantLimits
from cascade.tenants.redis_store import RedisLimitStore
from tests.servers import run_redis


def test_two_replicas_share_one_limit_through_redis() -> None:
    async def main(url: str) -> None:
        one, two = (RedisLimitStore(url, timeout_s=1.0, prefix="t1:") for _ in range(2))
        take = [Check("acme:requests", 3)]
        results = [(await store.admit(take)).allowed for store in (one, two, one, two)]
        assert results == [True, True, True, False]
        refused = await two.admit(take)
        assert 19.0 < refused.retry_after_s <= 20.0 and refused.levels[0].remaining == 0
        assert (await one.admit([Check("beta:requests", 3)])).allowed  # another tenant
        await one.charge([Check("acme:tokens", 100, cost=150)])
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
    acme = Tenant(name="acme", limits=TenantLimits(requests_per_min=5, questions_per_min=4))

    async def main(url: str) -> None:
        admission = TenantAdmission(
            RedisLimitStore(url, timeout_s=1.0, prefix="t2:"), backend="redis"
        )
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


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stopped", "hung"])
def test_a_redis_down_or_hung_fails_within_the_timeout(fault: str) -> None:
    async def main(url: str) -> float:
        store = RedisLimitStore(url, timeout_s=0.2, prefix="t3:")
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


LIMITED = Tenant(
    name="acme",
    limits=TenantLimits(
        requests_per_min=100,
        questions_per_min=100,
        input_tokens_per_min=1000,
        strong_questions_per_min=10,
    ),
)


async def _request(admission: TenantAdmission) -> Grant:
    """One request's three phases: before the body, once decoded, the charge after the answer."""
    grant = Grant()
    await admission.before_body(LIMITED, grant)
    await admission.after_decode(LIMITED, 2, grant)
    await admission.charge(LIMITED, tokens=10, strong=1, grant=grant)
    return grant


def test_a_hung_redis_is_asked_once_then_left_alone_for_retry_s() -> None:
    """A request's first phase waits out the timeout; its later phases, and every request for
    ``retry_s`` (an injected clock), fail at once without a call, answered as ``on_error``
    says. Before, every phase waited: three or four timeouts per request."""
    errors = metrics.LIMITS_BACKEND_ERRORS.labels(backend="redis")
    now = [0.0]

    async def main(url: str, proc: subprocess.Popen[bytes]) -> None:
        store = RedisLimitStore(url, timeout_s=0.2, prefix="t4:", retry_s=5.0, clock=lambda: now[0])
        admission = TenantAdmission(store, backend="redis", on_error="open")
        closed = TenantAdmission(store, backend="redis", on_error="closed")
        assert (await _request(admission)).headers["x-ratelimit-remaining-tokens"] == "990"
        proc.send_signal(signal.SIGSTOP)
        before = errors._value.get()
        assert (await _request(admission)).headers == {}  # admitted: on_error = "open"
        assert errors._value.get() == before + 1  # one call timed out; the others rested
        for _ in range(3):
            await _request(admission)
        with pytest.raises(Overloaded):
            await closed.before_body(LIMITED, Grant())
        assert errors._value.get() == before + 1  # resting: no call
        now[0] += 5.0
        await _request(admission)
        assert errors._value.get() == before + 2  # asked again once, after retry_s
        proc.send_signal(signal.SIGCONT)
        now[0] += 5.0
        assert "x-ratelimit-remaining-tokens" in (await _request(admission)).headers  # back
        assert errors._value.get() == before + 2
        await store.aclose()

    with run_redis() as (url, proc):
        asyncio.run(main(url, proc))


def test_after_a_restart_dead_pooled_connections_reconnect_once() -> None:
    """Redis killed and started again on its port: each pooled connection it closed is
    reconnected and its command sent again, so ``on_error = "closed"`` refuses no one (it
    refused the first request on each dead connection)."""
    errors = metrics.LIMITS_BACKEND_ERRORS.labels(backend="redis")

    async def main(
        url: str, proc: subprocess.Popen[bytes], restarted: contextlib.ExitStack
    ) -> None:
        store = RedisLimitStore(url, timeout_s=1.0, prefix="t5:")
        admission = TenantAdmission(store, backend="redis", on_error="closed")
        await asyncio.gather(*(admission.before_body(LIMITED, Grant()) for _ in range(4)))
        assert len(store.client.connection_pool._available_connections) == 4
        proc.kill()
        proc.wait(timeout=10)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        restarted.enter_context(run_redis(port=port))
        before = errors._value.get()
        grants = [Grant() for _ in range(8)]
        await asyncio.gather(*(admission.before_body(LIMITED, g) for g in grants))  # no 503
        assert all("x-ratelimit-remaining-requests" in g.headers for g in grants)
        assert errors._value.get() == before
        await store.aclose()

    with run_redis() as (url, proc), contextlib.ExitStack() as restarted:
        asyncio.run(main(url, proc, restarted))
