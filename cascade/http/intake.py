"""From the wire to validated ``EngineCall``s: read the body (``cascade.http.reading``), undo its
content coding, split multipart, then validate (``cascade.request``: single and Laya batch) and
check its images; ``/v1/decisions`` bodies likewise, through their contract's conversion.

Compressed or large bodies and every image are handled on the ``DecodePool``, never on the event
loop and never on the default executor the engines use.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request

from cascade.calls import EngineCall
from cascade.contracts.openai import Decoded, decision_call, relocate
from cascade.errors import UnsupportedMediaType, ValidationFailed
from cascade.http.bodies import decode_content, split_multipart
from cascade.http.reading import BodyReads, read_body
from cascade.http.workers import DecodePool
from cascade.request.decode import batch_calls, text_call
from cascade.request.images import collect_images
from cascade.schema import LIMITS, Limits
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


async def read_call(
    body: bytes,
    parts: dict[str, Any],
    pool: DecodePool,
    *,
    request_id: str = "",
    limits: Limits = LIMITS,
) -> EngineCall:
    """The call of a ``/v1/systemone`` body. Large bodies are validated, and images checked, on
    ``pool``, so the event loop never waits on them."""
    if len(body) > OFFLOAD_BYTES:
        env, call = await pool.run(text_call, body, request_id, limits)
    else:
        env, call = text_call(body, request_id, limits)
    if env.images or env.assets:
        images = await pool.run(collect_images, env, parts, limits)
        call = msgspec.structs.replace(call, images=images)
    return call


async def read_batch_calls(
    body: bytes, pool: DecodePool, *, request_id: str = "", limits: Limits = LIMITS
) -> list[EngineCall]:
    """The calls of a ``/v1/systemone/batch`` body (large bodies validated on ``pool``)."""
    if len(body) > OFFLOAD_BYTES:
        return await pool.run(batch_calls, body, request_id, limits)
    return batch_calls(body, request_id, limits)


async def read_decision(
    body: bytes, pool: DecodePool, *, request_id: str = "", limits: Limits = LIMITS
) -> Decoded:
    """A ``/v1/decisions`` body as a System One call (``cascade.contracts.openai``), its images
    checked on ``pool`` as System One's are; errors name the OpenAI field."""
    if len(body) > OFFLOAD_BYTES:
        decoded = await pool.run(decision_call, body, request_id, limits)
    else:
        decoded = decision_call(body, request_id, limits)
    if decoded.envelope.assets:
        try:
            images = await pool.run(collect_images, decoded.envelope, {}, limits)
        except ValidationFailed as exc:
            raise relocate(exc, decoded.asked, decoded.image_fields) from None
        decoded.call = msgspec.structs.replace(decoded.call, images=images)
    return decoded
