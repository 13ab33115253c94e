"""A tenant's admission against its own limits; never waits on another tenant.

Two checks per request, each one call to the store and none of them blocking: before the body
is read, ``requests_per_min`` (charged) and ``input_tokens_per_min`` (refused once the tenant is
over: tokens are known only after the answer, ``charge`` adds them then); once the body is
decoded, ``questions_per_min`` (charged: a batch's states × questions) and a look at
``strong_questions_per_min`` (over it the tenant is answered by the cheap tier, not refused).
``max_inflight`` is counted in this process. Over a limit: ``TenantLimited`` (429 +
Retry-After). Every level checked goes into the response's ``x-ratelimit-*`` headers.

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
from cascade.tenants.limits import BackendFailed, BackendResting, Check, Level, Store, Verdict
from cascade.tenants.model import Tenant

log = logging.getLogger("cascade")
# The header suffix of each limit (OpenAI's names for requests and tokens).
HEADER = {"requests_per_min": "requests", "input_tokens_per_min": "tokens",
          "questions_per_min": "questions"}


def reset_text(seconds: float) -> str:
    """A reset time as OpenAI writes it: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s"


def headers(name: str, found: Level) -> dict[str, str]:
    suffix = HEADER[name]
    return {f"x-ratelimit-limit-{suffix}": str(found.limit),
            f"x-ratelimit-remaining-{suffix}": str(found.remaining),
            f"x-ratelimit-reset-{suffix}": reset_text(found.reset_s)}


def _refuses(check: Check, found: Level) -> bool:
    """Whether ``check`` is one that refused, from its level before the charge."""
    need = min(check.cost, check.per_min) if check.mode == "take" else 1
    return check.mode != "look" and found.remaining < need


class Grant:
    """What one request was granted: its headers so far, and whether the strong tier may
    answer it."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.escalate = True


class TenantAdmission:
    def __init__(self, store: Store, *, backend: str = "local",
                 on_error: Literal["open", "closed"] = "open") -> None:
        self.store = store
        self.backend = backend
        self.on_error = on_error
        self.inflight: Counter[str] = Counter()

    async def before_body(self, tenant: Tenant, grant: Grant) -> None:
        limits = tenant.limits
        checks = {}
        if limits.requests_per_min:
            checks["requests_per_min"] = Check(f"{tenant.name}:requests",
                                               limits.requests_per_min)
        if limits.input_tokens_per_min:
            checks["input_tokens_per_min"] = Check(f"{tenant.name}:tokens",
                                                   limits.input_tokens_per_min, mode="peek")
        await self._admit(tenant, checks, grant)

    async def after_decode(self, tenant: Tenant, questions: int, grant: Grant) -> None:
        limits = tenant.limits
        checks = {}
        if limits.questions_per_min:
            checks["questions_per_min"] = Check(f"{tenant.name}:questions",
                                                limits.questions_per_min, cost=questions)
        if limits.strong_questions_per_min:
            checks["strong_questions_per_min"] = Check(
                f"{tenant.name}:strong", limits.strong_questions_per_min, mode="look")
        verdict = await self._admit(tenant, checks, grant)
        if verdict is not None and "strong_questions_per_min" in checks:
            grant.escalate = verdict.levels[list(checks).index(
                "strong_questions_per_min")].remaining > 0

    async def _admit(self, tenant: Tenant, checks: dict[str, Check],
                     grant: Grant) -> Verdict | None:
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
                retry_after=verdict.retry_after_s)
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

    async def charge(self, tenant: Tenant, *, tokens: int, strong: int,
                     grant: Grant | None = None) -> None:
        """What the answer cost, known only now: input tokens and strong-tier questions, in
        one call; ``grant``'s headers then show the levels after it."""
        costs = {"input_tokens_per_min": ("tokens", tokens),
                 "strong_questions_per_min": ("strong", strong)}
        checks = {name: Check(f"{tenant.name}:{key}", per_min, cost=cost)
                  for name, (key, cost) in costs.items()
                  if (per_min := getattr(tenant.limits, name)) and cost > 0}
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
        """``max_inflight``: a tenant's requests (a batch: its states) in flight here."""
        limit = tenant.limits.max_inflight
        if limit is not None and self.inflight[tenant.name] + count > limit:
            metrics.TENANT_LIMITED.labels(tenant=tenant.name, limit="max_inflight").inc()
            raise TenantLimited(f"tenant `{tenant.name}` has {limit} requests in flight "
                                "(its max_inflight)", retry_after=1.0)
        self.inflight[tenant.name] += count
        try:
            yield
        finally:
            self.inflight[tenant.name] -= count
            if not self.inflight[tenant.name]:
                del self.inflight[tenant.name]
