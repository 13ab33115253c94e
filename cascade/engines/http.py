"""``HttpEngine``: a tier that is another ``/v1/systemone`` server, over one pooled client.

Any server of the three dialects works: cascade itself, laya-serve, jevcompat's mock, Ollama, or a
proxy answering in Cloudflare's ``{"result", "success"}`` envelope. Each URL is a base URL
(``/v1/systemone`` is appended unless it already ends with it).

Routing and retries. Requests go round robin over the URLs not marked down. A connect failure
marks a URL down until the next probe has looked again (``health_interval_s`` plus the probe's
timeout, so its health never flickers between probes) and the same request moves on to the next
URL, which is safe because nothing reached the server. A 503 marks its URL down for its
``Retry-After`` (at most as long) and the request moves on to another URL that is up, at once;
nothing ever sleeps on the request path. Nothing else is retried: a read timeout may have been a
request the upstream is still computing, and a 4xx will not change. The background probe (``GET
health_path`` every ``health_interval_s``, on a client of its own so busy request connections
never starve it; any status below 500 counts as up) brings URLs back and marks dead ones down
before a request finds them.

What the upstream serves. Each URL's answers name a model, and its ``/health`` (probed with
the tier's key) may list ``revisions``: when either differs from what that URL reported before
(a new model or checkpoint behind the same URL), it is logged (old -> new) and counted in
``cascade_upstream_model_changes_total{tier}``; the cheap tier's drift monitor shows what it did
to confidences. An upstream whose answers name different models by design (another cascade
joins the tiers that answered) counts each change.
Each request is built whole (content type, user agent, bearer token, request id) and POSTed
through aiohttp (``cascade.engines.posting``): no cookie jar, so a cookie one upstream answer
sets never rides on another caller's request. Proxies from the environment (``HTTP_PROXY``...)
still apply: with one set, requests go through an httpx client and its proxies.

Error translation (HTTP statuses to ``cascade.errors`` here and nowhere else; the client
libraries' errors in ``cascade.engines.posting``):

=====================================  ================================================
connect failure or timeout, every URL  ``EngineUnavailable`` (each URL is tried first)
every URL marked down                  ``EngineUnavailable``
read or write timeout                  ``EngineTimeout``
connection pool full                   ``Overloaded``
429                                    ``RateLimited`` with their ``Retry-After`` (back-pressure)
529, 503 ``overloaded_error``          ``Overloaded`` with their ``Retry-After`` (back-pressure)
other 503                              ``EngineUnavailable`` with their ``Retry-After`` (down,
                                       draining: the gateway's breaker counts it)
422                                    ``ValidationFailed`` with their ``detail[]`` items
413                                    ``PayloadTooLarge``
400, 409, other 4xx                    ``UpstreamClientError`` (their status and error_type kept)
404, 405                               ``EngineFailed``: a wrong URL or path, a broken tier
401, 403, 407                          ``EngineFailed``: our credentials, not the client's
408                                    ``EngineTimeout``: our request was too slow
5xx, any other status, bad 200 body    ``EngineFailed``
=====================================  ================================================
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import itertools
import logging
import math
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import msgspec

from cascade import __version__, metrics
from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.engines.posting import (
    AiohttpPoster,
    ConnectFailed,
    Headers,
    HttpxPoster,
    Poster,
    UpstreamReply,
)
from cascade.errors import (
    EngineFailed,
    EngineTimeout,
    EngineUnavailable,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    UpstreamClientError,
    ValidationFailed,
    clamp_retry_after,
)
from cascade.questions import option_names
from cascade.schema import NoulQuestion, OptionSpans, Question
from cascade.tracing import active as tracing

ENDPOINT = "/v1/systemone"
log = logging.getLogger("cascade")
_SUM_SLACK = 0.05  # rounded probabilities (Laya: 4 decimals, jevcompat: ±0.05) may miss 1 a bit
_ROUNDING_SLACK = 0.005  # ... by up to half a unit of the 2nd decimal per option, at worst
_MESSAGE_CHARS = 500  # how much of an unparseable error body a message quotes

# ---------------------------------------------------------------- request


def request_body(call: EngineCall, model: str | None) -> bytes:
    """The JSON body sent upstream: the call, Laya's controls when set, images the Ollama way."""
    body: dict[str, Any] = msgspec.to_builtins(call.controls)  # omit_defaults: only set ones
    body |= {"model": model or call.model, "state": call.state, "questions": call.questions}
    if call.images:
        body["images"] = [base64.b64encode(image.data).decode("ascii") for image in call.images]
    return msgspec.json.encode(body)


# ---------------------------------------------------------------- success bodies


class _Action(msgspec.Struct):
    act_probability: float | None = None


class _Answer(msgspec.Struct):
    type: str
    probabilities: dict[str, float] | None = None
    noul: float | None = None
    action: _Action | None = None


class _Spans(msgspec.Struct):
    total: int
    distinct: int
    tokens_per_option: int | None = None  # Laya: None when no cap applied


class _Usage(msgspec.Struct):
    """Jev's counts plus Laya's extras; a ``null`` extra reads as absent."""

    input_tokens: int | float = 0  # tolerated as a float; we report integers
    state_tokens: int | None = None
    state_tokens_dropped: int | None = None
    truncated_questions: list[str] | None = None
    options: dict[str, _Spans] | None = None


class _Response(msgspec.Struct):
    answers: dict[str, _Answer]
    model: str | None = None
    usage: _Usage = msgspec.field(default_factory=_Usage)


_RESPONSE = msgspec.json.Decoder(_Response)


def _probability(value: float, where: str) -> float:
    if not (math.isfinite(value) and -_ROUNDING_SLACK <= value <= 1 + _ROUNDING_SLACK):
        raise EngineFailed(f"{where}: probability {value!r} is not in [0, 1]")
    return min(1.0, max(0.0, value))


def _result(qid: str, question: Question, answer: _Answer | None) -> QuestionResult:
    where = f"answer {qid!r}"
    qtype = question.type
    if answer is None or answer.type != qtype:
        raise EngineFailed(f"{where}: missing, or not of type {qtype!r}")
    act = answer.action.act_probability if answer.action else None
    if isinstance(question, NoulQuestion):
        if answer.noul is None:
            raise EngineFailed(f"{where}: a noul answer without 'noul'")
        p = _probability(answer.noul, where)
        return QuestionResult(type="noul", probabilities=[1 - p, p], act_probability=act)
    keys = option_names(question)  # what a server answers with, in the caller's order
    given = answer.probabilities or {}
    if len(set(keys)) != len(keys) or set(given) != set(keys):
        raise EngineFailed(f"{where}: probabilities are not keyed by the question's options")
    values = [_probability(given[k], where) for k in keys]
    total = sum(values)
    if abs(total - 1) > max(_SUM_SLACK, len(values) * _ROUNDING_SLACK) or total <= 0:
        raise EngineFailed(f"{where}: probabilities sum to {total:.4f}, not 1")
    return QuestionResult(
        type=qtype, probabilities=[v / total for v in values], act_probability=act
    )


def _usage(usage: _Usage) -> EngineUsage:
    return EngineUsage(
        input_tokens=round(usage.input_tokens),
        state_tokens=usage.state_tokens,
        state_tokens_dropped=usage.state_tokens_dropped or 0,
        truncated_questions=usage.truncated_questions or [],
        # OptionSpans needs a cap; spans that collapsed without one have nothing to report.
        options={
            qid: OptionSpans(
                total=s.total, distinct=s.distinct, tokens_per_option=s.tokens_per_option
            )
            for qid, s in (usage.options or {}).items()
            if s.tokens_per_option is not None
        },
    )


def parse_answer(content: bytes, call: EngineCall, fallback_model: str) -> EngineAnswer:
    """A 200 body (plain, or in Cloudflare's ``result`` envelope) checked against ``call``.

    Probabilities come back in the caller's order, renormalised after the upstream's rounding.
    Anything unparseable or inconsistent (a missing answer, a wrong type, foreign option keys,
    probabilities outside [0, 1] or far from summing to 1) raises ``EngineFailed``.
    """
    try:
        reply = _RESPONSE.decode(content)  # the usual plain answer, in one pass
    except msgspec.DecodeError:
        reply = _enveloped(content)  # or anything else: read generically
    results = {qid: _result(qid, q, reply.answers.get(qid)) for qid, q in call.questions.items()}
    return EngineAnswer(
        model=reply.model or fallback_model, results=results, usage=_usage(reply.usage)
    )


def _enveloped(content: bytes) -> _Response:
    """A body that is not a plain answer: Cloudflare's envelope, or an error to raise."""
    try:
        raw = msgspec.json.decode(content)
        if isinstance(raw, dict) and "answers" not in raw and "result" in raw:
            if raw.get("success") is False:
                raise EngineFailed(f"the upstream reported failure: {_message_of(raw)}")
            raw = raw["result"]
        return msgspec.convert(raw, _Response)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EngineFailed(f"the upstream's 200 body is not a System One answer: {exc}") from exc


# ---------------------------------------------------------------- error bodies


class ErrorInfo(msgspec.Struct, frozen=True):
    message: str
    error_type: str | None = None
    items: list[dict[str, Any]] | None = None  # FastAPI detail[] items, when valid


def _items(detail: list[Any]) -> list[dict[str, Any]] | None:
    items = []
    for item in detail:
        if not (isinstance(item, dict) and isinstance(item.get("loc"), list)):
            return None
        loc = [p if isinstance(p, str | int) else str(p) for p in item["loc"]]
        items.append(
            {
                "loc": loc,
                "msg": str(item.get("msg", "")),
                "type": str(item.get("type", "value_error")),
            }
        )
    return items or None


def _message_of(body: Any) -> str:
    """The human message of an error body of any dialect, or the body itself, shortened."""
    if isinstance(body, dict):
        for key in ("detail", "error"):
            value = body.get(key)
            if isinstance(value, str):
                return value
            if isinstance(value, dict) and isinstance(value.get("message"), str):
                return value["message"]
            if isinstance(value, list) and value:
                return "; ".join(
                    str(v.get("msg", v)) if isinstance(v, dict) else str(v) for v in value
                )
        errors = body.get("errors")
        if isinstance(errors, list) and errors:  # Cloudflare: [{"code", "message"}]
            return "; ".join(
                f"{e.get('code')}: {e.get('message')}" if isinstance(e, dict) else str(e)
                for e in errors
            )
    return str(body)[:_MESSAGE_CHARS]


def error_info(content: bytes) -> ErrorInfo:
    """Message, ``error_type`` and validation items of an error body of any dialect.

    ``{"detail": str | [items] | {"error_type", "message"}}`` (Jev, FastAPI, Laya),
    ``{"error": str | {"message"}}`` (Ollama, old laya-serve) and Cloudflare's
    ``{"success": false, "errors": [{"code", "message"}]}``; anything else is quoted.
    """
    try:
        body = msgspec.json.decode(content)
    except msgspec.DecodeError:
        return ErrorInfo(content[:_MESSAGE_CHARS].decode("utf-8", "replace").strip())
    detail = body.get("detail") if isinstance(body, dict) else None
    error_type = detail.get("error_type") if isinstance(detail, dict) else None
    items = _items(detail) if isinstance(detail, list) else None
    return ErrorInfo(_message_of(body), error_type if isinstance(error_type, str) else None, items)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date),
    clamped to [0, ``MAX_RETRY_AFTER_S``]; None when absent or unusable (``nan``, garbage)."""
    with contextlib.suppress(ValueError):
        if "retry-after-ms" in headers:
            return clamp_retry_after(float(headers["retry-after-ms"]) / 1000)
    value = headers.get("retry-after")
    if value is None:
        return None
    with contextlib.suppress(ValueError):
        return clamp_retry_after(float(value))
    with contextlib.suppress(TypeError, ValueError, OverflowError):
        when = email.utils.parsedate_to_datetime(value).timestamp()
        return clamp_retry_after(when - time.time())
    return None


def _unavailable(response: UpstreamReply) -> bool:
    """A 503 that means down or draining, not back-pressure (``overloaded_error``)."""
    return error_info(response.content).error_type != "overloaded_error"


def raise_for_status(response: UpstreamReply, name: str) -> None:
    """Raise the ``cascade.errors`` exception for a non-200 ``response`` (see the module table)."""
    status = response.status_code
    if status == 200:
        return
    info = error_info(response.content)
    what = f"{name}: upstream answered {status}: {info.message}"
    wait = retry_after(response.headers)
    if status in (429, 529) or (status == 503 and not _unavailable(response)):
        overloaded = RateLimited if status == 429 else Overloaded
        raise overloaded(what, retry_after=1.0 if wait is None else wait)
    if status == 503:
        raise EngineUnavailable(what, retry_after=1.0 if wait is None else wait)
    if status == 422:
        raise ValidationFailed(
            info.items or [{"loc": ["body"], "msg": info.message, "type": "value_error"}]
        )
    if status == 413:
        raise PayloadTooLarge(info.message)
    if status in (404, 405):
        raise EngineFailed(
            f"{name}: the upstream has no such endpoint ({status}); check the "
            f"tier's URL: {info.message}"
        )
    if status in (401, 403, 407):
        raise EngineFailed(
            f"{name}: the upstream refused our credentials ({status}): {info.message}"
        )
    if status == 408:
        raise EngineTimeout(what)
    if 400 <= status < 500:
        raise UpstreamClientError(status, info.message, info.error_type or "invalid_request_error")
    raise EngineFailed(what)


# ---------------------------------------------------------------- the engine


class _Upstream:
    """One URL and its health: down until ``down_until`` (``time.monotonic()``), else up."""

    def __init__(self, url: str, health_path: str) -> None:
        url = url.rstrip("/")
        self.base = url.removesuffix(ENDPOINT)
        self.endpoint = self.base + ENDPOINT
        self.health_url = self.base + health_path
        self.down_until = 0.0
        self.reported: dict[str, str] = {}  # "model" / "revisions" -> what it said last

    def up(self, now: float) -> bool:
        return self.down_until <= now


class HttpEngine:
    """An ``Engine`` that forwards each call to one of ``urls`` (see the module docstring).

    ``model``: the model name sent upstream; ``None`` forwards the client's. ``api_key``: the
    bearer token sent to this upstream. ``transport``: for tests (``httpx.MockTransport``).
    Timeouts are in seconds; a call's deadline is ``connect_timeout_s + read_timeout_s``.
    Safe for concurrent calls on one event loop; ``start()`` and ``aclose()`` run once each.
    """

    def __init__(
        self,
        name: str,
        urls: Sequence[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 30.0,
        max_connections: int = 64,
        health_path: str = "/health",
        health_interval_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not urls:
            raise ValueError(f"{name}: an upstream engine needs at least one URL")
        self.name = name
        self._model = model
        self._upstreams = [_Upstream(url, health_path) for url in urls]
        self._turn = itertools.count()
        self._connect_timeout_s = connect_timeout_s
        self._health_interval_s = health_interval_s
        self._poster = _poster(
            name,
            transport,
            max_connections,
            httpx.Timeout(read_timeout_s, connect=connect_timeout_s, pool=connect_timeout_s),
        )
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = [
            ("Content-Type", "application/json"),
            ("User-Agent", f"cascade/{__version__}"),
            *auth.items(),
        ]
        # Probes (and ``reported``) have connections of their own: a pool busy with requests
        # must not make a healthy upstream look dead.
        self._probe_client = httpx.AsyncClient(
            headers=auth,
            timeout=httpx.Timeout(connect_timeout_s),
            limits=httpx.Limits(max_connections=len(urls), max_keepalive_connections=len(urls)),
            transport=transport,
        )
        self._probe_task: asyncio.Task[None] | None = None
        self._started = False

    # -- lifecycle

    async def start(self) -> None:
        """Probe every URL once, then keep probing in the background until ``aclose()``."""
        await self._probe_all()
        self._probe_task = asyncio.create_task(self._probe_loop(), name=f"{self.name}-health")
        self._started = True

    async def aclose(self) -> None:
        self._started = False
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        await self._poster.aclose()
        await self._probe_client.aclose()

    def ready(self) -> bool:
        now = time.monotonic()
        return self._started and any(u.up(now) for u in self._upstreams)

    def health(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "engine": "upstream",
            "model": self._model,
            "urls": [{"url": u.base, "up": u.up(now)} for u in self._upstreams],
        }

    async def reported(self) -> dict[str, Any]:
        """What the upstream says it serves: ``/health``'s ``loaded`` (models) and ``revisions``
        (a cascade or laya-serve upstream shows them to a valid key), from the first URL that
        answers with a JSON object; ``{}`` when none does."""
        for upstream in self._upstreams:
            try:
                response = await self._probe_client.get(upstream.health_url)
                body = response.json() if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                continue
            if isinstance(body, dict):
                return {k: body[k] for k in ("loaded", "revisions") if k in body}
        return {}

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval_s)
            await self._probe_all()

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe(u) for u in self._upstreams))

    async def _probe(self, upstream: _Upstream) -> None:
        try:
            response = await self._probe_client.get(upstream.health_url)
            healthy = response.status_code < 500
        except httpx.HTTPError:
            healthy = False
        if healthy:
            upstream.down_until = 0.0
            if response.status_code == 200:
                self._saw_revisions(upstream, response)
        else:
            self._mark_down(upstream)

    def _saw_revisions(self, upstream: _Upstream, response: httpx.Response) -> None:
        """The ``revisions`` a health body lists (a body without them says nothing)."""
        try:
            body = response.json()
        except ValueError:
            return
        found = body.get("revisions") if isinstance(body, dict) else None
        if isinstance(found, dict):
            self._saw(upstream, "revisions", ",".join(f"{k}={v}" for k, v in sorted(found.items())))

    def _saw(self, upstream: _Upstream, what: str, value: str) -> None:
        """Log and count ``value`` when ``upstream`` reported another ``what`` before."""
        last, upstream.reported[what] = upstream.reported.get(what), value
        if last is not None and last != value:
            log.warning(
                "tier %s: %s now reports %s %s (was %s)",
                self.name,
                upstream.base,
                what,
                value,
                last,
            )
            metrics.UPSTREAM_MODEL_CHANGES.labels(tier=self.name).inc()

    def _mark_down(self, upstream: _Upstream, seconds: float | None = None) -> None:
        """Down until the next probe has had time to look again (then it decides), or for
        ``seconds`` (an upstream's Retry-After) when that is shorter."""
        until_probed = self._health_interval_s + self._connect_timeout_s
        wait = until_probed if seconds is None else min(seconds, until_probed)
        upstream.down_until = time.monotonic() + wait

    # -- calls

    async def answer(self, call: EngineCall) -> EngineAnswer:
        content = request_body(call, self._model)
        headers = self._headers
        if call.request_id:
            headers = [*headers, ("x-request-id", call.request_id)]
        headers = tracing.injected(headers)  # traceparent: the upstream's span is a child
        response, upstream = await self._post(content, headers)
        if response.status_code == 503 and _unavailable(response):
            # Never sleep here: back this URL off for its Retry-After and try another one now.
            self._mark_down(upstream, retry_after(response.headers) or 1.0)
            if any(u.up(time.monotonic()) for u in self._upstreams):
                response, upstream = await self._post(content, headers)
        raise_for_status(response, self.name)
        answer = parse_answer(response.content, call, self._model or call.model)
        self._saw(upstream, "model", answer.model)
        return answer

    async def _post(self, content: bytes, headers: Headers) -> tuple[UpstreamReply, _Upstream]:
        """One POST to the next healthy URL, moving on to the others after connect failures."""
        now = time.monotonic()
        healthy = [u for u in self._upstreams if u.up(now)]
        if not healthy:
            back = min(u.down_until for u in self._upstreams) - now
            raise EngineUnavailable(
                f"{self.name}: every upstream is down", retry_after=max(1.0, back)
            )
        first = next(self._turn) % len(healthy)
        failures = []
        for upstream in healthy[first:] + healthy[:first]:
            try:
                return await self._poster.post(upstream.endpoint, headers, content), upstream
            except ConnectFailed as exc:
                self._mark_down(upstream)
                failures.append(str(exc))
        raise EngineUnavailable(f"{self.name}: could not connect: {'; '.join(failures)}")


def _poster(
    name: str,
    transport: httpx.AsyncBaseTransport | None,
    max_connections: int,
    timeout: httpx.Timeout,
) -> Poster:
    """aiohttp's (``cascade.engines.posting``), unless a test gives a transport or the
    environment sets proxies (``HTTP_PROXY``...: an httpx client's mounts go through them).
    Either way each request is built whole: no cookie jar, so a cookie one upstream answer sets
    never rides on another caller's request, and none of a client's per-call merging."""
    if transport is not None:
        return HttpxPoster(name, transport.handle_async_request, timeout, transport.aclose)
    if urllib.request.getproxies():
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        client = httpx.AsyncClient(limits=limits)
        return HttpxPoster(name, client.send, timeout, client.aclose)
    return AiohttpPoster(name, max_connections, timeout)
