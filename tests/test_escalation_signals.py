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
from cascade.policy.model import Checkpoints, ClefTier, Consistency, LayaTier, Policy, Route
from cascade.schema import ChoiceQuestion, Question
from cascade.store.sqlite import SqliteStore, read_rows
from tests.policy.test_consistency import by_content, by_slot

POLICY = Policy(tiers={"laya": LayaTier(checkpoints=Checkpoints(english="x")),
                       "clef": ClefTier(release="x")},
                route=Route(cheap="laya", strong="clef"),
                consistency=Consistency(margin=0.5, orders=1))
TEAM = ChoiceQuestion(instructions="Which team?", criteria=["billing", "tech", "sales"])


def cheap(call: EngineCall) -> EngineAnswer:
    """Slot-biased on question ids starting with ``moving``, content-true on the rest (the
    order check's rows carry their question's id first)."""
    def probs(qid: str, q: Question) -> list[float]:
        return by_slot(q) if qid.startswith("moving") else by_content(q)
    return EngineAnswer(model="laya-fake", usage=EngineUsage(input_tokens=len(call.questions)),
                        results={q: QuestionResult(type=v.type, probabilities=probs(q, v))
                                 for q, v in call.questions.items()})


def test_order_unstable_reaches_the_response_the_log_and_the_metrics(tmp_path: Path):
    gateway = Gateway(POLICY, {"laya": FakeEngine("laya", cheap), "clef": FakeEngine("clef")},
                      weights={"laya": "h1", "clef": "h2"})
    gateway.decisions = SqliteStore(tmp_path / "d.db")
    counter = metrics.ESCALATIONS.labels(reason="order_unstable", type="choice")
    before = counter._value.get()
    call = EngineCall(state="charged twice", model="jev-latest", request_id="r1",
                      questions={"moving": TEAM, "steady": TEAM})

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
