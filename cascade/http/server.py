"""Serving the app: uvicorn with the guarded protocol, a graceful drain on SIGTERM, and a reload
on SIGHUP.

On SIGTERM the gateway drains for ``drain_s``: ``/ready`` answers 503 (so load balancers stop
routing to it) while every request, in flight or newly routed, is still served, each response
with ``connection: close``. Then uvicorn stops accepting, lets in-flight requests finish within
``grace_s`` (cancelling what is left), shuts the engines down, and the process exits 0. A
second SIGTERM ends the drain at once; SIGINT (Ctrl-C) skips it, and a second SIGINT forces exit.

SIGHUP reloads the policy, calibration and key files without a restart (the app's
``cascade.http.reload.Reloader``, as ``POST /admin/reload`` does); a refused reload is logged
and counted, and the running version keeps serving. Until the server has started, SIGHUP keeps
its default action (the process ends).

Closing a listening socket makes the kernel reset the connections it completed that the server
had not accepted yet, and a client that already sent its request on one sees it lost; so at
shutdown the server first accepts what is queued, then stops listening, and serves those
connections too (their first request gets the grace ``cascade.http.protocol`` gives one).

HEAD is served wherever GET is: the app sees a GET, and uvicorn, which knows the request was a
HEAD, sends the head of the answer without its body (RFC 9110 section 9.3.2). An exception that
escapes the app before its answer began is a JSON 500, like every error answer. uvicorn's own log
lines go to the process's handlers (``log_config=None``), so they share its format and its
repeated-line limit; the access lines are ours (``cascade.http.logs.access_logged``: uvicorn's
cannot see the request id).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any, cast

import uvicorn
from litestar import Litestar
from litestar.types import (
    ASGIApp,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    HTTPScope,
    Receive,
    Scope,
    Send,
)
from uvicorn.config import STARTUP_FAILURE

from cascade.errors import CascadeError, ConfigRejected, StartupRefused
from cascade.http.drain import Drain
from cascade.http.logs import access_logged
from cascade.http.protocol import HeadLimits, guarded
from cascade.http.sending import with_send_timeout
from cascade.http.services import services_of
from cascade.overrides.uvicorn import forget_signal
from cascade.schema import ErrorBody, ErrorDetail, encoder
from cascade.settings import Settings

log = logging.getLogger("cascade")


def freeze_start_up() -> None:
    """What start-up loaded (modules, tokenizers, engine tables) lives as long as the process:
    frozen, the cyclic collector stops walking it on every collection a request triggers (about
    a tenth of the app's CPU per request, docs/benchmarks.md). Done by the server, not the app
    factory: the process is the server's, while an app may be embedded in a process that goes
    on collecting."""
    gc.collect()
    gc.freeze()


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` that begins ``drain`` and waits ``drain_s`` on SIGTERM, and calls
    ``reload`` on SIGHUP (when given)."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        drain_s: float,
        reload: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        super().__init__(config)
        self.drain = drain
        self.drain_s = drain_s
        self.drain_until: float | None = None
        self.reload = reload
        self._reloads: set[asyncio.Task[None]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:  # what start-up loaded lives as long as the process
            freeze_start_up()
        if self.reload is not None and threading.current_thread() is threading.main_thread():
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_sighup(self) -> None:
        log.info("SIGHUP: reloading the policy, calibration and key files")
        task = asyncio.get_running_loop().create_task(self._reload())
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def _reload(self) -> None:
        assert self.reload is not None
        try:
            await self.reload()
        except ConfigRejected:
            pass  # logged and counted by the reloader; the running version keeps serving
        except Exception:
            log.exception("SIGHUP: the reload failed; the running version keeps serving")

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.drain_until is not None or self.drain_s <= 0:
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                # uvicorn re-raises the signal after shutting down (exit status 143); a drained
                # SIGTERM is a clean exit.
                forget_signal(self, sig)
            return
        self.drain.begin()
        self.drain_until = time.monotonic() + self.drain_s
        log.info(
            "SIGTERM: draining for %g s (/ready answers 503), then shutting down", self.drain_s
        )

    async def on_tick(self, counter: int) -> bool:
        if self.drain_until is not None and time.monotonic() >= self.drain_until:
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.reload is not None and threading.current_thread() is threading.main_thread():
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        await self._serve_queued_connections()
        await super().shutdown(sockets)

    async def _serve_queued_connections(self) -> None:
        """Accept every connection queued on the listening sockets, stop listening, and hand
        the accepted ones to the HTTP protocol like any other connection."""
        queued: list[socket.socket] = []
        for server in self.servers:
            for listener in server.sockets:
                with socket.socket(fileno=os.dup(listener.fileno())) as sock:
                    sock.setblocking(False)
                    while True:
                        try:
                            queued.append(sock.accept()[0])
                        except (BlockingIOError, InterruptedError):
                            break
            server.close()
        if queued:
            log.info(
                "shutdown: serving %d connection(s) queued before the socket closed", len(queued)
            )
        # uvicorn types the class as a bare asyncio.Protocol; its HTTP protocols take these.
        protocol_class: Callable[..., asyncio.Protocol] = self.config.http_protocol_class
        protocol = functools.partial(
            protocol_class,
            config=self.config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        loop = asyncio.get_running_loop()
        for conn in queued:
            conn.setblocking(False)
            await loop.connect_accepted_socket(protocol, conn, ssl=self.config.ssl)


def head_limits(settings: Settings) -> HeadLimits:
    return HeadLimits(
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
        header_timeout_s=settings.header_timeout_s,
    )


def served(app: ASGIApp) -> Any:
    """``app`` as the server runs it: HEAD is answered wherever GET is (see the module
    docstring), and an exception that escapes ``app`` before it began its answer is a 500 in the
    contract's JSON shape (uvicorn's own is text/plain)."""

    async def serve_http(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        http = cast(HTTPScope, scope)
        if http["method"] == "HEAD":
            http = cast(HTTPScope, {**http, "method": "GET"})
        try:
            await app(http, receive, send_tracked)
        except Exception:
            if started:
                raise
            log.exception("unhandled error answering %s %s", http["method"], http["path"])
            body = encoder.encode(
                ErrorBody(detail=ErrorDetail(error_type="api_error", message="internal error"))
            )
            start: HTTPResponseStartEvent = {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(body)),
                    (b"connection", b"close"),
                ],
            }
            await send(start)
            end: HTTPResponseBodyEvent = {
                "type": "http.response.body",
                "body": body,
                "more_body": False,
            }
            await send(end)

    return serve_http


def start_refusals(app: ASGIApp, refusals: list[str]) -> ASGIApp:
    """``app`` whose start-up failing on a ``CascadeError`` (an engine that cannot load, with
    what to do) is reported as that error's text in ``refusals``, not as a traceback in uvicorn's
    log; any other failure keeps its traceback."""

    async def lifespan(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        held: list[Any] = []

        async def hold_failure(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)  # sent below, once the exception is known
            else:
                await send(message)

        try:
            await app(scope, receive, hold_failure)
        except BaseException as exc:
            refused = _cascade_error(exc)
            if refused is not None:
                refusals.append(str(refused))
            for message in held:
                if refused is not None:
                    message["message"] = ""  # the traceback uvicorn would log
                await send(message)
            raise

    return lifespan


def _cascade_error(exc: BaseException) -> CascadeError | None:
    """``exc`` when it is a ``CascadeError``, or one such raised alone in an exception group
    (the app's lifespan runs in a task group)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, CascadeError) else None


def serve(
    app: Litestar,
    settings: Settings,
    log_level: str,
    drain: Drain,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Run ``app`` (built with ``drain``) until a signal ends it, reloading on SIGHUP (see the
    module docstring), on ``sockets`` when given (already listening), else on
    ``settings.host``/``port``."""
    protocol = with_send_timeout(guarded(head_limits(settings)), settings.send_timeout_s)
    # uvicorn annotates both timeouts as int and uses them as float seconds.
    timeouts: dict[str, Any] = {
        "timeout_keep_alive": settings.keep_alive_s,
        "timeout_graceful_shutdown": settings.grace_s,
    }
    refusals: list[str] = []
    config = uvicorn.Config(
        start_refusals(access_logged(served(app)), refusals),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        log_config=None,
        access_log=False,
        workers=1,
        lifespan="on",
        http=protocol,
        **timeouts,
    )
    try:
        reload = functools.partial(services_of(app).reloader.reload, "signal")
        DrainingServer(config, drain, settings.drain_s, reload=reload).run(sockets=sockets)
    except SystemExit as exc:  # uvicorn's exit when the app did not start
        if exc.code == STARTUP_FAILURE and refusals:
            raise StartupRefused(f"the gateway did not start: {refusals[0]}") from None
        raise
