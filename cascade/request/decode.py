"""A decoded ``/v1/systemone`` (or batch) body -> validated ``EngineCall``s, without images
(``cascade.request.images`` adds them). Pure and synchronous: the front door runs it on its
decode pool for large bodies; the offline tools call it directly.
"""

from __future__ import annotations

import msgspec

from cascade.answers import check_min_confidence
from cascade.calls import EngineCall
from cascade.errors import PayloadTooLarge, ValidationFailed
from cascade.request.validation import (
    check_batch_answer,
    check_request_text,
    check_state,
    controls_of,
    parse_envelope,
    parse_questions,
)
from cascade.schema import LIMITS, Limits, RequestEnvelope
from cascade.settings import Settings


def limits_of(settings: Settings) -> Limits:
    """The request limits, with the text limits ``settings`` sets."""
    return msgspec.structs.replace(
        LIMITS,
        max_label_chars=settings.max_label_chars,
        max_instructions_chars=settings.max_instructions_chars,
        max_option_chars=settings.max_option_chars,
        max_question_text_chars=settings.max_question_text_chars,
        max_request_text_chars=settings.max_request_text_chars,
        max_batch_answer_bytes=settings.max_batch_answer_bytes,
    )


def text_call(
    body: bytes, request_id: str, limits: Limits = LIMITS
) -> tuple[RequestEnvelope, EngineCall]:
    """The validated call of a body, without its images (``read_call`` adds them)."""
    env = parse_envelope(body)
    if env.state is None:
        raise ValidationFailed.at(["state"], "state is required (text, object or array)", "missing")
    chars = check_state(env.state, ["state"], limits)
    questions, question_chars = parse_questions(env, limits)
    check_request_text(chars + question_chars, limits)
    check_min_confidence(env.min_confidence)
    call = EngineCall(
        state=env.state,
        questions=questions,
        model=env.model,
        controls=controls_of(env),
        request_id=request_id,
    )
    return env, call


def batch_calls(body: bytes, request_id: str, limits: Limits = LIMITS) -> list[EngineCall]:
    """The calls of a ``/v1/systemone/batch`` body, one per state."""
    env = parse_envelope(body)
    if not env.states:
        raise ValidationFailed.at(["states"], "states must be a non-empty array", "missing")
    if len(env.states) > limits.max_batch_states:
        raise PayloadTooLarge(
            f"{len(env.states)} states in a batch; at most {limits.max_batch_states} allowed"
        )
    if env.images or env.assets:
        raise ValidationFailed.at(["images"], "the batch endpoint takes text states only")
    chars = sum(check_state(state, ["states", i], limits) for i, state in enumerate(env.states))
    questions, question_chars = parse_questions(env, limits)
    check_request_text(chars + question_chars, limits)
    check_batch_answer(len(env.states), questions, limits)
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
