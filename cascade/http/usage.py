"""``GET /v1/usage``: the caller's own tenant's usage, from the gateway's ``UsageBook``
(``cascade.tenants.usage``): requests, questions, input tokens and cost, by UTC day and tier,
as this replica counted them. The key names the tenant; no parameter can name another."""

from __future__ import annotations

from litestar import Request, Response, get

from cascade.http import tenancy
from cascade.http.openapi import AUTH_ERRORS, AUTHENTICATED, operation
from cascade.http.services import Services
from cascade.schema import UsageReport, encoder


@get(
    "/v1/usage",
    summary="Your own usage on this replica, by UTC day and tier",
    operation_class=operation(None, UsageReport, AUTH_ERRORS),
    security=AUTHENTICATED,
)
async def route(request: Request, services: Services) -> Response[bytes]:
    tenant = tenancy.tenant_of(request, services.access)  # 401 without a valid key (auth on)
    report = services.usage.report(tenant.name)
    return Response(content=encoder.encode(report), status_code=200, media_type="application/json")
