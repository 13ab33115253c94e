"""A tenant's admission against its own limits; never waits on another tenant.

Two checks per request, each one call to the store and none of them blocking: before the body
is read, ``requests_per_min`` (charged) and ``input_tokens_per_min`` (refused once the tenant is
over: tokens are known only after the answer, ``charge`` adds them then); once the body is
decoded, ``questions_per_min`` (charged: a batch's states × questions) and a look at
``strong_questions_per_min``, from which the request reserves its ``StrongQuota``
(``cascade.policy.quota``: the flow keeps the strong tier within it; the strong answers are
charged after the answer). ``max_inflight`` counts states in flight in this process (a batch of
64 is 64). Over a limit: ``TenantLimited`` (429 + Retry-After). Every level checked goes into
the response's ``x-ratelimit-*`` headers.

A store that fails or is slow (``BackendFailed``) is counted in
``cascade_limits_backend_errors_total`` and answered as ``[limits] on_error`` says: ``open``
admits, ``closed`` refuses with 503 + Retry-After; so is a store resting after a failure
(``BackendResting``), without a call and uncounted. ``charge`` is one call too, its levels the
response's headers: what is left after the answer.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from cascade import metrics
from cascade.errors import Overloaded, TenantLimited
from cascade.policy.quota import StrongQuota
from cascade.tenants.limits import (
    WINDOW_S,
    BackendFailed,
    BackendResting,
    Check,
    LimitLevel,
    LimitStore,
    LimitVerdict,
)
from cascade.tenants.model import Tenant

log = logging.getLogger("cascade")
# The header suffix of each limit (OpenAI's names for requests and tokens).
HEADER = {
    "requests_per_min": "requests",
    "input_tokens_per_min": "tokens",
    "questions_per_min": "questions",
}


def reset_text(seconds: float) -> str:
    """A reset time as OpenAI writes it: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s"


def headers(name: str, found: LimitLevel) -> dict[str, str]:
    suffix = HEADER[name]
    return {
        f"x-ratelimit-limit-{suffix}": str(found.limit),
        f"x-ratelimit-remaining-{suffix}": str(found.remaining),
        f"x-ratelimit-reset-{suffix}": reset_text(found.reset_s),
    }


def _refuses(check: Check, found: LimitLevel) -> bool:
    """Whether ``check`` is one that refused, from its level before the charge."""
    need = min(check.cost, check.per_min) if check.mode == "take" else 1
    return check.mode != "look" and found.remaining < need


class Grant:
    """What one request was granted: its headers so far, and its strong answers (None: no
    quota, or its store failed open)."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.quota: StrongQuota | None = None
        self.reserved = 0  # of its tenant's strong answers left, held until ``release``


class TenantAdmission:
    def __init__(
        self,
        store: LimitStore,
        *,
        backend: str = "local",
        on_error: Literal["open", "closed"] = "open",
    ) -> None:
        self.store = store
        self.backend = backend
        self.on_error = on_error
        self.inflight: Counter[str] = Counter()
        self.strong_reserved: Counter[str] = Counter()  # by requests in flight here

    async def before_body(self, tenant: Tenant, grant: Grant) -> None:
        limits = tenant.limits
        checks = {}
        if limits.requests_per_min:
            checks["requests_per_min"] = Check(f"{tenant.name}:requests", limits.requests_per_min)
        if limits.input_tokens_per_min:
            checks["input_tokens_per_min"] = Check(
                f"{tenant.name}:tokens", limits.input_tokens_per_min, mode="peek"
            )
        await self._admit(tenant, checks, grant)

    async def after_decode(self, tenant: Tenant, questions: int, grant: Grant) -> None:
        limits = tenant.limits
        checks = {}
        if limits.questions_per_min:
            checks["questions_per_min"] = Check(
                f"{tenant.name}:questions", limits.questions_per_min, cost=questions
            )
        if limits.strong_questions_per_min:
            checks["strong_questions_per_min"] = Check(
                f"{tenant.name}:strong", limits.strong_questions_per_min, mode="look"
            )
        verdict = await self._admit(tenant, checks, grant)
        if verdict is not None and "strong_questions_per_min" in checks:
            found = verdict.levels[list(checks).index("strong_questions_per_min")]
            self._reserve(tenant, found, questions, grant)

    def _reserve(self, tenant: Tenant, found: LimitLevel, questions: int, grant: Grant) -> None:
        """The request's strong answers: its questions, at most what the tenant has left less
        what its other requests in flight here reserved."""
        per_min, others = found.limit, self.strong_reserved[tenant.name]
        grant.reserved = min(questions, max(0, found.remaining - others))
        self.strong_reserved[tenant.name] += grant.reserved
        # when one more is back, if the reserved answers are all used
        one_back = found.reset_s + (others - per_min + 1) * WINDOW_S / per_min
        grant.quota = StrongQuota(tenant.name, per_min, grant.reserved, max(1.0, one_back))

    def release(self, tenant: Tenant, grant: Grant) -> None:
        """The request is done: its reserved strong answers are charged or no longer wanted."""
        if grant.reserved:
            self.strong_reserved[tenant.name] -= grant.reserved
            if not self.strong_reserved[tenant.name]:
                del self.strong_reserved[tenant.name]
            grant.reserved = 0

    async def _admit(
        self, tenant: Tenant, checks: dict[str, Check], grant: Grant
    ) -> LimitVerdict | None:
        if not checks:
            return None
        try:
            verdict = await self.store.admit(list(checks.values()))
        except BackendFailed as exc:
            self._failed(exc)
            return None
        for name, found in zip(checks, verdict.levels, strict=True):
            if name in HEADER:
                grant.headers.update(headers(name, found))
        if not verdict.allowed:
            pairs = zip(checks, checks.values(), verdict.levels, strict=True)
            limit = next((n for n, c, lv in pairs if _refuses(c, lv)), next(iter(checks)))
            metrics.TENANT_LIMITED.labels(tenant=tenant.name, limit=limit).inc()
            raise TenantLimited(
                f"tenant `{tenant.name}` is over its {limit} ({getattr(tenant.limits, limit)}); "
                f"retry in {math.ceil(verdict.retry_after_s)} s",
                retry_after=verdict.retry_after_s,
            )
        return verdict

    def _counted(self, exc: BackendFailed, doing: str) -> None:
        """A failed call counted and logged; a store resting after one made no call."""
        if not isinstance(exc, BackendResting):
            metrics.LIMITS_BACKEND_ERRORS.labels(backend=self.backend).inc()
            log.warning("limits backend failed %s (%s): %s", doing, self.on_error, exc)

    def _failed(self, exc: BackendFailed) -> None:
        self._counted(exc, "checking")
        if self.on_error == "closed":
            raise Overloaded("the limits backend is unavailable", retry_after=1.0)

    async def charge(
        self, tenant: Tenant, *, tokens: int, strong: int, grant: Grant | None = None
    ) -> None:
        """What the answer cost, known only now: input tokens and strong-tier questions, in
        one call; ``grant``'s headers then show the levels after it."""
        costs = {
            "input_tokens_per_min": ("tokens", tokens),
            "strong_questions_per_min": ("strong", strong),
        }
        checks = {
            name: Check(f"{tenant.name}:{key}", per_min, cost=cost)
            for name, (key, cost) in costs.items()
            if (per_min := getattr(tenant.limits, name)) and cost > 0
        }
        if not checks:
            return
        try:
            levels = await self.store.charge(list(checks.values()))
        except BackendFailed as exc:
            self._counted(exc, "charging")  # the answer is computed: it goes out
            return
        for name, found in zip(checks, levels, strict=True):
            if grant is not None and name in HEADER:
                grant.headers.update(headers(name, found))

    @contextmanager
    def permit(self, tenant: Tenant, count: int = 1) -> Iterator[None]:
        """``max_inflight``: a tenant's states in flight here (a request takes one, a batch
        one more per further state)."""
        limit = tenant.limits.max_inflight
        if limit is not None and self.inflight[tenant.name] + count > limit:
            metrics.TENANT_LIMITED.labels(tenant=tenant.name, limit="max_inflight").inc()
            held = self.inflight[tenant.name]
            raise TenantLimited(
                f"tenant `{tenant.name}` would have {held + count} states in "
                f"flight, over its max_inflight ({limit}; a batch counts its "
                "states)",
                retry_after=1.0,
            )
        self.inflight[tenant.name] += count
        try:
            yield
        finally:
            self.inflight[tenant.name] -= count
            if not self.inflight[tenant.name]:
                del self.inflight[tenant.name]
