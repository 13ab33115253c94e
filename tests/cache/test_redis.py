"""The Redis store against a real ``redis-server`` on loopback, and Redis down: misses, counted,
never a 5xx."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient
from redis.asyncio import Redis

from cascade import metrics
from cascade.cache.decision import build_cache
from cascade.cache.redis_store import PREFIX, RedisCacheStore
from cascade.http.app import create_app
from cascade.settings import Settings
from tests.cache.helpers import Counting, call, cheap_policy, gateway, per_question
from tests.cache.test_app import BODY
from tests.servers import free_port

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"  # Debian's redis-server


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            REDIS,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def errors(op: str) -> float:
    return metrics.CACHE_ERRORS.labels(op=op)._value.get()


def test_two_gateways_share_answers_through_redis(redis_url: str) -> None:
    """Two replicas: the second answers from what the first computed."""
    policy = cheap_policy(backend="redis", url=redis_url, timeout_s=2.0)

    async def run() -> None:
        first = Counting("laya", per_question, independent=True)
        second = Counting("laya", per_question, independent=True)
        one = gateway(policy, first, cache=build_cache(policy.cache))
        two = gateway(policy, second, cache=build_cache(policy.cache))
        try:
            assert (await one.systemone(call())).headers["x-cascade-cache"] == "miss"
            outcome = await two.systemone(call())
            assert outcome.headers["x-cascade-cache"] == "hit" and second.asked == []
        finally:
            await one.aclose()
            await two.aclose()

    asyncio.run(run())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_entries_are_written_with_the_ttl(redis_url: str) -> None:
    """Each entry carries ``ttl_s`` as Redis's own expiry (``PX``): Redis's clock ends it."""

    async def run() -> None:
        admin = Redis.from_url(redis_url)
        store = RedisCacheStore(redis_url, ttl_s=60.0, timeout_s=2.0, retry_s=1.0)
        try:
            await store.put_many({"k": b"v"})
            assert await store.get_many(["k", "absent"]) == [b"v", None]
            assert 59_000 < await admin.pttl(PREFIX + "k") <= 60_000
        finally:
            await store.aclose()
            await admin.aclose()

    asyncio.run(run())


def test_after_a_failure_redis_is_left_alone_for_retry_s_of_the_clock(redis_url: str) -> None:
    """A write refused by Redis (out of memory): for ``retry_s`` on the store's clock every
    lookup misses and every write is dropped without a word to Redis; then it is asked again."""

    async def run() -> None:
        admin = Redis.from_url(redis_url)
        clock = Clock()
        store = RedisCacheStore(redis_url, ttl_s=60.0, timeout_s=2.0, retry_s=5.0, clock=clock)
        try:
            await admin.set(PREFIX + "k", b"v")
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", "1")  # every write refused: OOM
            put = errors("put")
            await store.put_many({"j": b"w"})
            assert errors("put") == put + 1
            await admin.config_set("maxmemory", "0")
            failed = clock.now

            clock.now = failed + 4.99
            assert await store.get_many(["k"]) == [None]  # there, but not asked for
            await store.put_many({"j": b"w"})
            stats = await admin.info("commandstats")
            assert "cmdstat_mget" not in stats  # and the only writes: ours, and the refused one
            assert (stats["cmdstat_set"]["calls"], stats["cmdstat_set"]["rejected_calls"]) == (1, 1)
            assert not await admin.exists(PREFIX + "j")

            clock.now = failed + 5.0
            assert await store.get_many(["k"]) == [b"v"]
            await store.put_many({"j": b"w"})
            assert await admin.get(PREFIX + "j") == b"w"
            assert errors("put") == put + 1
        finally:
            await store.aclose()
            await admin.aclose()

    asyncio.run(run())


@pytest.mark.slow
def test_redis_down_is_a_counted_miss_never_a_5xx() -> None:
    policy = cheap_policy(
        backend="redis", url=f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2, retry_s=0.5
    )
    engine = Counting("laya", per_question, independent=True)
    get, put = errors("get"), errors("put")
    with TestClient(
        create_app(Settings(), gateway(policy, engine, cache=build_cache(policy.cache)))
    ) as c:
        started = time.monotonic()
        responses = [c.post("/v1/systemone", json=BODY) for _ in range(3)]
        took = time.monotonic() - started
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert [r.headers["x-cascade-cache"] for r in responses] == ["miss"] * 3
    assert len(engine.asked) == 3
    assert errors("get") == get + 1  # then Redis is left alone for retry_s: no wait per request
    assert errors("put") == put
    assert took < 3.0


@pytest.mark.slow
def test_a_hung_redis_is_bounded_by_the_timeout() -> None:
    """A listener that never answers (a stopped Redis): each lookup waits at most timeout_s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]

    async def run() -> float:
        store = RedisCacheStore(
            f"redis://127.0.0.1:{port}/0", ttl_s=60, timeout_s=0.2, retry_s=0.01
        )
        try:
            started = time.monotonic()
            assert await store.get_many(["k"]) == [None]
            await store.put_many({"k": b"v"})
            return time.monotonic() - started
        finally:
            await store.aclose()

    try:
        get = errors("get")
        took = asyncio.run(run())
    finally:
        listener.close()
    assert took < 1.5
    assert errors("get") == get + 1
