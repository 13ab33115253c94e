"""Tenants at the front door: the bearer key's tenant (``cascade.tenants``), its limits around
each request, the ``x-ratelimit-*`` headers, and the gateway's keywords for it.

``admit`` (before the body is read) verifies the key, puts the tenant and its grant in the
request's context (``cascade.http.context``) and checks the limits known then; ``gateway_kw``
(once the body is decoded) checks its questions and returns ``Gateway.decide``'s keywords (its
tenant, its policy, its strong answers left, the request's ``Cache-Control``); ``charge`` adds
what the answer cost (cached input tokens at ``[cache] charge_cached``), and ``reservation``'s
end releases the strong answers reserved. ``rate_headers`` (a ``before_send`` hook) puts the
levels seen on every response of the request, errors and 429s included.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection

from cascade import metrics
from cascade.answers import Outcome
from cascade.cache.decision import cache_control
from cascade.errors import TenantLimited, Unauthorized
from cascade.http.context import RequestContext, context_in, context_of
from cascade.http.reload import Access
from cascade.http.services import Services
from cascade.tenants.admission import Grant, TenantAdmission
from cascade.tenants.limits import LimitStore, LocalStore
from cascade.tenants.model import LimitsBackend, Tenant


def bearer(connection: ASGIConnection) -> str | None:
    value = connection.headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def tenant_of(connection: ASGIConnection, access: Access) -> Tenant:
    """The request's tenant (``Unauthorized`` for a missing, wrong or expired key)."""
    tenant = access.tenants.verify(bearer(connection))
    context_of(connection.scope).tenant = tenant
    return tenant


def authorized(connection: ASGIConnection, access: Access) -> bool:
    try:
        tenant_of(connection, access)
    except Unauthorized:
        return False
    return True


def admission_for(backend: LimitsBackend) -> TenantAdmission:
    """The limits' store ``[limits]`` names: this process, or Redis."""
    store: LimitStore = LocalStore()
    if backend.backend == "redis":
        from cascade.tenants.redis_store import RedisLimitStore

        assert backend.url is not None  # checked when the keys file is read
        store = RedisLimitStore(
            backend.url, timeout_s=backend.timeout_s, prefix=backend.prefix, retry_s=backend.retry_s
        )
    return TenantAdmission(store, backend=backend.backend, on_error=backend.on_error)


def admitted(request: Request) -> tuple[Tenant, Grant]:
    """The tenant ``admit`` found for the request, and its grant."""
    context = context_of(request.scope)
    assert context.tenant is not None and context.grant is not None  # admit ran
    return context.tenant, context.grant


def tenant_in(request: Request) -> Tenant:
    """The tenant ``admit`` found for the request."""
    return admitted(request)[0]


@contextmanager
def reservation(request: Request, services: Services) -> Iterator[None]:
    """Around the request's work: its reserved strong answers are released at the end, and a
    429 from its quota is counted."""
    tenant, grant = admitted(request)
    try:
        yield
    except TenantLimited as exc:
        if grant.quota is not None and exc is grant.quota.refused:
            metrics.TENANT_LIMITED.labels(
                tenant=tenant.name, limit="strong_questions_per_min"
            ).inc()
        raise
    finally:
        services.tenant_admission.release(tenant, grant)


async def admit(request: Request, services: Services) -> Tenant:
    """Auth, then the limits checked before the body is read."""
    tenant = tenant_of(request, services.access)
    grant = context_of(request.scope).grant = Grant()
    if tenant.limits.any():
        await services.tenant_admission.before_body(tenant, grant)
    return tenant


async def gateway_kw(request: Request, services: Services, questions: int) -> dict[str, Any]:
    """The questions limit, then ``Gateway.decide``'s keywords for the request's tenant."""
    tenant, grant = admitted(request)
    if tenant.limits.any():
        await services.tenant_admission.after_decode(tenant, questions, grant)
    kw: dict[str, Any] = {
        "policy": tenant.policy,
        "tenant": tenant.name,
        "cache": cache_control(request.headers.get("cache-control", "")),
    }
    if grant.quota is not None:  # the flow keeps the strong tier within it
        kw["quota"] = grant.quota
    return kw


def charged_tokens(outcomes: list[Outcome], charge_cached: float) -> int:
    """The input tokens a tenant is charged: the computed ones, and the cached ones at
    ``charge_cached`` of a token (rounded up)."""
    cached = sum(o.cached_tokens for o in outcomes)
    computed = sum(o.response.usage.input_tokens for o in outcomes) - cached
    return computed + math.ceil(cached * charge_cached)


async def charge(request: Request, services: Services, outcomes: Iterable[Outcome]) -> None:
    """Charge the input tokens and strong-tier questions of the answered ``outcomes``; the
    request's ``x-ratelimit-*`` headers then show the levels after the charge."""
    tenant, grant = admitted(request)
    if not tenant.limits.any():
        return
    gateway = services.gateway
    policy = tenant.policy or gateway.policy
    outcomes = list(outcomes)
    tokens = charged_tokens(outcomes, gateway.cache.config.charge_cached if gateway.cache else 0)
    strong = sum(t == policy.route.strong for o in outcomes for t in o.tiers.values())
    await services.tenant_admission.charge(tenant, tokens=tokens, strong=strong, grant=grant)


async def rate_headers(message: Any, scope: Any) -> None:
    """``before_send``: the request's ``x-ratelimit-*`` headers on its response."""
    context: RequestContext | None = context_in(scope)
    grant = context.grant if context is not None else None
    if message["type"] == "http.response.start" and grant is not None and grant.headers:
        extra = [(k.encode(), v.encode()) for k, v in grant.headers.items()]
        message["headers"] = [*(message.get("headers") or []), *extra]
