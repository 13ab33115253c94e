"""The error tree. Errors say what went wrong, never how to answer it: the one table from
these classes to HTTP statuses is ``cascade.http.errors`` (the statuses below are its).

::

    CascadeError
    ├── ClientError                     the client's mistake: always 4xx, never retried
    │   ├── MalformedBody               400 invalid_request_error (broken compression or multipart)
    │   ├── Unauthorized                401 authentication_error
    │   ├── UnknownModel                400 api_usage_error (jevcompat's mock answers the same)
    │   ├── PayloadTooLarge             413 request_too_large (body, state, images, texts)
    │   │   └── TokensExceeded          413 tokens_exceeded (a state over a tier's context)
    │   ├── UnsupportedMediaType        415 invalid_request_error
    │   ├── BodyTimeout                 408 timeout (the body did not arrive in time)
    │   ├── ValidationFailed            422 FastAPI-style ``detail[]``
    │   ├── NotFound                    404 not_found_error (feedback for an unknown request)
    │   ├── Conflict                    409 conflict_error (feedback with the decision log off)
    │   ├── Forbidden                   403 permission_error (a valid key without the right)
    │   ├── ConfigRejected              422 config_error (a reload's files fail their checks)
    │   │   ├── RestartNeeded           409 config_error (a reload that needs new engines)
    │   │   └── RolloutRunning          409 config_error (a reload that changes a running canary)
    │   └── UpstreamClientError         the upstream's own 4xx, its status passed through
    ├── Overloaded                      503 overloaded_error, with Retry-After
    │   └── RateLimited                 429 overloaded_error (an upstream's rate limit)
    │       └── TenantLimited           429 rate_limit_exceeded (a tenant over its limits)
    └── EngineError                     a tier failed; engines raise these, never HTTP codes
        ├── EngineUnavailable           503 + Retry-After (connect failure, down)
        │   └── BreakerOpen             503 + Retry-After (the tier's circuit breaker is open)
        ├── EngineTimeout               503 + Retry-After (a tier's deadline passed)
        └── EngineFailed                502 (an upstream answered garbage or 5xx)

Engines wrap their library's exceptions (httpx, onnxruntime, torch) into ``EngineError``
subclasses at their edge; only ``cascade.http`` knows HTTP statuses.
"""

from __future__ import annotations

import math
from typing import Any

MAX_RETRY_AFTER_S = 3600.0
"""The longest Retry-After cascade emits or believes: an upstream's ``1e400`` or far-future date
means "an hour", never a wait (or a header) without end."""


def clamp_retry_after(seconds: float) -> float | None:
    """``seconds`` within [0, ``MAX_RETRY_AFTER_S``]; None for NaN (no usable value)."""
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


class CascadeError(Exception):
    error_type = "api_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class ClientError(CascadeError):
    error_type = "invalid_request_error"


class MalformedBody(ClientError):
    pass


class Unauthorized(ClientError):
    error_type = "authentication_error"


class UnknownModel(ClientError):
    error_type = "api_usage_error"


class PayloadTooLarge(ClientError):
    error_type = "request_too_large"


class TokensExceeded(PayloadTooLarge):
    """The state does not fit a tier's context and the tier is set to reject, not truncate."""

    error_type = "tokens_exceeded"


class UnsupportedMediaType(ClientError):
    pass


class BodyTimeout(ClientError):
    error_type = "timeout"


class ValidationFailed(ClientError):
    """422. ``items`` are FastAPI-style ``{"loc", "msg", "type"}`` dicts."""

    def __init__(self, items: list[dict[str, Any]], message: str | None = None) -> None:
        # ``message`` (logs, ``cascade route``) defaults to the items' msgs; the wire has items.
        super().__init__(message or "; ".join(str(i["msg"]) for i in items))
        self.items = items

    @classmethod
    def at(cls, loc: list[str | int], msg: str, type_: str = "value_error") -> ValidationFailed:
        return cls([{"loc": ["body", *loc], "msg": msg, "type": type_}])


class NotFound(ClientError):
    """What the request names does not exist (an unknown request id)."""

    error_type = "not_found_error"


class Conflict(ClientError):
    """The request cannot be served in the gateway's current configuration."""

    error_type = "conflict_error"


class UpstreamClientError(ClientError):
    """An upstream refused the request as the client's mistake (a 4xx other than those with a
    class of their own); ``upstream_status`` is what it answered."""

    def __init__(
        self, upstream_status: int, message: str, error_type: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.upstream_status = upstream_status
        self.error_type = error_type


class Overloaded(CascadeError):
    """A bounded queue or admission limit is full. Always carries ``retry_after``."""

    error_type = "overloaded_error"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message, retry_after=retry_after)


class RateLimited(Overloaded):
    """An upstream's rate limit (its 429): back-pressure the client should see as such."""


class EngineError(CascadeError):
    error_type = "engine_error"


class EngineUnavailable(EngineError):
    error_type = "unavailable"

    def __init__(self, message: str, *, retry_after: float = 5.0) -> None:
        super().__init__(message, retry_after=retry_after)


class BreakerOpen(EngineUnavailable):
    """The gateway's breaker for a tier is open: no call was made."""


class StartupRefused(Exception):
    """The gateway did not start: what its start-up raised (an engine that cannot load, with
    what to do), as the command line reports a configuration error (exit status 1)."""


class EngineTimeout(EngineError):
    error_type = "timeout"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message, retry_after=retry_after)


class EngineFailed(EngineError):
    error_type = "upstream_error"


# ---------------------------------------------------------------- reload (cascade.http.admin)


class Forbidden(ClientError):
    """A key that authenticates but does not authorise this route (a client key on /admin)."""

    error_type = "permission_error"


class ConfigRejected(ClientError):
    """A reload whose files fail the checks they pass at boot; ``lines`` are ``FILE[:LINE]:
    error: ...`` lines. Nothing was applied."""

    error_type = "config_error"

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class RestartNeeded(ConfigRejected):
    """A valid reload that changes what an engine is built from: refused, a restart applies it."""


class RolloutRunning(ConfigRejected):
    """A valid reload that would change the versions of a running canary (another candidate, or
    another current version): refused until the rollout is promoted or aborted."""


class TenantLimited(RateLimited):
    """A tenant over one of its own limits (``cascade.tenants.limits``): 429 + Retry-After."""

    error_type = "rate_limit_exceeded"


# ---------------------------------------------------------------- optional packages
# The plain install (no extras) serves ``--upstream`` and pre-exported Laya ONNX; code that needs
# an extra imports it where it runs, and the command line reports a missing one in one line
# naming the extra (``missing_extra``), never a traceback.
DISTRIBUTION = "cascade-router"
# Top-level import name -> the extras that bring it (the first is the one to suggest).
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("export", "gpu"),
    "transformers": ("export", "gpu"),
    "onnx": ("export",),
    "onnxscript": ("export",),
    "accelerate": ("gpu",),
    "matplotlib": ("eval",),
    "tqdm": ("eval",),
    "opentelemetry": ("tracing",),
}


def install_hint(*extras: str) -> str:
    """``pip install 'cascade-router[export,eval]'``."""
    return f"pip install '{DISTRIBUTION}[{','.join(extras)}]'"


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one-line message for an optional package that is not installed (None: ``exc`` is
    about another module, a bug to show with its traceback)."""
    package = (exc.name or "").partition(".")[0]
    extras = EXTRAS.get(package)
    if extras is None:
        return None
    hints = " or ".join(install_hint(extra) for extra in extras)
    return f"{package} is not installed (the {' or '.join(extras)} extra): {hints}"
