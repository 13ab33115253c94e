"""Every row names the version that decided it, carried on the decision: a request in flight
while a reload swaps the policy keeps the old one's stamp (before: the writer stamped what was
in force when it wrote the row), and a tenant's own policy is recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.policy.fingerprint import calibration_hash, policy_hash
from cascade.policy.model import (
    Bands,
    Checkpoints,
    ClefTier,
    LayaTier,
    Policy,
    Route,
    Thresholds,
    TypeBands,
)
from cascade.schema import NoulQuestion
from cascade.store.sqlite import SqliteStore, read_rows

POLICY = Policy(
    tiers={"laya": LayaTier(checkpoints=Checkpoints(english="x")), "clef": ClefTier(release="x")},
    route=Route(cheap="laya", strong="clef"),
)


def _call(rid: str) -> EngineCall:
    return EngineCall(
        state="ticket",
        model="jev-latest",
        request_id=rid,
        questions={"u": NoulQuestion(instructions="Urgent?")},
    )


def test_a_request_in_flight_keeps_the_stamp_of_the_version_it_started_on(tmp_path: Path):
    store = SqliteStore(tmp_path / "d.db", replica="replica-a")
    entered, release = asyncio.Event(), asyncio.Event()

    async def cheap(call: EngineCall) -> EngineAnswer:
        if call.request_id == "before":
            entered.set()
            await release.wait()
        return deterministic_answer(call)

    gateway = Gateway(
        POLICY,
        {"laya": FakeEngine("laya", cheap), "clef": FakeEngine("clef")},
        decisions=store,
        weights={"laya": "w1", "clef": "w2"},
    )
    reloaded = msgspec.structs.replace(
        POLICY, thresholds=Thresholds(confidence=TypeBands(noul=Bands(two=0.55)))
    )
    own = msgspec.structs.replace(
        POLICY, thresholds=Thresholds(confidence=TypeBands(noul=Bands(two=0.6)))
    )

    async def run() -> None:
        await gateway.start()
        first = asyncio.create_task(gateway.systemone(_call("before")))
        await entered.wait()
        gateway.reconfigure(reloaded)  # while "before" waits for its cheap answer
        release.set()
        await first
        await gateway.systemone(_call("after"))
        await gateway.decide(_call("own"), tenant="acme", policy=own)
        await gateway.aclose()

    asyncio.run(run())
    store.close()
    rows = {r.request_id: r for r in read_rows(tmp_path / "d.db")}
    assert rows["before"].policy_hash == policy_hash(POLICY) != policy_hash(reloaded)
    assert rows["after"].policy_hash == policy_hash(reloaded)
    assert rows["before"].calibration_hash == calibration_hash(POLICY)
    assert rows["before"].checkpoints == {"laya": "w1", "clef": "w2"}
    assert rows["before"].replica == "replica-a" and rows["before"].tenant_policy_hash is None
    assert (rows["own"].tenant, rows["own"].tenant_policy_hash) == ("acme", policy_hash(own))
    assert rows["own"].policy_hash == policy_hash(reloaded)  # the fleet's version beside it
