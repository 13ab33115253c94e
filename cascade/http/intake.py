"""Validated ``EngineCall``s from decoded request bodies (single and Laya batch)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from cascade.answers import check_min_confidence
from cascade.calls import EngineCall
from cascade.errors import PayloadTooLarge, ValidationFailed
from cascade.http.images import collect_images
from cascade.http.validation import check_state, controls_of, parse_envelope, parse_questions
from cascade.schema import LIMITS, RequestEnvelope

# Bodies above this many bytes are decoded and validated in a worker thread: under it, the
# thread hop costs more than the work.
OFFLOAD_BYTES = 64 * 1024


def text_call(body: bytes, request_id: str) -> tuple[RequestEnvelope, EngineCall]:
    """The validated call of a body, without its images (``read_call`` adds them)."""
    env = parse_envelope(body)
    if env.state is None:
        raise ValidationFailed.at(["state"], "state is required (text, object or array)", "missing")
    check_state(env.state, ["state"])
    questions = parse_questions(env)
    check_min_confidence(env.min_confidence)
    call = EngineCall(
        state=env.state,
        questions=questions,
        model=env.model,
        controls=controls_of(env),
        request_id=request_id,
    )
    return env, call


async def read_call(body: bytes, parts: dict[str, Any], *, request_id: str = "") -> EngineCall:
    """The call of a ``/v1/systemone`` body. Large bodies are validated, and images (up to 16 MP
    each) decoded, in a worker thread, so the event loop never waits on them."""
    if len(body) > OFFLOAD_BYTES:
        env, call = await asyncio.to_thread(text_call, body, request_id)
    else:
        env, call = text_call(body, request_id)
    if env.images or env.assets:
        images = await asyncio.to_thread(collect_images, env, parts, LIMITS)
        call = msgspec.structs.replace(call, images=images)
    return call


async def read_batch_calls(body: bytes, *, request_id: str = "") -> list[EngineCall]:
    """The calls of a ``/v1/systemone/batch`` body (large bodies validated in a thread)."""
    if len(body) > OFFLOAD_BYTES:
        return await asyncio.to_thread(_batch_calls, body, request_id)
    return _batch_calls(body, request_id)


def _batch_calls(body: bytes, request_id: str) -> list[EngineCall]:
    env = parse_envelope(body)
    if not env.states:
        raise ValidationFailed.at(["states"], "states must be a non-empty array", "missing")
    if len(env.states) > LIMITS.max_batch_states:
        raise PayloadTooLarge(
            f"{len(env.states)} states in a batch; at most {LIMITS.max_batch_states} allowed"
        )
    if env.images or env.assets:
        raise ValidationFailed.at(["images"], "the batch endpoint takes text states only")
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
