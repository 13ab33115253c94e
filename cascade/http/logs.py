"""The served process's logs: one format for every logger, an access line per request, and
repeated lines rate-limited.

``configure`` gives the root logger one handler, text (``TEXT_FORMAT``) or JSON (one object per
line: ts, level, logger, message, and a record's extras such as request_id). Every logger ends
there: cascade's, uvicorn's (``cascade.http.server`` runs it with ``log_config=None``), httpx's,
onnxruntime's, ``warnings`` (as ``py.warnings``, one line each), and the libraries that bring
their own handler: transformers and huggingface_hub are routed through ours when they are
imported (the gateway does not import them just for this).

``access_logged`` writes the access line (logger ``cascade.access``) in place of uvicorn's,
which cannot see the request id: method, path, status, duration and the response's
``x-request-id``, each client-chosen value quoted as logfmt does when it holds a space, ``=``,
a quote or a control character (``logfmt``). Probes (``/ready``, ``/health``, ``/metrics``) are
logged at DEBUG.

Rate limiting: an outage must not turn into one WARNING per request (3,300 lines in 70 s were
measured with the strong tier down). The handler carries ``RepeatFilter``, so uvicorn's warnings
about malformed requests are limited like ours. The access log (one line per request by design)
is not a repeat and passes.
"""

from __future__ import annotations

import datetime
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Literal

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from cascade.http.context import context_in

_MAX_KEYS = 1024  # templates remembered; older windows are dropped past this
ACCESS_LOG = "cascade.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PROBES = frozenset({"/ready", "/health", "/metrics"})


class _Window:
    __slots__ = ("start", "passed", "suppressed")

    def __init__(self, start: float) -> None:
        self.start = start
        self.passed = 1
        self.suppressed = 0


class RepeatFilter(logging.Filter):
    """Lets the first ``burst`` records of each (logger, message template) through per
    ``interval_s`` and drops the rest of that interval; the first record after it says how many
    similar lines were suppressed. The template is the unformatted message (``"request %s
    failed: %s"``), so lines that differ only in their arguments count as one kind.
    """

    def __init__(
        self, burst: int = 5, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst = burst
        self.interval_s = interval_s
        self.clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == ACCESS_LOG:
            return True
        key = (record.name, str(record.msg))
        now = self.clock()
        window = self._windows.get(key)
        if window is not None and now - window.start < self.interval_s:
            if window.passed < self.burst:
                window.passed += 1
                return True
            window.suppressed += 1
            return False
        if len(self._windows) >= _MAX_KEYS:
            self._prune(now)
        self._windows[key] = _Window(now)
        if window is not None and window.suppressed:
            record.msg = (
                f"{record.msg} [suppressed {window.suppressed} similar lines in the "
                f"previous {self.interval_s:g} s]"
            )
        return True

    def _prune(self, now: float) -> None:
        expired = [k for k, w in self._windows.items() if now - w.start >= self.interval_s]
        for key in expired or list(self._windows)[: _MAX_KEYS // 2]:
            del self._windows[key]


_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's copy of the message with ANSI colours
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, milliseconds), level, logger, message, the record's
    extras (``request_id``, the access line's fields...), and ``exc`` / ``stack`` when present."""

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        entry: dict[str, Any] = {
            "ts": created.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update((k, v) for k, v in vars(record).items() if k not in _RECORD_FIELDS)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


def _warning_on_one_line(record: logging.LogRecord) -> bool:
    """``py.warnings`` records as one line: ``FILE:LINE: Category: message``, without the
    source line ``warnings.formatwarning`` appends on a line of its own."""
    text = record.getMessage().rstrip("\n")
    head, _, _source = text.rpartition("\n  ")
    record.msg, record.args = (head or text).replace("\n", " "), ()
    return True


def _route_transformers(module: ModuleType) -> None:
    module.disable_default_handler()  # its handler prints "[transformers] message"
    module.enable_propagation()


def _route_hub(module: ModuleType) -> None:
    hub = logging.getLogger("huggingface_hub")  # its bare handler, beside ours: each line twice
    for handler in list(hub.handlers):
        hub.removeHandler(handler)


# Libraries that give their loggers a handler of their own when this module is imported.
_LIBRARIES: dict[str, Callable[[ModuleType], None]] = {
    "transformers.utils.logging": _route_transformers,
    "huggingface_hub.utils.logging": _route_hub,
}


class _Then(importlib.abc.Loader):
    """``loader``, then ``hook(module)`` once the module has run."""

    def __init__(self, loader: importlib.abc.Loader, hook: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.hook(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """A post-import hook: the module is found by the other finders, and its hook runs right
    after it is executed (before anything can log through it)."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hook = self.hooks.pop(fullname, None)
        if hook is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Then(spec.loader, hook)
                return spec
        return None


def route_libraries() -> None:
    """Route each of ``_LIBRARIES`` through our handler: now if it is imported, else as soon
    as it is."""
    pending = {}
    for name, route in _LIBRARIES.items():
        if name in sys.modules:
            route(sys.modules[name])
        else:
            pending[name] = route
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


def configure(
    level: str, log_format: Literal["text", "json"], *, burst: int, interval_s: float
) -> None:
    """The process's logging: the root handler (stderr unless one is set) in ``log_format``
    with the repeated-line limit, ``level``, warnings captured and libraries routed to it."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    repeats = RepeatFilter(burst, interval_s)
    for handler in root.handlers:
        handler.setFormatter(formatter)
        handler.addFilter(repeats)
    root.setLevel(level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").addFilter(_warning_on_one_line)
    route_libraries()


def logfmt(value: str) -> str:
    """``value`` as one logfmt token: bare when it is plain, else a JSON string (quotes,
    backslashes and control characters escaped), so a client's text (a request id, a path)
    cannot end its field and write others."""
    plain = bool(value) and value.isprintable() and not any(c in value for c in ' ="\\')
    return value if plain else json.dumps(value)


def access_logged(app: ASGIApp) -> ASGIApp:
    """``app`` with an access line per HTTP request, written when its answer is done: method,
    path, status (0 when none was sent), duration and the response's ``x-request-id``, also as
    extras for the JSON format. Probes are logged at DEBUG."""
    access = logging.getLogger(ACCESS_LOG)

    async def logged(scope: Scope, receive: Receive, send: Send) -> None:
        # A request whose line would not be written is not watched at all.
        level = logging.DEBUG if scope.get("path") in PROBES else logging.INFO
        if scope["type"] != ScopeType.HTTP or not access.isEnabledFor(level):
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0
        headers: Any = ()

        async def send_seen(message: Any) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = message.get("headers") or ()
            await send(message)

        try:
            await app(scope, receive, send_seen)
        finally:
            if access.isEnabledFor(level):
                rid = dict(headers).get(b"x-request-id", b"").decode("latin-1")
                context = context_in(scope)
                rid = rid or (context.request_id if context is not None else "-")
                client = scope.get("client")
                fields = {
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                    "request_id": rid,
                    "client": f"{client[0]}:{client[1]}" if client else "-",
                }
                quoted = {k: logfmt(v) if isinstance(v, str) else v for k, v in fields.items()}
                access.log(
                    level,
                    "%(method)s %(path)s %(status)d %(duration_ms).1f ms "
                    "request_id=%(request_id)s client=%(client)s",
                    quoted,
                    extra=fields,
                )

    return logged
