"""The Litestar application: routes, auth, request ids, the error table, health and metrics.

``create_app(settings, gateway=None, drain=None)`` builds the real tiers (``cascade.build``)
only when no gateway is injected; tests inject one with fake engines. The lifespan starts the
engines (``/ready`` turns true after warm-up) and closes them (``/ready`` false again during
shutdown). ``tenants``: the keys file's tenants when already read (``cascade serve`` reads it
before any weights load), else read here (``cascade.tenants.files.load_tenants``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.handlers import BaseRouteHandler
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY
from prometheus_client.exposition import choose_encoder

from cascade import __version__, answers, metrics
from cascade.audit.log import AuditLog
from cascade.cache.decision import combined
from cascade.contracts.openai import decision, error_body, is_unparsed
from cascade.contracts.openai_schema import Decision, DecisionCreate
from cascade.errors import (
    CascadeError,
    ClientError,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    ValidationFailed,
)
from cascade.gateway import Gateway
from cascade.http import feedback, status, tenancy, usage
from cascade.http.admin import admin_router, operator_view, require_operator
from cascade.http.context import context_of
from cascade.http.drain import Drain
from cascade.http.errors import decisions_status, retry_after_header, status_of
from cascade.http.fleet import fleet_lifespan
from cascade.http.gauges import registry_of
from cascade.http.intake import read_batch_calls, read_call, read_decision, read_request
from cascade.http.openapi import (
    AUTH_ERRORS,
    AUTHENTICATED,
    DECISION_ERRORS,
    KEY_OPTIONAL,
    docs_config,
    document,
    operation,
)
from cascade.http.permits import InflightLimit
from cascade.http.reading import BodyReads, ClientGone, closes_connection
from cascade.http.reload import Access, Reloader
from cascade.http.services import KEY as SERVICES
from cascade.http.services import Services, services_of
from cascade.http.view import GatewayView
from cascade.http.workers import DecodePool
from cascade.request.decode import limits_of
from cascade.schema import (
    BatchRequest,
    BatchResponse,
    ErrorBody,
    ErrorDetail,
    Health,
    ModelList,
    Readiness,
    SystemOneRequest,
    SystemOneResponse,
    TotalUsage,
    ValidationErrorBody,
    ValidationItem,
    encoder,
)
from cascade.settings import Settings
from cascade.store import log_target, replica_name
from cascade.tenants.admins import load_admins
from cascade.tenants.files import load_tenants
from cascade.tenants.keys import Tenants
from cascade.tracing import active as tracing
from cascade.tracing import headers as timed

log = logging.getLogger("cascade")
JSON = "application/json"
T = TypeVar("T")
WATCH_AFTER_S = 0.05  # a request still running after this is watched for its client leaving


def require_auth(request: Request, services: Services) -> None:
    """``Unauthorized`` without a valid key; the tenant goes in the request's context
    (``cascade.http.tenancy``; without keys auth is off)."""
    tenancy.tenant_of(request, services.access)


def _error_headers(exc: CascadeError) -> dict[str, str]:
    headers = {}
    if isinstance(exc, Unauthorized):  # RFC 6750: every 401 names the scheme to use
        headers["www-authenticate"] = 'Bearer realm="cascade"'
    if exc.retry_after is not None:
        headers["retry-after"] = retry_after_header(exc.retry_after)
    return headers


def error_response(exc: CascadeError) -> Response[bytes]:
    status = status_of(exc)
    if isinstance(exc, ValidationFailed):
        items = [msgspec.convert(item, ValidationItem) for item in exc.items]
        content = encoder.encode(ValidationErrorBody(detail=items))
    else:
        body = ErrorBody(detail=ErrorDetail(error_type=exc.error_type, message=exc.message))
        content = encoder.encode(body)
    return Response(
        content=content, status_code=status, media_type=JSON, headers=_error_headers(exc)
    )


def decisions_error(request: Request, exc: Exception) -> Response[bytes]:
    """Every error of ``/v1/decisions`` in OpenAI's shape and statuses (``decisions_status``)."""
    if isinstance(exc, HTTPException):
        exc = (
            PayloadTooLarge(str(exc.detail))
            if exc.status_code == 413
            else CascadeError(str(exc.detail))
        )
    elif not isinstance(exc, CascadeError):
        log.exception("internal error in request %s", request_id(request.scope))
        exc = CascadeError("internal error")
    elif not isinstance(exc, ClientError | Overloaded):
        log.warning("request %s failed: %s", request_id(request.scope), exc)
    status = decisions_status(exc, unparsed=is_unparsed(exc))
    return Response(
        content=encoder.encode(error_body(exc)),
        status_code=status,
        media_type=JSON,
        headers=_error_headers(exc),
    )


def _handle_cascade_error(request: Request, exc: CascadeError) -> Response[bytes]:
    if not isinstance(exc, ClientError | Overloaded):
        log.warning("request %s failed: %s", request_id(request.scope), exc)
    return error_response(exc)


def _handle_http_exception(request: Request, exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    if status == 413:
        return error_response(PayloadTooLarge(str(exc.detail)))
    kinds = {404: "not_found_error", 405: "invalid_request_error"}
    body = ErrorBody(
        detail=ErrorDetail(error_type=kinds.get(status, "api_error"), message=str(exc.detail))
    )
    return Response(
        content=encoder.encode(body), status_code=status, media_type=JSON, headers=exc.headers
    )


def _handle_unexpected(request: Request, exc: Exception) -> Response[bytes]:
    log.exception("internal error in request %s", request_id(request.scope))
    body = ErrorBody(detail=ErrorDetail(error_type="api_error", message="internal error"))
    return Response(content=encoder.encode(body), status_code=500, media_type=JSON)


def request_id(scope: Any) -> str:
    """The request's id: the client's ``x-request-id`` when sane, else a new one (once)."""
    return context_of(scope).request_id


async def echo_request_id(message: Any, scope: Any) -> None:
    """``before_send`` hook: every response, errors and 404s included, carries the id in
    ``x-request-id`` and ``x-typesafe-request-id`` (the header the official SDKs read). While
    draining, responses close their connection, so clients reconnect to another instance; so do
    the refusals of a body left unread (``cascade.http.reading``)."""
    if message["type"] == "http.response.start":
        rid = request_id(scope).encode()
        extra = [(b"x-request-id", rid), (b"x-typesafe-request-id", rid)]
        if services_of(scope["app"]).drain.active or closes_connection(scope):
            extra.append((b"connection", b"close"))
        message["headers"] = [*(message.get("headers") or []), *extra]


@contextmanager
def _permits(request: Request, services: Services, count: int) -> Iterator[None]:
    """``count`` more states in flight for the request's tenant: against its ``max_inflight``
    (429), then the gateway's permits, shared fairly between tenants (503)."""
    tenant = tenancy.tenant_in(request)
    with (
        services.tenant_admission.permit(tenant, count),
        services.admission.permit(count, tenant=tenant.name),
    ):
        yield


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``, cancelled as soon as the client disconnects (``ClientGone``). Call it once
    the body has been read: from then on the ASGI channel only reports the disconnect.

    ``work`` runs in the request's own task. Once it has run ``WATCH_AFTER_S``, a watcher task
    waits for the disconnect and cancels it; the usual request, answered sooner, makes no task
    (a work task and a watcher for every request cost about an eighth of the app's CPU). A
    cancellation that is not the watcher's (the server shutting down) stays one.
    """
    task = asyncio.current_task()
    assert task is not None  # called from a request handler
    loop = asyncio.get_running_loop()
    gone = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            await asyncio.sleep(WATCH_AFTER_S)  # a server that answers at once must not spin
        gone = True
        task.cancel()

    def start() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(WATCH_AFTER_S, start)
    try:
        return await work
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            raise ClientGone() from None
        raise
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()


def _record(route: str, started: float, outcome: str, status: int) -> None:
    metrics.REQUESTS.labels(route=route, outcome=outcome, status=str(status)).inc()
    metrics.REQUEST_DURATION.labels(route=route).observe(
        time.perf_counter() - started, tracing.exemplar()
    )


def _json(payload: Any, headers: dict[str, str] | None = None) -> Response[bytes]:
    with metrics.HOP_DURATION.labels(hop="encode").time():
        content = encoder.encode(payload)
    return Response(content=content, status_code=200, media_type=JSON, headers=headers or {})


async def _guarded(request: Request, services: Services, route: str, work: Any) -> Response[bytes]:
    """Checks auth, reads and decodes the body, then runs ``work(body, parts)`` under admission,
    recording the request's outcome metrics."""
    started = time.perf_counter()
    try:
        await tenancy.admit(request, services)  # auth, and the tenant's limits
        admitted = time.perf_counter()
        body, parts = await _decoded(request, services)
        decoded = time.perf_counter()
        with _permits(request, services, 1), tenancy.reservation(request, services):
            response, outcome = await work(body, parts)
    except CascadeError as exc:
        status = status_of(exc)
        outcome = "client_error" if status < 500 else "error"
        if isinstance(exc, Overloaded) or status in (429, 503):
            outcome = "overloaded"
        _record(route, started, outcome, status)
        raise
    except ClientGone:
        _record(route, started, "cancelled", 499)  # nginx's "client closed request"
        return Response(content=b"", status_code=499)
    except Exception:
        _record(route, started, "error", 500)
        raise
    _record(route, started, outcome, response.status_code)
    _timed(response, started, admitted, decoded)
    return response


def _timed(response: Response[bytes], started: float, admitted: float, decoded: float) -> None:
    """``Server-Timing``: admission, decode, the tiers' entries ``work`` set, the whole."""
    tiers = response.headers.get(timed.SERVER_TIMING)
    entries = timed.timing({"admission": admitted - started, "decode": decoded - admitted})
    whole = timed.timing({"gateway": time.perf_counter() - started})
    response.headers[timed.SERVER_TIMING] = ", ".join(e for e in (entries, tiers, whole) if e)
    tracing.annotate(lambda: {"cascade.admission_s": admitted - started})


async def _decoded(request: Request, services: Services) -> tuple[bytes, dict[str, Any]]:
    """The request's decoded body and multipart parts, timed as the ``decode`` hop."""
    with metrics.HOP_DURATION.labels(hop="decode").time(), tracing.span("cascade.decode"):
        return await read_request(
            request, services.settings, services.decode_pool, services.body_reads
        )


@post(
    "/v1/systemone",
    status_code=200,
    summary="Answer typed questions about one state",
    operation_class=operation(SystemOneRequest, SystemOneResponse),
    security=AUTHENTICATED,
)
async def systemone(request: Request, services: Services) -> Response[bytes]:
    """System One: ``{model, state, questions, images?, assets?}`` → ``{model, answers, usage}``."""
    gateway, pool = services.gateway, services.decode_pool

    async def work(body: bytes, parts: dict[str, Any]) -> tuple[Response[bytes], str]:
        with metrics.HOP_DURATION.labels(hop="validate").time():
            call = await read_call(
                body, parts, pool, request_id=request_id(request.scope), limits=services.limits
            )
        kw = await tenancy.gateway_kw(request, services, len(call.questions))
        outcome = await unless_disconnected(request, gateway.systemone(call, **kw))
        await tenancy.charge(request, services, [outcome])
        return _json(outcome.response, outcome.headers), outcome.label

    return await _guarded(request, services, "/v1/systemone", work)


@post(
    "/v1/systemone/batch",
    status_code=200,
    summary="Laya's batch: many states, one question set",
    operation_class=operation(BatchRequest, BatchResponse),
    security=AUTHENTICATED,
)
async def systemone_batch(request: Request, services: Services) -> Response[bytes]:
    """``{states: [...], questions}`` → ``{results: [...], total_usage}`` (at most 64 states)."""
    gateway, pool = services.gateway, services.decode_pool

    async def work(body: bytes, parts: dict[str, Any]) -> tuple[Response[bytes], str]:
        if parts:  # the batch takes text states only: refuse images rather than drop them
            raise ValidationFailed.at(["assets"], "the batch endpoint takes text states only")
        with metrics.HOP_DURATION.labels(hop="validate").time():
            calls = await read_batch_calls(
                body, pool, request_id=request_id(request.scope), limits=services.limits
            )
        kw = await tenancy.gateway_kw(request, services, sum(len(c.questions) for c in calls))
        with _permits(request, services, len(calls) - 1):
            outcomes = await unless_disconnected(request, gateway.batch(calls, **kw))
        await tenancy.charge(request, services, outcomes)
        results = [o.response for o in outcomes]
        total = TotalUsage(input_tokens=sum(r.usage.input_tokens for r in results), output_tokens=0)
        label = "degraded" if any(o.label == "degraded" for o in outcomes) else "ok"
        headers = answers.headers(
            Counter(t for o in outcomes for t in o.tiers.values()),
            demo=gateway.demo,
            timings=timed.slowest(o.timings for o in outcomes),
            costs=timed.summed(o.costs for o in outcomes),
        )
        headers["x-cascade-policy"] = outcomes[0].headers["x-cascade-policy"]  # one arm
        if gateway.cache is not None:
            headers["x-cascade-cache"] = combined([o.headers["x-cascade-cache"] for o in outcomes])
        return _json(BatchResponse(results=results, total_usage=total), headers), label

    return await _guarded(request, services, "/v1/systemone/batch", work)


@post(
    "/v1/decisions",
    status_code=200,
    summary="OpenAI's Decisions API: typed questions about an input, through the same cascade",
    operation_class=operation(
        DecisionCreate,
        Decision,
        DECISION_ERRORS,
        body="JSON, optionally Content-Encoding "
        "zstd/gzip/deflate; images as `input_image` parts with data: URLs",
    ),
    security=AUTHENTICATED,
    exception_handlers=dict.fromkeys((CascadeError, HTTPException, Exception), decisions_error),
)
async def decisions(request: Request, services: Services) -> Response[bytes]:
    """``{model, input, questions}`` → ``{model, answers, usage}`` in question order; a question
    only an unavailable tier could answer is a ``refusal`` while the others are answered."""
    gateway, pool = services.gateway, services.decode_pool

    async def work(body: bytes, parts: dict[str, Any]) -> tuple[Response[bytes], str]:
        if parts:
            raise ValidationFailed.at(["input"], "send JSON: images go in input_image parts")
        with metrics.HOP_DURATION.labels(hop="validate").time():
            decoded = await read_decision(
                body, pool, request_id=request_id(request.scope), limits=services.limits
            )
        kw = await tenancy.gateway_kw(request, services, len(decoded.call.questions))
        outcome = await unless_disconnected(
            request, gateway.decide(decoded.call, partial=True, **kw)
        )
        await tenancy.charge(request, services, [outcome])
        return _json(decision(decoded.asked, outcome), outcome.headers), outcome.label

    return await _guarded(request, services, "/v1/decisions", work)


@get(
    "/v1/models",
    summary="Model names this gateway answers to (Jev shape)",
    operation_class=operation(None, ModelList, AUTH_ERRORS),
    security=AUTHENTICATED,
)
async def models(request: Request, services: Services) -> Response[bytes]:
    require_auth(request, services)
    return _json(ModelList(models=status.model_cards(services.view)))


@get(
    "/health",
    summary="Liveness; the loaded checkpoints with a client key; every detail with "
    "an admin key (or with no key configured)",
    operation_class=operation(None, Health, {}),
    security=KEY_OPTIONAL,
)
async def health(request: Request, services: Services) -> Response[bytes]:
    if operator_view(request, services.access):
        return _json(
            {"status": "ok", **status.health(services.view), "config": services.reloader.config()}
        )
    if tenancy.authorized(request, services.access):  # a client key (or client auth off):
        return _json({"status": "ok", **status.client_health(services.view)})  # Laya's reads
    return _json({"status": "ok"})


@get(
    "/ready",
    summary="200 while the cheap tier (or the only tier) can serve; 503 before "
    "warm-up, while draining after SIGTERM, and at shutdown",
    operation_class=operation(None, Readiness, {"503": ("Not ready", Readiness)}),
)
async def ready(services: Services) -> Response[bytes]:
    is_ready = services.ready and not services.drain.active and status.ready(services.view)
    return Response(
        content=encoder.encode(Readiness(ready=is_ready)),
        status_code=200 if is_ready else 503,
        media_type=JSON,
    )


@get("/metrics", summary="Prometheus metrics", include_in_schema=False)
async def prometheus_metrics(request: Request, services: Services) -> Response[bytes]:
    if not services.settings.public_metrics:
        require_operator(request, services.access, "/metrics")
    # the process's metrics, then this app's gateway gauges (read now); OpenMetrics (with the
    # latency histograms' trace-id exemplars) when the scraper asks for it, one "# EOF" last
    encode, media_type = choose_encoder(request.headers.get("accept", ""))
    first = encode(REGISTRY)
    if media_type != CONTENT_TYPE_LATEST:
        first = first.removesuffix(b"# EOF\n")
    return Response(content=first + encode(services.gauges), media_type=media_type)


def _docs_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """With API keys configured, the OpenAPI document and UI need one unless ``public_docs``."""
    services = services_of(connection.app)
    if not services.settings.public_docs and not tenancy.authorized(connection, services.access):
        raise Unauthorized("missing or invalid API key (send Authorization: Bearer <key>)")


def create_app(
    settings: Settings,
    gateway: Gateway | None = None,
    drain: Drain | None = None,
    tenants: Tenants | None = None,
) -> Litestar:
    if gateway is None:
        from cascade.build import build_gateway

        gateway = build_gateway(settings)
    access = Access(
        tenants=tenants or load_tenants(settings, gateway.policy), admin_keys=load_admins(settings)
    )
    audit = AuditLog(log_target(settings, gateway.policy), settings.replica or replica_name())
    view: GatewayView = gateway  # what /health, /ready, /v1/models and the gauges read
    services = Services(
        settings=settings,
        gateway=gateway,
        view=view,
        control=gateway.control,
        learner=gateway.control,
        decisions=gateway.decisions,
        usage=gateway.usage,
        access=access,
        reloader=Reloader(access, settings, gateway, audit),  # SIGHUP and /admin/reload
        admission=InflightLimit(settings.max_inflight),
        limits=limits_of(settings),
        body_reads=BodyReads(settings.max_body_reads, settings.max_body_reads_per_client),
        drain=drain or Drain(),  # begun on SIGTERM by cascade.http.server
        gauges=registry_of(view),
    )
    services.gauges.register(metrics.InflightGauge(lambda: services.admission.inflight))

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        services.decode_pool = DecodePool(settings.decode_threads, settings.decode_queue)
        services.tenant_admission = tenancy.admission_for(services.access.tenants.backend)
        await gateway.start()
        await services.reloader.rollouts.boot()  # a bad [rollout] candidate: no start
        services.ready = True
        log.info("cascade %s ready: %s", __version__, status.describe(view))
        try:
            yield
        finally:
            services.ready = False
            await services.reloader.rollouts.aclose()
            await gateway.aclose()
            services.decode_pool.close()
            await services.tenant_admission.store.aclose()
            await asyncio.to_thread(audit.flush)

    app = Litestar(
        route_handlers=[
            systemone,
            systemone_batch,
            decisions,
            models,
            health,
            ready,
            prometheus_metrics,
            feedback.route(_guarded),
            usage.route,
            admin_router(),
        ],
        dependencies={"services": Provide(lambda: services, sync_to_thread=False)},
        lifespan=[lifespan, fleet_lifespan],  # fleet: file watch and membership
        middleware=tracing.middleware(),  # the server span, when tracing is on
        before_send=[echo_request_id, tenancy.rate_headers],
        exception_handlers={
            CascadeError: _handle_cascade_error,
            HTTPException: _handle_http_exception,
            Exception: _handle_unexpected,
        },
        openapi_config=docs_config(_docs_guard),
        request_max_body_size=None,
        logging_config=None,  # the process configures logging (cascade.cli.serve)
        debug=False,
    )
    document(app)
    app.state[SERVICES] = services  # for guards and hooks, which dependencies do not reach
    return app
