"""The one table from cascade's error tree to HTTP: each error's status, and ``Retry-After``."""

from __future__ import annotations

import math

from cascade.errors import (
    BodyTimeout,
    CascadeError,
    ClientError,
    ConfigRejected,
    Conflict,
    EngineError,
    EngineFailed,
    EngineTimeout,
    EngineUnavailable,
    Forbidden,
    MalformedBody,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    RestartNeeded,
    RolloutRunning,
    TokensExceeded,
    Unauthorized,
    UnknownModel,
    UnsupportedMediaType,
    UpstreamClientError,
    ValidationFailed,
    clamp_retry_after,
)

STATUS: dict[type[CascadeError], int] = {
    MalformedBody: 400,
    Unauthorized: 401,
    UnknownModel: 400,
    PayloadTooLarge: 413,
    TokensExceeded: 413,
    UnsupportedMediaType: 415,
    BodyTimeout: 408,
    ValidationFailed: 422,
    NotFound: 404,
    Conflict: 409,
    Forbidden: 403,
    RestartNeeded: 409,
    RolloutRunning: 409,
    ConfigRejected: 422,
    ClientError: 400,
    RateLimited: 429,
    Overloaded: 503,
    EngineUnavailable: 503,
    EngineTimeout: 503,
    EngineFailed: 502,
    EngineError: 502,
    CascadeError: 500,
}


def status_of(exc: CascadeError) -> int:
    """The HTTP status for ``exc``: an upstream's own 4xx is passed through, every other error
    takes the nearest class in ``STATUS``."""
    if isinstance(exc, UpstreamClientError) and 400 <= exc.upstream_status < 500:
        return exc.upstream_status
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


# ``/v1/decisions`` answers with the statuses the OpenAI SDK has exception classes for.
DECISIONS_STATUS = {413: 400, 415: 400}


def decisions_status(exc: CascadeError, *, unparsed: bool = False) -> int:
    """The status of ``exc`` on ``/v1/decisions``: an unknown model is 404 (``model_not_found``),
    a body that is not JSON (``unparsed``) and a size or media-type refusal are 400, a
    validation error 422; the rest as on System One."""
    if isinstance(exc, UnknownModel):
        return 404
    if unparsed:
        return 400
    status = status_of(exc)
    return DECISIONS_STATUS.get(status, status)


def retry_after_header(seconds: float) -> str:
    """The ``Retry-After`` value for a wait of ``seconds``: whole seconds, 1 to the maximum."""
    clamped = clamp_retry_after(seconds)
    return str(max(1, math.ceil(clamped if clamped is not None else 1.0)))
