"""The keys file's Structs (``CASCADE_API_KEYS_FILE``): ``[[tenant]]`` tables and ``[limits]``.

Decoding is strict (unknown keys are refused); ``cascade.tenants.files`` checks the values and
locates every finding. A key is stored as ``sha256:<64 hex digits>``, never in the clear.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec

from cascade.policy.model import Policy

PerMinute = Annotated[int, msgspec.Meta(ge=1)]
# Bounded Prometheus label values: a name is short and plain.
TenantName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class _TenantStruct(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Immutable, keyword-only, unknown keys rejected."""


class TenantLimits(_TenantStruct, frozen=True, kw_only=True):
    """A tenant's limits; None is no limit. Per minute, as OpenAI's RPM/TPM are."""

    requests_per_min: PerMinute | None = None
    questions_per_min: PerMinute | None = None
    input_tokens_per_min: PerMinute | None = None
    max_inflight: PerMinute | None = None
    strong_questions_per_min: PerMinute | None = None

    def any(self) -> bool:
        return any(v is not None for v in msgspec.structs.astuple(self))


# Read once, not per tenant.
LIMIT_FIELDS = tuple(f.name for f in msgspec.structs.fields(TenantLimits))


class TenantEntry(TenantLimits, frozen=True, kw_only=True):
    """One ``[[tenant]]`` table."""

    name: TenantName
    keys: list[str] = msgspec.field(default_factory=list)  # "sha256:<hex>" hashes
    policy: str | None = None  # a policy file or an overlay, relative to the keys file
    expires: Annotated[datetime, msgspec.Meta(tz=True)] | None = None

    def limits(self) -> TenantLimits:
        return TenantLimits(**{name: getattr(self, name) for name in LIMIT_FIELDS})


class LimitsBackend(_TenantStruct, frozen=True):
    """``[limits]``: where the counters live. ``local``: per replica; ``redis``: shared by every
    replica using ``url``. ``on_error``: when Redis fails or is slower than ``timeout_s``, and
    for ``retry_s`` after that, admit (``open``) or refuse with 503 + Retry-After (``closed``)."""

    backend: Literal["local", "redis"] = "local"
    url: str | None = None
    on_error: Literal["open", "closed"] = "open"
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=10)] = 0.1
    retry_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 1.0  # after a failure: no calls
    prefix: str = "cascade:limits:"  # Redis key prefix


class KeysFile(_TenantStruct, frozen=True):
    tenant: list[TenantEntry] = msgspec.field(default_factory=list)
    limits: LimitsBackend = msgspec.field(default_factory=LimitsBackend)


class Tenant(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant as the gateway serves it: its policy resolved (None: the gateway's own).
    ``name`` is "" for an unnamed tenant (an inline key, or an old one-key-per-line file)."""

    name: str
    limits: TenantLimits = msgspec.field(default_factory=TenantLimits)
    policy: Policy | None = None
    expires: datetime | None = None


ANONYMOUS = Tenant(name="")  # auth off: every request, no limits
