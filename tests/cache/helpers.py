"""Fake tiers and gateways for the cache tests: a per-question tier (as Laya is) and a joint one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec

from cascade.cache.decision import DecisionCache
from cascade.cache.store import MemoryStore
from cascade.calls import EngineAnswer, EngineCall, EngineUsage
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.policy.model import Cache, Checkpoints, LayaTier, Policy, UpstreamTier
from cascade.schema import ChoiceQuestion, NoulQuestion, ScoreQuestion

QUESTIONS = {
    "team": ChoiceQuestion(instructions="Which team?", criteria=["billing", "tech", "sales"]),
    "urgent": NoulQuestion(instructions="Urgent?"),
    "anger": ScoreQuestion(instructions="How angry?", criteria=["calm", "upset", "furious"]),
}


def call(state: str = "charged twice", **questions: object) -> EngineCall:
    return EngineCall(state=state, model="jev-latest", questions=questions or dict(QUESTIONS))  # type: ignore[arg-type]


def per_question(call: EngineCall) -> EngineAnswer:
    """Laya-shaped answers: each question's result and row from it and the state alone."""
    answer = deterministic_answer(call)
    state = len(msgspec.json.encode(call.state))
    rows = {qid: state + len(msgspec.json.encode(q)) for qid, q in call.questions.items()}
    dropped = {qid: 3 for qid in call.questions if qid.startswith("long")}
    usage = EngineUsage(
        input_tokens=sum(rows.values()),
        state_tokens=state,
        state_tokens_dropped=max(dropped.values(), default=0),
        truncated_questions=list(dropped),
        dropped=dropped,
        row_tokens=rows,
    )
    return EngineAnswer(model="laya-fake", results=answer.results, usage=usage)


class Counting(FakeEngine):
    """A fake tier that records the question ids of every call it gets."""

    def __init__(
        self,
        name: str,
        handler: Callable[[EngineCall], EngineAnswer],
        *,
        independent: bool,
        gate: asyncio.Event | None = None,
    ) -> None:
        super().__init__(name, handler)
        self.independent_questions = independent
        self.asked: list[list[str]] = []
        self.gate = gate

    async def answer(self, call: EngineCall) -> EngineAnswer:
        self.asked.append(list(call.questions))
        if self.gate is not None:
            await self.gate.wait()
        return await super().answer(call)


def cheap_policy(**cache: object) -> Policy:
    return msgspec.structs.replace(
        Policy.single_tier("laya", LayaTier(checkpoints=Checkpoints(english="x"))),
        cache=Cache(**cache),
    )  # type: ignore[arg-type]


def joint_policy(**cache: object) -> Policy:
    return msgspec.structs.replace(
        Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"])),
        cache=Cache(**cache),
    )  # type: ignore[arg-type]


def gateway(
    policy: Policy, engine: FakeEngine, *, cache: DecisionCache | None = None, profile: str = "laya"
) -> Gateway:
    store = MemoryStore(max_bytes=policy.cache.max_bytes, ttl_s=policy.cache.ttl_s)
    cache = cache or DecisionCache(policy.cache, store)
    return Gateway(policy, {engine.name: engine}, cache=cache, profile=profile)  # type: ignore[arg-type]
