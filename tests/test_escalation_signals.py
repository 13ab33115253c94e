"""The cheap-tier signals confidence cannot see, through a gateway: the escalation reason in
the response, the decision log and ``cascade_escalations_total``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.engines.fake import FakeEngine
from cascade.gateway import Gateway
from cascade.http import status
from cascade.novelty.reference import save
from cascade.policy.model import (
    Calibration,
    Checkpoints,
    ClefTier,
    Consistency,
    LayaTier,
    Policy,
    Reference,
    Route,
)
from cascade.schema import ChoiceQuestion, Question
from cascade.store.sqlite import SqliteStore, read_rows
from tests.policy.test_consistency import by_content, by_slot
from tests.policy.test_novelty import reference, vector

POLICY = Policy(
    tiers={"laya": LayaTier(checkpoints=Checkpoints(english="x")), "clef": ClefTier(release="x")},
    route=Route(cheap="laya", strong="clef"),
    consistency=Consistency(margin=0.5, orders=1),
)
TEAM = ChoiceQuestion(instructions="Which team?", criteria=["billing", "tech", "sales"])


def cheap(call: EngineCall) -> EngineAnswer:
    """Slot-biased on question ids starting with ``moving``, content-true on the rest (the
    order check's rows carry their question's id first)."""

    def probs(qid: str, q: Question) -> list[float]:
        return by_slot(q) if qid.startswith("moving") else by_content(q)

    return EngineAnswer(
        model="laya-fake",
        usage=EngineUsage(input_tokens=len(call.questions)),
        results={
            q: QuestionResult(type=v.type, probabilities=probs(q, v))
            for q, v in call.questions.items()
        },
    )


def test_order_unstable_reaches_the_response_the_log_and_the_metrics(tmp_path: Path):
    gateway = Gateway(
        POLICY,
        {"laya": FakeEngine("laya", cheap), "clef": FakeEngine("clef")},
        weights={"laya": "h1", "clef": "h2"},
    )
    gateway.decisions = SqliteStore(tmp_path / "d.db")
    counter = metrics.ESCALATIONS.labels(reason="order_unstable", type="choice")
    before = counter._value.get()
    call = EngineCall(
        state="charged twice",
        model="jev-latest",
        request_id="r1",
        questions={"moving": TEAM, "steady": TEAM},
    )

    async def serve() -> object:
        await gateway.start()
        try:
            return (await gateway.systemone(call)).response
        finally:
            await gateway.aclose()

    body = msgspec.to_builtins(asyncio.run(serve()))
    gateway.decisions.close()
    assert body["x_cascade"]["reasons"] == {"moving": "order_unstable"}
    assert body["x_cascade"]["tiers"] == {"moving": "clef", "steady": "laya"}
    rows = {r.question_id: r for r in read_rows(tmp_path / "d.db")}
    assert (rows["moving"].final_tier, rows["moving"].reason) == ("clef", "order_unstable")
    assert (rows["steady"].final_tier, rows["steady"].reason) == ("laya", None)
    assert counter._value.get() - before == 1


def near_or_far(call: EngineCall) -> EngineAnswer:
    """Confident answers; rows of ids starting with ``far`` unlike the reference set's."""
    return EngineAnswer(
        model="laya-fake",
        usage=EngineUsage(input_tokens=len(call.questions)),
        results={
            q: QuestionResult(
                type=v.type, probabilities=by_content(v), vector=vector(q.startswith("far"))
            )
            for q, v in call.questions.items()
        },
    )


def test_novel_reaches_the_response_the_log_the_metrics_and_health(tmp_path: Path):
    digest = save(tmp_path / "cal.novelty.npz", reference())
    ref = Reference(file=str(tmp_path / "cal.novelty.npz"), sha256=digest)
    calibrated = msgspec.structs.replace(
        POLICY,
        consistency=Consistency(enabled=False),
        calibration=Calibration(file="cal.toml", reference=ref),
    )
    gateway = Gateway(
        calibrated,
        {"laya": FakeEngine("laya", near_or_far), "clef": FakeEngine("clef")},
        weights={"laya": "w-cheap"},
    )
    gateway.decisions = SqliteStore(tmp_path / "d.db")
    flags = metrics.NOVELTY_FLAGS.labels(type="choice", band="3-5")
    novel = metrics.ESCALATIONS.labels(reason="novel", type="choice")
    before = flags._value.get(), novel._value.get()
    call = EngineCall(
        state="charged twice",
        model="jev-latest",
        request_id="r2",
        questions={"far": TEAM, "near": TEAM},
    )

    async def serve() -> object:
        await gateway.start()
        try:
            return (await gateway.systemone(call)).response
        finally:
            await gateway.aclose()

    body = msgspec.to_builtins(asyncio.run(serve()))
    gateway.decisions.close()
    assert body["x_cascade"]["reasons"] == {"far": "novel"}
    rows = {r.question_id: r for r in read_rows(tmp_path / "d.db")}
    assert (rows["far"].final_tier, rows["far"].reason) == ("clef", "novel")
    assert rows["near"].reason is None
    assert (flags._value.get() - before[0], novel._value.get() - before[1]) == (1, 1)
    seen = status.health(gateway)["novelty"]
    assert seen["on"] and seen["cells"] == sorted(reference().cells) and seen["bytes"] > 0
    bare = Gateway(
        msgspec.structs.replace(POLICY, calibration=Calibration(file="old.toml")),
        {"laya": FakeEngine("laya"), "clef": FakeEngine("clef")},
    )
    assert status.health(bare)["novelty"] == {
        "on": False,
        "why": "calibration old.toml has no reference set",
    }
