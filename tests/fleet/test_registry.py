"""Heartbeats and the fleet reload on a real ``redis-server`` (``cascade.fleet.registry``,
``cascade.fleet.broadcast``): who is seen, for how long, the skew; every listener's outcome, the
refusals and the replicas seen that did not answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from cascade.fleet.broadcast import ask, listen
from cascade.fleet.member import commands, subscriber
from cascade.fleet.registry import Registry, skew
from cascade.schema import ReplicaReload, ReplicaSeen
from tests.servers import run_redis


def seen(name: str, policy: str = "p1", calibration: str = "c1") -> ReplicaSeen:
    return ReplicaSeen(
        replica=name,
        policy_hash=policy,
        calibration_hash=calibration,
        version="0.2.0",
        uptime_s=1.0,
        strong_share=0.1,
    )


def test_skew_counts_the_replicas_off_the_majority_pair() -> None:
    view = skew([seen("c", "p2"), seen("a"), seen("b"), seen("d", "p1", "c2")])
    assert (view.policy_hash, view.calibration_hash) == ("p1", "c1")
    assert view.skew == 2 and view.skewed == ["c", "d"]
    assert [r.replica for r in view.replicas] == ["a", "b", "c", "d"]
    assert skew([]).skew == 0 and skew([]).policy_hash is None
    tie = skew([seen("b", "p2"), seen("a")])  # one each: the first by name holds the majority
    assert tie.policy_hash == "p1" and tie.skewed == ["b"]


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with run_redis() as (url, _):
        yield url


def test_heartbeats_are_seen_with_their_age_until_they_expire(redis_url: str) -> None:
    async def main() -> None:
        client = commands(redis_url)
        await client.flushdb()
        registry = Registry(client, seen_s=0.5)
        await registry.beat(seen("a"))
        await registry.beat(seen("b", "p2"))
        await client.set("cascade:fleet:replica:junk", b"not json")  # another version's
        await client.zadd("cascade:fleet:replicas", {"junk": 9e15})
        await client.set("cascade:fleet:replica:other", seen("other").replica)  # not indexed
        found = await registry.seen()
        assert sorted(r.replica for r in found) == ["a", "b"]
        assert all(0.0 <= r.age_s <= 0.5 for r in found)
        deadline = time.monotonic() + 10
        while await registry.seen() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await registry.seen() == []  # expired: no longer in the fleet
        assert not await client.exists("cascade:fleet:replicas")  # the index expires too
        await client.zadd("cascade:fleet:replicas", {"gone": 0})  # beat long ago
        await registry.beat(seen("c"))
        assert await client.zrange("cascade:fleet:replicas", 0, -1) == [b"c"]  # pruned
        await registry.leave("c")
        assert await registry.seen() == [] and not await client.exists("cascade:fleet:replica:c")
        await client.aclose()

    asyncio.run(main())


def test_a_fleet_reload_lists_every_outcome_refusals_and_the_silent(redis_url: str) -> None:
    async def main() -> None:
        client = commands(redis_url)
        await client.flushdb()
        registry = Registry(client, seen_s=30)
        asked: list[str] = []

        def replica(name: str, outcome: str) -> object:
            async def reload() -> ReplicaReload:
                asked.append(name)
                errors = ["policy.toml:3: error: bad"] if outcome == "rejected" else None
                return ReplicaReload(
                    replica=name,
                    outcome=outcome,  # type: ignore[arg-type]
                    policy_hash="p2" if errors is None else "p1",
                    calibration_hash="c1",
                    errors=errors,
                )

            return reload

        subscribers = [subscriber(redis_url) for _ in range(3)]
        listeners = [
            asyncio.create_task(listen(sub, replica(n, o), 0.1))  # type: ignore[arg-type]
            for sub, (n, o) in zip(
                subscribers, (("a", "applied"), ("b", "applied"), ("c", "rejected")), strict=True
            )
        ]
        for name in ("a", "b", "c", "ghost"):  # ghost beats but listens to nothing
            await registry.beat(seen(name))
        deadline = time.monotonic() + 10
        while (
            await client.pubsub_numsub("cascade:fleet:reload") != [(b"cascade:fleet:reload", 3)]
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.02)

        async def names() -> list[str]:
            return [r.replica for r in await registry.seen()]

        report = await ask(client, "a", timeout_s=5.0, seen=names)
        assert sorted(asked) == ["a", "b", "c"]
        assert [(r.replica, r.outcome) for r in report.replicas] == [
            ("a", "applied"),
            ("b", "applied"),
            ("c", "rejected"),
        ]
        assert report.replicas[2].errors == ["policy.toml:3: error: bad"]
        assert report.refused == ["c"] and report.not_answered == ["ghost"]
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
        for sub in subscribers:
            await sub.aclose()
        await client.aclose()

    asyncio.run(main())


def test_a_reload_that_raises_goes_unanswered_and_the_listener_hears_the_next(
    redis_url: str,
) -> None:
    async def main() -> None:
        client = commands(redis_url)
        await client.flushdb()
        calls = 0

        async def reload() -> ReplicaReload:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug")
            return ReplicaReload(
                replica="a", outcome="unchanged", policy_hash="p", calibration_hash="c"
            )

        sub = subscriber(redis_url)
        listener = asyncio.create_task(listen(sub, reload, 0.1))
        deadline = time.monotonic() + 10
        while (
            await client.pubsub_numsub("cascade:fleet:reload") != [(b"cascade:fleet:reload", 1)]
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.02)

        async def names() -> list[str]:
            return ["a"]

        first = await ask(client, "b", timeout_s=1.0, seen=names)
        assert first.replicas == [] and first.not_answered == ["a"]
        second = await ask(client, "b", timeout_s=5.0, seen=names)
        assert [r.outcome for r in second.replicas] == ["unchanged"] and calls == 2
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await sub.aclose()
        await client.aclose()

    asyncio.run(main())


def test_the_listener_hears_calls_again_once_redis_is_back() -> None:
    """Redis restarted (nothing kept): the listener subscribes again within its retry."""

    async def main() -> None:
        async def reload() -> ReplicaReload:
            return ReplicaReload(
                replica="a", outcome="unchanged", policy_hash="p", calibration_hash="c"
            )

        async def names() -> list[str]:
            return ["a"]

        async def listening(client: aioredis.Redis) -> None:
            deadline = time.monotonic() + 20
            while (
                await client.pubsub_numsub("cascade:fleet:reload") != [(b"cascade:fleet:reload", 1)]
                and time.monotonic() < deadline
            ):
                await asyncio.sleep(0.05)

        with run_redis() as (url, _):
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            sub = subscriber(url)
            listener = asyncio.create_task(listen(sub, reload, 0.1))
            client = commands(url)
            await listening(client)
            assert [r.replica for r in (await ask(client, "b", 5.0, names)).replicas] == ["a"]
            await client.aclose()
        with run_redis(port=port) as (url, _):
            client = commands(url)
            await listening(client)
            report = await ask(client, "b", 5.0, names)
            assert [r.replica for r in report.replicas] == ["a"] and report.not_answered == []
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            await sub.aclose()
            await client.aclose()

    asyncio.run(main())
