"""From the wire to validated ``EngineCall``s: read the body (``cascade.http.reading``), undo its
content coding, split multipart, validate (single and Laya batch), and check its images.

Compressed or large bodies and every image are handled on the ``DecodePool``, never on the event
loop and never on the default executor the engines use.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request

from cascade.answers import check_min_confidence
from cascade.calls import EngineCall
from cascade.errors import (
    PayloadTooLarge,
    UnsupportedMediaType,
    ValidationFailed,
)
from cascade.http.bodies import decode_content, split_multipart
from cascade.http.images import collect_images
from cascade.http.reading import BodyReads, read_body
from cascade.http.validation import check_state, controls_of, parse_envelope, parse_questions
from cascade.http.workers import DecodePool
from cascade.schema import LIMITS, RequestEnvelope
from cascade.settings import Settings

# Bodies above this many bytes are decoded and validated in a worker thread: under it, the
# thread hop costs more than the work.
OFFLOAD_BYTES = 64 * 1024
JSON = "application/json"


async def read_request(
    request: Request, settings: Settings, pool: DecodePool, reads: BodyReads
) -> tuple[bytes, dict[str, Any]]:
    """Decoded JSON bytes and multipart parts (``asset-N`` images) of a request, its body read
    under the ``reads`` budget (``cascade.http.reading``)."""
    raw = await read_body(request, settings, reads)
    content_type = request.headers.get("content-type", JSON)
    media = content_type.split(";", 1)[0].strip().lower()
    multipart = media.startswith("multipart/form-data")
    if not multipart and media not in ("", JSON, "text/json") and not media.endswith("+json"):
        raise UnsupportedMediaType(
            f"unsupported content type {media!r}; send application/json or multipart/form-data"
        )
    encoding = request.headers.get("content-encoding")

    def decode() -> tuple[bytes, dict[str, Any]]:
        body = decode_content(raw, encoding, limit=settings.max_body_bytes)
        if multipart:
            return split_multipart(body, content_type, limit_parts=LIMITS.max_images)
        return body, {}

    if encoding or len(raw) > OFFLOAD_BYTES:
        return await pool.run(decode)
    return decode()


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


async def read_call(
    body: bytes, parts: dict[str, Any], pool: DecodePool, *, request_id: str = ""
) -> EngineCall:
    """The call of a ``/v1/systemone`` body. Large bodies are validated, and images checked, on
    ``pool``, so the event loop never waits on them."""
    if len(body) > OFFLOAD_BYTES:
        env, call = await pool.run(text_call, body, request_id)
    else:
        env, call = text_call(body, request_id)
    if env.images or env.assets:
        images = await pool.run(collect_images, env, parts, LIMITS)
        call = msgspec.structs.replace(call, images=images)
    return call


async def read_batch_calls(
    body: bytes, pool: DecodePool, *, request_id: str = ""
) -> list[EngineCall]:
    """The calls of a ``/v1/systemone/batch`` body (large bodies validated on ``pool``)."""
    if len(body) > OFFLOAD_BYTES:
        return await pool.run(_batch_calls, body, request_id)
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
