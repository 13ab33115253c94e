"""``POST /v1/feedback``: what the answers of an earlier request should have been.

``{"request_id": ..., "labels": {question id: label}}``, labels in the shapes of ``cascade eval``
data (a choice key, ``true``/``false`` for a noul, the level index for a score), authenticated
and limited like ``/v1/systemone`` (a call counts against the tenant's ``requests_per_min``),
at most as many labels as a request may ask questions (``cascade.schema.MAX_ASKED``). The
labels are stored beside the rows of the tenant's own request in the decision store
(``DecisionStore.label``, looked up by tenant and request id: SQLite through the writer's queue,
so rows queued before the call are found; PostgreSQL at once, whichever replica served the
request, its rows being durable before its response). The answer goes out once the labels are
committed. All
the call's labels are stored, or none:

- 409 ``conflict_error``: the gateway runs without a decision log;
- 404 ``not_found_error``: the live log has no rows of that request id for this tenant (never
  logged, dropped, rotated out or pruned, or another tenant's: the same answer, the same query);
- 422 (``detail[].loc`` = ``["body", "labels", QUESTION]``): a label that does not fit its
  question, or a question id the request did not ask (checked against the tenant's own request
  only); the body's own shape errors as elsewhere;
- 503 + Retry-After: the log did not commit the labels within ``FEEDBACK_WAIT_S`` (they may
  still be stored later: a retry stores them again, the latest wins), failed to write them, or
  (PostgreSQL) is unreachable.

A question labelled again keeps the latest label (``relabelled`` in the answer, counted). The
labels of cheap answers go, judged, to the app's ``learner`` when one is set (the live refit),
each naming its tenant and its asked question (a relabel replaces its judgement there).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from litestar import Request, Response, post
from litestar.handlers import HTTPRouteHandler

from cascade import metrics
from cascade.control.evidence import Learner
from cascade.control.labels import LabelOutcome, asked_key, judged
from cascade.errors import Conflict, NotFound, Overloaded, ValidationFailed
from cascade.http.openapi import AUTH_ERRORS, AUTHENTICATED, operation
from cascade.http.services import Services
from cascade.http.tenancy import tenant_in
from cascade.policy.model import Policy
from cascade.request.validation import decode_at
from cascade.schema import (
    ErrorBody,
    FeedbackRequest,
    FeedbackResponse,
    Label,
    ValidationErrorBody,
    encoder,
    feedback_decoder,
    label_decoder,
)

log = logging.getLogger("cascade")
ROUTE = "/v1/feedback"
FEEDBACK_WAIT_S = 5.0  # the longest a call waits for the log to store its labels
ERRORS = {
    **AUTH_ERRORS,
    "404": ("No rows of that request id (of this tenant) in the decision log", ErrorBody),
    "409": ("The decision log is off: feedback needs it", ErrorBody),
    "422": (
        "A label that does not fit its question, a question the request did not ask, or "
        "a malformed body",
        ValidationErrorBody,
    ),
    "4XX": ("Other client errors (400, 408, 413, 415)", ErrorBody),
    "5XX": ("The gateway or the decision log is busy (503, see Retry-After)", ErrorBody),
}
Work = Callable[[bytes, dict[str, Any]], Awaitable[tuple[Response[bytes], str]]]
Guarded = Callable[[Request, Services, str, Work], Awaitable[Response[bytes]]]


@runtime_checkable
class LabelStore(Protocol):
    """Where labels are stored (``cascade.store.base.DecisionStore``, the gateway's
    ``decisions``): the future resolves once they are committed; None when the store is full."""

    def label(
        self,
        request_id: str,
        labels: Mapping[str, Label],
        *,
        source: str = "feedback",
        tenant: str = "",
    ) -> concurrent.futures.Future[LabelOutcome] | None: ...


def route(guarded: Guarded) -> HTTPRouteHandler:
    """The route handler; ``guarded`` checks the key, reads the body and records the request
    (the app's, shared by every ``/v1`` route)."""

    @post(
        ROUTE,
        status_code=200,
        summary="Labels for the answers of an earlier request",
        operation_class=operation(
            FeedbackRequest,
            FeedbackResponse,
            ERRORS,
            body="JSON, optionally Content-Encoding zstd/gzip/deflate",
        ),
        security=AUTHENTICATED,
    )
    async def feedback(request: Request, services: Services) -> Response[bytes]:
        """``{request_id, labels}`` → ``{request_id, stored, relabelled}``."""

        async def work(body: bytes, parts: dict[str, Any]) -> tuple[Response[bytes], str]:
            asked = _asked(body, parts)
            tenant = tenant_in(request)
            outcome = await _store(services.decisions, asked, tenant.name)
            _learn(services.learner, services.view.policy, outcome, tenant.name)
            relabelled = len(outcome.relabelled)
            metrics.FEEDBACK.labels(outcome="stored").inc(len(outcome.labelled) - relabelled)
            metrics.FEEDBACK.labels(outcome="relabelled").inc(relabelled)
            answer = FeedbackResponse(
                request_id=asked.request_id,
                stored=len(outcome.labelled),
                relabelled=outcome.relabelled,
            )
            return Response(content=encoder.encode(answer), media_type="application/json"), "ok"

        return await guarded(request, services, ROUTE, work)

    return feedback


def _asked(body: bytes, parts: dict[str, Any]) -> FeedbackRequest:
    try:
        if parts:
            raise ValidationFailed.at([], "send JSON: feedback takes no multipart parts")
        if not body.strip():
            raise ValidationFailed.at([], "Field required", "missing")
        env = decode_at(feedback_decoder, body, [])
        labels = {q: decode_at(label_decoder, raw, ["labels", q]) for q, raw in env.labels.items()}
    except ValidationFailed:
        metrics.FEEDBACK.labels(outcome="invalid").inc()
        raise
    return FeedbackRequest(request_id=env.request_id, labels=labels)


async def _store(sink: object, asked: FeedbackRequest, tenant: str) -> LabelOutcome:
    """``tenant``'s labels stored by the decision log, or the call's refusal (counted)."""
    n = len(asked.labels)
    if not isinstance(sink, LabelStore):
        metrics.FEEDBACK.labels(outcome="log_off").inc(n)
        raise Conflict(
            "feedback needs the decision log, and it is off (serve with "
            "--decision-log FILE, or set [decision_log] file in the policy)"
        )
    done = sink.label(asked.request_id, asked.labels, tenant=tenant)
    try:
        if done is None:
            raise TimeoutError("the decision log's queue is full")
        outcome = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(done)), FEEDBACK_WAIT_S)
    except Exception as exc:  # a queue full, a writer behind, or a write that failed
        metrics.FEEDBACK.labels(outcome="failed").inc(n)
        late = isinstance(exc, TimeoutError)
        log.warning(
            "feedback for %s not stored: %s",
            asked.request_id,
            exc if not late or str(exc) else f"no commit in {FEEDBACK_WAIT_S} s",
        )
        raise Overloaded(
            "the decision log is behind; retry"
            if late
            else "the decision log could not write the labels; retry",
            retry_after=1.0,
        ) from exc
    if not outcome.found:
        metrics.FEEDBACK.labels(outcome="unknown_request").inc(n)
        raise NotFound(
            f"no request {asked.request_id!r} in the decision log (never answered, "
            "not logged, or rotated or pruned out of the live log)"
        )
    if outcome.unknown or outcome.invalid:
        metrics.FEEDBACK.labels(outcome="invalid").inc(n)
        items = [
            {
                "loc": ["body", "labels", q],
                "msg": f"request {asked.request_id!r} asked no question {q!r}",
                "type": "value_error",
            }
            for q in outcome.unknown
        ]
        items += [
            {"loc": ["body", "labels", q], "msg": why, "type": "value_error"}
            for q, why in outcome.invalid.items()
        ]
        raise ValidationFailed(items)
    return outcome


def _learn(learner: Learner | None, policy: Policy, outcome: LabelOutcome, tenant: str) -> None:
    """Hand the judged cheap answers to the learner; its failure never fails the call (the
    labels are stored)."""
    if learner is None:
        return
    found = [
        e
        for x in outcome.labelled
        if (
            e := judged(
                policy,
                x.question,
                x.cheap,
                x.label,
                "feedback",
                x.ts,
                tenant=tenant,
                asked=asked_key(x.decision, x.ts),
            )
        )
        is not None
    ]
    if not found:
        return
    try:
        learner.observe(found)
    except Exception:
        log.exception("the learner failed on %d feedback labels", len(found))
