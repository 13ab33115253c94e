"""Decisions to record without running a flow (the store's unit tests)."""

from __future__ import annotations

from collections.abc import Mapping

from cascade.calls import EngineAnswer, EngineUsage
from cascade.policy.flow import Decision
from cascade.policy.routing import PreRoute, QuestionRoute
from cascade.policy.stamp import Stamp

STAMP = Stamp(policy_hash="p" * 64, calibration_hash="c" * 64,
              weights={"laya": "h1", "clef": "h2"}, cheap="laya", strong="clef")


def decided(routes: Mapping[str, QuestionRoute], answers: Mapping[str, EngineAnswer] | None = None,
            degraded: Mapping[str, str] | None = None, checkpoint: str | None = None,
            stamp: Stamp = STAMP) -> Decision:
    return Decision(pre=PreRoute(mode="cascade", cheap_checkpoint=checkpoint, questions={}),
                    escalated={}, routes=dict(routes), degraded=dict(degraded or {}), results={},
                    answers=dict(answers or {}), usage=EngineUsage(input_tokens=0), model="m",
                    shadow=None, stamp=stamp)
