"""The fleet's refit in process, on a real Redis and a real PostgreSQL: the lease (one holder at
a time, lapsing after its ttl, renewed and given back by its holder only), the store's judged
rows chosen in SQL (the most recent per cell, bounded), one replica fitting on every replica's
labels and both adopting its gate, a gate of another policy skipped, the holder gone and the
other taking over, Redis stopped: the last gate kept, counted and said."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from cascade import metrics
from cascade.calls import EngineCall
from cascade.control.evidence import Labelled
from cascade.control.fleet import FleetLink
from cascade.control.live import LiveControl
from cascade.engines.fake import FakeEngine
from cascade.fleet import client
from cascade.fleet.lease import Lease
from cascade.gateway import Gateway
from cascade.policy.model import Policy
from cascade.schema import NoulQuestion
from cascade.store.judged import shared_evidence
from cascade.store.postgres import PostgresStore, read_judged
from tests.control.load import Clock, policy
from tests.servers import Postgres, run_redis

REQUESTS = 40


async def _lease_rules(url: str) -> None:
    redis = client.connect(url, 1.0)
    a, b = Lease("lease:test", "a"), Lease("lease:test", "b")
    try:
        assert await a.hold(redis, 60) and not await b.hold(redis, 60)  # one holder at a time
        await redis.pexpire("lease:test", 500)
        assert await a.hold(redis, 60)  # renewed by its holder: its full ttl again
        assert await redis.pttl("lease:test") > 50_000
        assert not await b.release(redis) and await redis.get("lease:test") == b"a"
        assert await a.release(redis) and await b.hold(redis, 0.2)  # given back: free
        assert not await a.hold(redis, 60)  # not renewed by another: b's token stays
        deadline = time.monotonic() + 10
        while not await a.hold(redis, 60):  # b stopped renewing: it lapses after 0.2 s
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert await redis.get("lease:test") == b"a" and not await b.hold(redis, 60)
    finally:
        await redis.aclose()


def test_the_lease_has_one_holder_lapses_and_is_renewed_by_its_holder_only() -> None:
    with run_redis() as (url, _):
        asyncio.run(_lease_rules(url))


def _serve(store: PostgresStore, n: int) -> None:
    gateway = Gateway(
        policy(), {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")}, decisions=store
    )

    async def run() -> None:
        await gateway.start()
        for i in range(n):
            await gateway.decide(
                EngineCall(
                    state=f"ticket {i}",
                    model="jev-latest",
                    request_id=f"r{i}",
                    questions={"u": NoulQuestion(instructions="Urgent?")},
                )
            )
        await gateway.aclose()

    asyncio.run(run())


def _label(store: PostgresStore, request_id: str, value: bool) -> None:
    found = store.label(request_id, {"u": value})
    assert found is not None and found.result(10).labelled


def test_the_store_gives_each_cells_most_recent_judged_rows_only(
    postgres: Postgres, tmp_path: Path
) -> None:
    url = postgres.database("judged")
    store = PostgresStore(url, spool=tmp_path / "spool", replica="r1")
    _serve(store, REQUESTS)
    for i in range(0, REQUESTS, 2):
        _label(store, f"r{i}", i % 4 == 0)
    store.close()
    rows = read_judged(url, per_cell=5, shadow=False)
    assert [r.request_id for r in rows] == [f"r{i}" for i in range(30, REQUESTS, 2)]
    assert all(r.label is not None for r in rows)
    assert len(read_judged(url, per_cell=1000, shadow=True)) == REQUESTS // 2


def _fleet_policy(url: str, **kw: Any) -> Policy:
    return policy(
        target_accuracy=0.6,
        min_labels=5,
        refit_interval_s=1.0,
        scope="fleet",
        url=url,
        timeout_s=1.0,
        sync_s=0.5,
        **kw,
    )


async def _two_replicas(
    redis_url: str, store: str, proc: Any, caplog: pytest.LogCaptureFixture
) -> None:
    clocks = [Clock(), Clock()]
    controls = [LiveControl(_fleet_policy(redis_url), clock=c) for c in clocks]
    links = [
        FleetLink(c, replica=name, evidence=functools.partial(shared_evidence, store), clock=k)
        for c, name, k in zip(controls, ("one", "two"), clocks, strict=True)
    ]
    redis = client.connect(redis_url, 1.0)
    config = controls[0].policy.control
    assert config is not None
    try:
        assert await links[0].refit.step(redis, config)  # takes the lease, fits, publishes
        assert await links[1].refit.step(redis, config)  # adopts
        first, second = (link.status() for link in links)
        assert first is not None and second is not None
        assert first["refit"]["replica"] == second["refit"]["replica"] == "one"
        assert first["refit"]["lease"] and not second["refit"]["lease"]
        assert controls[0].thresholds() == controls[1].thresholds()
        fitted = controls[1].status()["refit"]["noul:2"]
        assert fitted["n"] == REQUESTS // 2 and fitted["source"] == "feedback"
        assert controls[0].status()["refit"] == controls[1].status()["refit"]

        # the holder stops renewing: within two intervals the other takes over and fits
        deadline = time.monotonic() + 10
        while not links[1].refit.holder:
            assert time.monotonic() < deadline
            assert await links[1].refit.step(redis, config)
            await asyncio.sleep(0.1)
        assert links[1].status()["refit"]["replica"] == "two"  # type: ignore[index]

        # a replica serving another policy keeps its thresholds
        other = LiveControl(_fleet_policy(redis_url, min_threshold=0.01), clock=Clock())
        third = FleetLink(
            other, replica="three", evidence=functools.partial(shared_evidence, store)
        )
        with caplog.at_level(logging.WARNING, "cascade.control"):
            assert await third.refit.step(redis, config)
            clocks[1].now += 2  # the holder's next interval: a new gate, skipped silently
            assert await links[1].refit.step(redis, config)
            assert await third.refit.step(redis, config)
        assert other.status()["refit"] == {} and third.refit.gate is None
        assert len([r for r in caplog.records if "another policy" in r.message]) == 1

        # Redis stopped: the last gate kept, counted and said
        before = metrics.FLEET_REFIT_ERRORS.labels(stage="lease")._value.get()
        kept = controls[0].thresholds()
        proc.terminate()
        proc.wait(10)
        assert not await links[0].refit.step(redis, config)
        status = links[0].status()
        assert status is not None and not status["refit"]["connected"]
        assert status["refit"]["failing"] == "lease" and status["refit"]["down_since"]
        assert metrics.FLEET_REFIT_ERRORS.labels(stage="lease")._value.get() == before + 1
        assert controls[0].thresholds() == kept
    finally:
        await redis.aclose()


def test_one_replica_fits_on_the_fleets_labels_and_every_replica_adopts_it(
    postgres: Postgres, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store_url = postgres.database("fleet_refit")
    store = PostgresStore(store_url, spool=tmp_path / "spool", replica="r1")
    _serve(store, REQUESTS)
    other = PostgresStore(store_url, spool=tmp_path / "spool2", replica="r2")
    for i in range(0, REQUESTS, 2):  # labels through two replicas' stores
        _label(store if i % 4 else other, f"r{i}", i % 3 != 0)
    store.close()
    other.close()
    with run_redis() as (url, proc):
        asyncio.run(_two_replicas(url, store_url, proc, caplog))


def test_without_a_shared_store_each_replica_refits_alone() -> None:
    control = LiveControl(_fleet_policy("redis://127.0.0.1:1/0"), clock=Clock())
    link = FleetLink(control, replica="one")
    status = link.status()
    assert status is not None and status["refit"] == "replica (no shared store)"
    assert not control.refits_on_fleet()


def test_with_a_shared_store_a_replicas_own_labels_do_not_refit_it() -> None:
    labels = [
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
    refits = []
    for shared in (False, True):
        control = LiveControl(_fleet_policy("redis://127.0.0.1:1/0"), clock=Clock())
        control.shared_store = shared
        control.observe(labels)
        control.gate()
        refits.append(control.status()["refit"])
    assert refits[0]["noul:2"]["n"] == 50 and refits[1] == {}


async def _read_fails_on_one(redis_url: str, store: str) -> None:
    def unreachable(_: Policy) -> list[Labelled]:
        raise ConnectionError("the store is unreachable from this replica")

    clocks = [Clock(), Clock()]
    controls = [LiveControl(_fleet_policy(redis_url), clock=c) for c in clocks]
    evidence = (unreachable, functools.partial(shared_evidence, store))
    links = [
        FleetLink(c, replica=name, evidence=ev, clock=k)
        for c, name, ev, k in zip(controls, ("one", "two"), evidence, clocks, strict=True)
    ]
    redis = client.connect(redis_url, 1.0)
    config = controls[0].policy.control
    assert config is not None
    try:
        before = metrics.FLEET_REFIT_ERRORS.labels(stage="read")._value.get()
        assert not await links[0].refit.step(redis, config)  # takes the lease, cannot read
        assert (
            not links[0].refit.holder and await redis.get("cascade:fleet:lease:refit") is None
        )  # given back at once
        assert metrics.FLEET_REFIT_ERRORS.labels(stage="read")._value.get() == before + 1
        assert await links[1].refit.step(redis, config)  # the other takes it and fits
        assert links[1].refit.holder and links[1].refit.gate is not None
        assert await links[0].refit.step(redis, config)  # stands aside, adopts the gate
        assert not links[0].refit.holder
        assert controls[0].thresholds() == controls[1].thresholds()
        assert controls[0].status()["refit"]["noul:2"]["n"] == REQUESTS // 2
    finally:
        await redis.aclose()


def test_a_holder_that_cannot_read_the_store_gives_the_lease_to_one_that_can(
    postgres: Postgres, tmp_path: Path
) -> None:
    store_url = postgres.database("fleet_refit_read")
    store = PostgresStore(store_url, spool=tmp_path / "spool", replica="r1")
    _serve(store, REQUESTS)
    for i in range(0, REQUESTS, 2):
        _label(store, f"r{i}", i % 3 != 0)
    store.close()
    with run_redis() as (url, _):
        asyncio.run(_read_fails_on_one(url, store_url))
