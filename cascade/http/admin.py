"""The admin routes, under ``/admin``: operator calls, never client traffic.

Every route of ``router`` passes ``require_admin``: an admin key (``CASCADE_ADMIN_KEYS`` /
``CASCADE_ADMIN_KEYS_FILE``) as ``Authorization: Bearer <key>``. A client key is refused (403),
no or a wrong key is 401, and with no admin key configured every admin route answers 403 (the
routes are off; client auth being off does not open them). They are left out of the public
OpenAPI document (docs/live-control.md). A new admin route goes into ``ROUTES``
(``admin_router`` wires them into each app).

The operator's views of the front door, ``/metrics`` and ``/health``'s details (every tenant's
spend, checkpoint paths, policy hashes, reload errors), take the same admin key
(``operator_view``, ``require_operator``); with no key of either kind configured (auth off)
they are open, as everything is.

Every admin action is one audit record (``cascade.audit``) by the admin key's name and the
caller's address (as the server takes it: uvicorn believes ``X-Forwarded-For`` only from
``FORWARDED_ALLOW_IPS``, by default loopback): reloads (``Reloader.reload``),
dry runs, fleet reloads (as asked here), freeze and unfreeze, a rollout's start, steps,
promotion, abort and rollback (``cascade.http.rollouts``). ``GET /admin/audit`` reads them back.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from litestar import Request, Response, Router, get, post
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from cascade.errors import (
    CascadeError,
    ConfigRejected,
    EngineUnavailable,
    Forbidden,
    Unauthorized,
    ValidationFailed,
)
from cascade.http.dryrun import dry_run, query_number
from cascade.http.errors import status_of
from cascade.http.fleet import fleet, reload_fleet
from cascade.http.reload import Access
from cascade.http.services import Services, services_of
from cascade.http.tenancy import bearer
from cascade.schema import AuditOutcome, AuditPage, ConfigErrorBody, ConfigErrorDetail, encoder

JSON = "application/json"
AUDIT_LIMIT, MAX_AUDIT_LIMIT = 100, 1000
NOT_STORED = (
    "no decision log is configured (--decision-log or [decision_log] file): audit "
    "records go to the log only (logger cascade.audit)"
)


def admin_name(connection: ASGIConnection) -> str | None:
    """The name of the admin key the request holds (``cascade.tenants.admins``); None: none."""
    admins = services_of(connection.app).access.admin_keys
    if not admins.enabled:
        return None
    found = admins.find(bearer(connection))
    return None if found is None else found.name


def _client(connection: ASGIConnection) -> str | None:
    return connection.client.host if connection.client else None


def _is_client(connection: ASGIConnection, access: Access) -> bool:
    tenants = access.tenants
    return bool(tenants.enabled and tenants.find(bearer(connection)) is not None)


def require_admin(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """The guard of every admin route (see the module docstring)."""
    access = services_of(connection.app).access
    if not access.admin_keys.enabled:
        raise Forbidden(
            "the admin routes are off: no admin key is configured (set "
            "CASCADE_ADMIN_KEYS or CASCADE_ADMIN_KEYS_FILE)"
        )
    if admin_name(connection) is not None:
        return
    if _is_client(connection, access):
        raise Forbidden("a client API key cannot use the admin routes; send an admin key")
    raise Unauthorized("missing or invalid admin key (send Authorization: Bearer <admin key>)")


def operator_view(connection: ASGIConnection, access: Access) -> bool:
    """Whether the request may read the operator's views: it holds an admin key, or no key of
    either kind is configured."""
    if not access.admin_keys.enabled:
        return not access.tenants.enabled
    return access.admin_keys.find(bearer(connection)) is not None


def require_operator(connection: ASGIConnection, access: Access, what: str) -> None:
    """``operator_view``, else 403 for a client key and 401 for no or a wrong key; the message
    says how to configure an admin key when none is."""
    if operator_view(connection, access):
        return
    how = (
        ""
        if access.admin_keys.enabled
        else (" (none is configured: set CASCADE_ADMIN_KEYS or CASCADE_ADMIN_KEYS_FILE)")
    )
    if _is_client(connection, access):
        raise Forbidden(f"{what} needs an admin key, not a client API key{how}")
    raise Unauthorized(f"{what} needs an admin key (send Authorization: Bearer <admin key>){how}")


@post("/reload", status_code=200)
async def reload(request: Request, services: Services) -> Response[bytes]:
    """Read the policy, calibration and key files again and swap them in, all or nothing
    (``cascade.http.reload``): 200 with a ``ReloadReport``; 422 (a file fails its checks) or
    409 (a restart is needed) with the ``FILE[:LINE]: error: ...`` lines, nothing changed.
    ``?scope=fleet``: every replica reloads (``cascade.http.fleet``), 200 with each one's
    outcome in a ``FleetReloadReport``. ``?dry_run=1``: nothing is reloaded; the candidate
    (the body's files, or the files on disk) is checked as a reload checks it and replayed on
    the decision log (``cascade.http.dryrun``): 200 with the replay report, or the same 422/409
    refusals."""
    scope = request.query_params.get("scope", "replica")
    if request.query_params.get("dry_run", "0") not in ("0", "false"):
        if scope != "replica":
            raise ValidationFailed(
                [
                    {
                        "loc": ["query", "scope"],
                        "type": "value_error",
                        "msg": "a dry run replays this replica's view only",
                    }
                ]
            )
        return await _dry_run(request, services)
    if scope == "fleet":
        try:
            fleet_report = await reload_fleet(services)
        except CascadeError as exc:
            _audit(request, services, "fleet_reload", "failed", str(exc))
            raise
        kept = [*fleet_report.refused, *fleet_report.not_answered]
        _audit(
            request,
            services,
            "fleet_reload",
            "refused" if kept else "applied",
            f"kept their version: {', '.join(kept)}" if kept else "",
            detail={
                "replicas": {r.replica: r.outcome for r in fleet_report.replicas},
                "not_answered": fleet_report.not_answered,
            },
        )
        return Response(content=encoder.encode(fleet_report), status_code=200, media_type=JSON)
    if scope != "replica":
        raise ValidationFailed(
            [
                {
                    "loc": ["query", "scope"],
                    "type": "value_error",
                    "msg": "scope is `replica` (the default) or `fleet`",
                }
            ]
        )
    reloader = services.reloader
    try:
        report = await reloader.reload(admin_name(request) or "", _client(request))
    except ConfigRejected as exc:
        return _refused("reload refused", reloader.gateway.serving.policy_hash, exc)
    return Response(content=encoder.encode(report), status_code=200, media_type=JSON)


async def _dry_run(request: Request, services: Services) -> Response[bytes]:
    try:
        report = await dry_run(request, services)
    except ConfigRejected as exc:
        _audit(request, services, "dry_run", "refused", "\n".join(exc.lines))
        return _refused("dry run refused", services.gateway.serving.policy_hash, exc)
    _audit(
        request, services, "dry_run", "replayed", f"replayed {report.get('requests', 0)} requests"
    )
    return Response(content=encoder.encode(report), status_code=200, media_type=JSON)


def _audit(
    request: Request,
    services: Services,
    action: str,
    outcome: AuditOutcome,
    message: str = "",
    detail: dict[str, Any] | None = None,
) -> None:
    """One audit record of an admin route that changes nothing this replica's reload reads (a
    fleet reload's own change is each replica's ``reload`` record, by ``fleet``)."""
    hashes = services.reloader.snapshot().hashes
    services.reloader.audit.record(
        action,
        admin_name(request) or "",
        outcome,
        client=_client(request),
        message=message,
        before=hashes,
        after=hashes,
        detail=detail,
    )


def _refused(what: str, serving: str, exc: ConfigRejected) -> Response[bytes]:
    detail = ConfigErrorDetail(
        error_type=exc.error_type,
        lines=exc.lines,
        message=f"{what}; still serving policy {serving[:12]}:\n" + "\n".join(exc.lines),
    )
    return Response(
        content=encoder.encode(ConfigErrorBody(detail=detail)),
        status_code=status_of(exc),
        media_type=JSON,
    )


@get("/control")
async def control(services: Services) -> Response[bytes]:
    """What the live gate applies now and why (``cascade.control.live.LiveControl.status``)."""
    return _control_status(services)


@post("/control/freeze", status_code=200)
async def freeze(request: Request, services: Services) -> Response[bytes]:
    """Hold every threshold where it is: no pacing, no refit, until ``unfreeze``."""
    services.control.freeze()
    _audit(request, services, "freeze", "applied")
    return _control_status(services)


@post("/control/unfreeze", status_code=200)
async def unfreeze(request: Request, services: Services) -> Response[bytes]:
    """Let the pacer and the refit move the thresholds again (unless the policy freezes them)."""
    services.control.unfreeze()
    _audit(request, services, "unfreeze", "applied")
    return _control_status(services)


@get("/audit")
async def audit(request: Request, services: Services) -> Response[bytes]:
    """The newest audit records (``?limit=``, default ``AUDIT_LIMIT``, at most
    ``MAX_AUDIT_LIMIT``) at or after ``?since=`` (unix seconds), oldest first, as an
    ``AuditPage``; ``stored`` false (200, no records) with no decision log configured, 503 when
    the store cannot be read."""
    query = request.query_params
    limit = query_number(query.get("limit"), "limit", AUDIT_LIMIT, high=MAX_AUDIT_LIMIT)
    since = query_number(query.get("since"), "since", 0.0, high=math.inf, real=True)
    log = services.reloader.audit
    if log.target is None:
        page = AuditPage(stored=False, records=[], note=NOT_STORED)
    else:
        try:
            records = await asyncio.wrap_future(log.read(since=since, limit=limit))
        except Exception as exc:  # the store is down or unreadable: 503, never 500
            raise EngineUnavailable(
                f"the audit log cannot be read now ({exc})", retry_after=1.0
            ) from exc
        page = AuditPage(stored=True, records=records)
    return Response(content=encoder.encode(page), status_code=200, media_type=JSON)


@get("/rollout")
async def rollout(services: Services) -> Response[bytes]:
    """The canary (``cascade.http.rollouts``): its versions' hashes, share, step, status,
    start, each arm's counts and the guards' last verdict."""
    return _rollout_status(services)


@post("/rollout/promote", status_code=200)
async def rollout_promote(request: Request, services: Services) -> Response[bytes]:
    """The next step's share, or 100 %: the candidate becomes the served version. 409 when no
    rollout runs."""
    await services.reloader.rollouts.promote(admin_name(request) or "", _client(request))
    return _rollout_status(services)


@post("/rollout/abort", status_code=200)
async def rollout_abort(request: Request, services: Services) -> Response[bytes]:
    """Drop the candidate: the current version serves every request. 409 when no rollout
    runs."""
    await services.reloader.rollouts.abort(admin_name(request) or "", _client(request))
    return _rollout_status(services)


def _rollout_status(services: Services) -> Response[bytes]:
    status = services.reloader.rollouts.status()
    return Response(content=encoder.encode(status), status_code=200, media_type=JSON)


def _control_status(services: Services) -> Response[bytes]:
    status = {**services.control.status(), "fleet": services.gateway.fleet.status()}
    return Response(content=encoder.encode(status), status_code=200, media_type=JSON)


ROUTES = [reload, control, freeze, unfreeze, fleet, audit, rollout, rollout_promote, rollout_abort]


def admin_router() -> Router:
    """``/admin``: ``ROUTES`` behind ``require_admin``, out of the OpenAPI document (one per
    app)."""
    return Router(
        path="/admin", route_handlers=ROUTES, guards=[require_admin], include_in_schema=False
    )
