"""The version that decides a request, as its decision-log rows name it.

A ``Stamp`` is built once per request from the ``Serving`` it reads at its start (and the
tenant's own policy, when it has one) and carried on the flow's ``Decision``: a row is stamped
by what decided it, never by what a reload put in place while it waited to be written.
"""

from __future__ import annotations

import msgspec


class Stamp(msgspec.Struct, frozen=True, kw_only=True):
    """``policy_hash``/``calibration_hash``: the served version's (``cascade.policy.fingerprint``);
    ``weights``: {tier: content hash} of the in-process tiers; ``tenant``: whose request ("":
    keyless) and ``tenant_policy_hash``: its own policy's hash (None: it has none);
    ``cheap``/``strong``: the deciding policy's tier names (set by the flow); ``trace_id``: the
    OpenTelemetry trace the request ran in (``cascade.tracing``)."""

    policy_hash: str = ""
    calibration_hash: str = ""
    weights: dict[str, str] = msgspec.field(default_factory=dict)
    tenant: str = ""
    tenant_policy_hash: str | None = None
    cheap: str | None = None
    strong: str | None = None
    trace_id: str = ""  # the request's trace (32 hex digits; "": tracing off)
