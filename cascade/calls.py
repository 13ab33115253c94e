"""Validated ``EngineCall``s from decoded request bodies (single and Laya batch)."""

from __future__ import annotations

from typing import Any

from cascade.answers import check_min_confidence
from cascade.engines.base import EngineCall
from cascade.errors import PayloadTooLarge, ValidationFailed
from cascade.images import collect_images
from cascade.schema import LIMITS
from cascade.validation import check_state, controls_of, parse_envelope, parse_questions


def build_call(body: bytes, parts: dict[str, Any], *, request_id: str = "") -> EngineCall:
    env = parse_envelope(body)
    if env.state is None:
        raise ValidationFailed.at(["state"], "state is required (text, object or array)", "missing")
    check_state(env.state, ["state"])
    questions = parse_questions(env)
    check_min_confidence(env.min_confidence)
    return EngineCall(
        state=env.state,
        questions=questions,
        model=env.model,
        images=collect_images(env, parts, LIMITS),
        controls=controls_of(env),
        request_id=request_id,
    )


def build_batch_calls(body: bytes, *, request_id: str = "") -> list[EngineCall]:
    env = parse_envelope(body)
    if not env.states:
        raise ValidationFailed.at(["states"], "states must be a non-empty array", "missing")
    if len(env.states) > LIMITS.max_batch_states:
        raise PayloadTooLarge(
            f"{len(env.states)} states in a batch; at most {LIMITS.max_batch_states} allowed"
        )
    for i, state in enumerate(env.states):
        check_state(state, ["states", i])
    questions = parse_questions(env)
    check_min_confidence(env.min_confidence)
    controls = controls_of(env)
    return [
        EngineCall(
            state=state,
            questions=questions,
            model=env.model,
            controls=controls,
            request_id=f"{request_id}/{i}",
        )
        for i, state in enumerate(env.states)
    ]
