"""A two-tier gateway with fake tiers (a cheap "laya" unsure of the question ``unsure``, so it
escalates to "clef"), and tracing to a test receiver."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import msgspec
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler

from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.model import (
    Bands,
    Checkpoints,
    ClefTier,
    LayaTier,
    Models,
    Policy,
    Route,
    Thresholds,
    TypeBands,
)
from cascade.settings import Settings
from cascade.store.base import DecisionStore
from cascade.tracing.active import installed
from cascade.tracing.config import build
from cascade.tracing.otel import OtelTracing

MODEL = "jev-latest"
BODY: dict[str, Any] = {
    "model": MODEL,
    "state": {"ticket": "I was charged twice"},
    "questions": {
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "unsure": {"type": "noul", "instructions": "Is it spam?"},
    },
}


def laya(call: EngineCall) -> EngineAnswer:
    answer = deterministic_answer(call)
    if "unsure" in answer.results:  # a coin toss: escalated on confidence
        answer.results["unsure"] = msgspec.structs.replace(
            answer.results["unsure"], probabilities=[0.5, 0.5]
        )
    return answer


def app(decisions: DecisionStore | None = None, **settings: Any) -> Any:
    policy = Policy(
        tiers={
            "laya": LayaTier(checkpoints=Checkpoints(english="x")),
            "clef": ClefTier(release="x"),
        },
        models=Models(cascade=[MODEL, "gpt-6-luna"]),
        route=Route(cheap="laya", strong="clef"),
        thresholds=Thresholds(confidence=TypeBands(noul=Bands(two=0.55))),
    )
    engines = {"laya": FakeEngine("laya", laya), "clef": FakeEngine("clef")}
    return create_app(Settings(**settings), Gateway(policy, engines, decisions=decisions))


@contextlib.contextmanager
def tracing_to(url: str, sampler: Sampler | None = None) -> Iterator[OtelTracing]:
    """Tracing exported to the receiver at ``url``, installed for the block, then shut down
    (the SDK's default sampler: a caller's sampling decision stands, else every trace)."""
    tracing = build(
        OTLPSpanExporter(endpoint=url + "/v1/traces", timeout=5),
        sampler=sampler or ParentBased(ALWAYS_ON),
    )
    try:
        with installed(tracing):
            yield tracing
    finally:
        tracing.shutdown()
