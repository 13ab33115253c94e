"""Rows of two policy versions written through a store's own ``record``/``label``/``shadowed``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.policy.routing import QuestionRoute
from cascade.schema import NoulQuestion
from tests.store.helpers import STAMP, decided

CURRENT, CANDIDATE, UNSEEN = "a" * 64, "b" * 64, "c" * 64


def _answer(tier: str, p_true: float) -> EngineAnswer:
    return EngineAnswer(
        model=tier,
        results={"u": QuestionResult(type="noul", probabilities=[1 - p_true, p_true])},
        usage=EngineUsage(input_tokens=10),
    )


def _call(rid: str) -> EngineCall:
    return EngineCall(
        state="ticket", model="m", request_id=rid, questions={"u": NoulQuestion(instructions="?")}
    )


# (request id, policy hash, final tier, cheap P(true), strong P(true), degraded, label, extra)
ROWS: Sequence[tuple[str, str, str, float | None, float | None, bool, Any, str]] = (
    ("r1", CURRENT, "laya", 0.8, None, False, True, ""),  # cheap, right
    ("r2", CURRENT, "clef", 0.1, 0.9, False, False, ""),  # strong, served True: wrong
    ("r3", CURRENT, "laya", 0.7, None, True, None, ""),  # degraded: cheap stands in
    ("r4", CURRENT, "laya", 0.9, None, False, True, "shadow"),  # served cheap, shadowed: right
    ("r5", CURRENT, "laya", 0.9, None, False, True, "tenant"),  # left out: a tenant's policy
    ("old", CURRENT, "laya", 0.9, None, False, True, "old"),  # left out: before since
    ("r6", CANDIDATE, "laya", 0.3, None, False, True, ""),  # cheap, served False: wrong
    ("r7", CANDIDATE, "clef", 0.4, 0.2, False, False, ""),  # strong, served False: right
    ("r8", CANDIDATE, "clef", None, 0.6, False, True, ""),  # strong only, served True: right
)
OLD_TS, SINCE = 1000.0, 2000.0


def write(store: Any) -> None:
    """Record ``ROWS`` through ``store`` (SQLite or PostgreSQL), then label and shadow them."""

    async def main() -> None:
        for rid, policy, final, cheap, strong, degraded, _, extra in ROWS:
            stamp = msgspec.structs.replace(
                STAMP,
                policy_hash=policy,
                tenant_policy_hash="t" * 64 if extra == "tenant" else None,
            )
            answers = {}
            if cheap is not None:
                answers["laya"] = _answer("laya", cheap)
            if strong is not None:
                answers["clef"] = _answer("clef", strong)
            decision = decided(
                {"u": QuestionRoute(final)},
                answers,
                degraded={"u": "cheap_failed"} if degraded else None,
                stamp=stamp,
            )
            await store.record(_call(rid), decision, 0.01)
            if extra == "shadow":
                store.shadowed(_call(rid), _answer("clef", 0.1), stamp)  # not what it served

    asyncio.run(main())
    for rid, *_, label, _ in ROWS:
        if label is not None:
            assert store.label(rid, {"u": label}).result(10).labelled
