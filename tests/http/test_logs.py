"""cascade.http.logs: one format for every logger, access lines with the request id, probes at
debug, and repeated log lines rate-limited per (logger, template)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cascade.http.logs import ACCESS_LOG, PROBES, RepeatFilter
from tests.servers import free_port, wait_http

BIN = Path(sys.executable).parent
TEXT_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S"
)


def _record(msg: str, *args: object, name: str = "cascade") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def test_the_first_burst_passes_then_lines_are_counted_and_reported() -> None:
    now = [0.0]
    repeats = RepeatFilter(burst=3, interval_s=10, clock=lambda: now[0])
    outage = [_record("request %s failed: %s", f"id{i}", "down") for i in range(3300)]
    passed = [r for r in outage if repeats.filter(r)]
    assert len(passed) == 3
    # Another kind of line, or another logger, is not held back by the first.
    assert repeats.filter(_record("tier %s recovered", "clef"))
    assert repeats.filter(_record("request %s failed: %s", "x", "y", name="uvicorn.error"))
    now[0] = 10.0
    after = _record("request %s failed: %s", "id", "down")
    assert repeats.filter(after)
    assert after.getMessage() == (
        "request id failed: down [suppressed 3297 similar lines in the previous 10 s]"
    )
    assert [repeats.filter(_record("request %s failed: %s", "i", "d")) for _ in range(3)] == [
        True,
        True,
        False,
    ]


def test_the_served_process_filters_its_root_handlers(monkeypatch) -> None:  # noqa: ANN001
    from cascade.cli.serve import configure_logging
    from cascade.settings import Settings

    root = logging.getLogger()
    handler = logging.StreamHandler()
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the import hook stays here
    configure_logging(Settings(log_repeat_burst=2), None)
    (repeats,) = [f for f in handler.filters if isinstance(f, RepeatFilter)]
    assert repeats.burst == 2


def test_uvicorn_warnings_share_the_limit_and_the_format(tmp_path) -> None:  # noqa: ANN001
    """2,000 malformed request heads made 2,000 uvicorn WARNING lines in its own format, past
    the limiter; now they are lines of ours, and at most ``burst`` per interval pass."""
    import socket
    import time

    port = free_port()
    log_path = tmp_path / "serve.log"
    cmd = [
        str(Path(sys.executable).parent / "cascade"),
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    with log_path.open("wb") as out:
        proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120, proc=proc)
        started = time.monotonic()
        refused = 0
        for i in range(2000):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header %d\r\n\r\n" % i)
                refused += sock.recv(65536).startswith(b"HTTP/1.1 400 ")
        elapsed = time.monotonic() - started
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [line for line in log_path.read_text().splitlines() if "Invalid HTTP" in line]
    assert refused == 2000
    assert 1 <= len(lines) <= 5 * (int(elapsed // 10) + 1), (len(lines), elapsed)
    ours = re.compile(r"\d{4}-\d\d-\d\d [\d:,]+ WARNING uvicorn\.error: Invalid HTTP request")
    assert all(ours.match(line) for line in lines), lines[:3]


def test_the_access_log_is_one_line_per_request_not_a_repeat() -> None:
    repeats = RepeatFilter(burst=2, interval_s=10, clock=lambda: 0.0)
    lines = [_record("%s %s %d", "GET", "/", 200, name=ACCESS_LOG) for _ in range(50)]
    assert all(repeats.filter(r) for r in lines)


@contextlib.contextmanager
def _gateway(log_path: Path, *flags: str) -> Iterator[str]:
    """``cascade serve`` (an upstream tier that is down: no weights to load) logging into
    ``log_path``; yields its base URL and stops it (a clean shutdown) on exit."""
    port = free_port()
    cmd = [
        str(BIN / "cascade"),
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--port",
        str(port),
        *flags,
    ]
    env = {**os.environ, "CASCADE_DRAIN_S": "0"}
    with log_path.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _traffic(url: str) -> list[httpx.Response]:
    body = {
        "model": "jev-latest",
        "state": "I was charged twice",
        "questions": {"urgent": {"type": "noul", "instructions": "Is it urgent?"}},
    }
    with httpx.Client(base_url=url, timeout=30) as http:
        return [
            *(http.get(path) for path in sorted(PROBES)),
            http.get("/ready"),
            http.get("/v1/models", headers={"x-request-id": "client-chosen-id"}),
            http.head("/v1/models"),
            http.get("/no/such/path"),
            http.post("/v1/systemone", content=b"{not json"),
            http.post("/v1/systemone", json=body),  # the upstream is down: a WARNING of ours
        ]


def _access_lines(entries: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    access = [e for e in entries if e["logger"] == ACCESS_LOG]
    by_id = {e["request_id"]: e for e in access}
    assert len(by_id) == len(access), access  # one line per request
    return by_id


def test_text_lines_are_ours_and_access_lines_carry_the_request_id(tmp_path: Path) -> None:
    """Every line has the one text format; each answer's access line names its method, path,
    status, duration and x-request-id; probes are not logged at INFO."""
    log_path = tmp_path / "serve.log"
    with _gateway(log_path, "--log-level", "info") as url:
        responses = _traffic(url)
    lines = log_path.read_text().splitlines()
    assert lines and [line for line in lines if not TEXT_LINE.match(line)] == []
    access = re.compile(
        r"\S+ \S+ INFO cascade\.access: (?P<method>\S+) (?P<path>\S+) "
        r"(?P<status>\d+) [\d.]+ ms request_id=(?P<request_id>\S+) client=\S+$"
    )
    entries = [{"logger": ACCESS_LOG, **m.groupdict()} for m in map(access.match, lines) if m]
    by_id = _access_lines(entries)
    answered = [r for r in responses if r.request.url.path not in PROBES]
    assert len(by_id) == len(answered)
    for r in answered:
        entry = by_id[r.headers["x-request-id"]]
        assert (entry["method"], entry["path"], entry["status"]) == (
            r.request.method,
            r.request.url.path,
            str(r.status_code),
        )
    assert by_id["client-chosen-id"]["path"] == "/v1/models"
    assert any(" WARNING cascade: request " in line for line in lines)


TOKEN = re.compile(r'(?:[^\s"]|"(?:[^"\\]|\\.)*")+')  # logfmt: quoted strings are one token


def _logfmt(text: str) -> list[str | tuple[str, str]]:
    """``text``'s tokens, left to right: ``(key, value)`` for a field, else the token, quoted
    ones decoded."""
    out: list[str | tuple[str, str]] = []
    for token in TOKEN.findall(text):
        key, eq, value = token.partition("=")
        if eq and not key.startswith('"'):
            out.append((key, json.loads(value) if value.startswith('"') else value))
        else:
            out.append(json.loads(token) if token.startswith('"') else token)
    return out


def test_client_text_cannot_write_access_log_fields(tmp_path: Path) -> None:
    """A request id or a path with spaces, ``=``, quotes or control characters is one quoted
    logfmt value: the line keeps its own tokens, each holding the client's text whole."""
    log_path = tmp_path / "serve.log"
    spoof = 'abc client=10.9.8.7 tenant=acme status=200 "x\\y'
    with _gateway(log_path, "--log-level", "info") as url, httpx.Client(base_url=url) as http:
        r = http.get("/v1/models", headers={"x-request-id": spoof})
        assert r.headers["x-request-id"] == spoof
        http.get("/no%20such=path%0Afake", headers={"x-request-id": "plain-id"})
    lines = [
        line.split(" cascade.access: ", 1)[1]
        for line in log_path.read_text().splitlines()
        if " cascade.access: " in line
    ]
    assert len(lines) == 2, lines
    tokens = [_logfmt(line) for line in lines]
    assert [t[:3] for t in tokens] == [
        ["GET", "/v1/models", "200"],
        ["GET", "/no such=path\nfake", "404"],
    ]
    assert [t[5] for t in tokens] == [("request_id", spoof), ("request_id", "plain-id")]
    assert all(
        len(t) == 7 and t[6][0] == "client" and t[6][1].startswith("127.0.0.1:") for t in tokens
    )


def test_json_lines_parse_and_probes_are_logged_at_debug(tmp_path: Path) -> None:
    log_path = tmp_path / "serve.log"
    with _gateway(log_path, "--log-format", "json", "--log-level", "debug") as url:
        responses = _traffic(url)
    entries = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert entries and all({"ts", "level", "logger", "message"} <= e.keys() for e in entries)
    assert {e["logger"] for e in entries} >= {"cascade", "uvicorn.error", ACCESS_LOG}
    by_id = _access_lines(entries)
    for r in responses:
        entry = by_id[r.headers["x-request-id"]]
        assert (entry["method"], entry["path"], entry["status"]) == (
            r.request.method,
            r.request.url.path,
            r.status_code,
        )
        assert entry["duration_ms"] >= 0
        assert entry["level"] == ("DEBUG" if r.request.url.path in PROBES else "INFO")


def test_the_log_format_is_a_setting() -> None:
    from cascade.settings import from_env

    assert from_env({"CASCADE_LOG_FORMAT": "json"}).log_format == "json"
    assert from_env({}).log_format == "text"


_LIBRARIES = """
import sys, warnings
from cascade.cli.serve import configure_logging
from cascade.settings import Settings

configure_logging(Settings(log_format=sys.argv[1]), None)
print("imported:", sorted(m for m in ("torch", "transformers") if m in sys.modules))
from transformers.utils import logging as hf_logging
hf_logging.get_logger("transformers").warning("a transformers warning")
from huggingface_hub.utils import logging as hub_logging
hub_logging.get_logger("huggingface_hub.demo").warning("a hub warning")
warnings.warn("a python warning")
"""


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_library_loggers_and_warnings_come_out_in_our_format(log_format: str) -> None:
    """transformers prints ``[transformers] message`` through a handler of its own, and
    huggingface_hub adds a bare one beside ours (each line twice); with our setup each is one
    line of ours, as is a Python warning, and setting up imports neither torch nor transformers."""
    done = subprocess.run(
        [sys.executable, "-c", _LIBRARIES, log_format],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRANSFORMERS_VERBOSITY": ""},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "imported: []\n"
    lines = done.stderr.splitlines()
    if log_format == "json":
        got = [(e["level"], e["logger"], e["message"]) for e in map(json.loads, lines)]
    else:
        assert [line for line in lines if not TEXT_LINE.match(line)] == []
        got = [tuple(re.split(r":? ", line, maxsplit=4)[2:]) for line in lines]
    assert got[:2] == [
        ("WARNING", "transformers", "a transformers warning"),
        ("WARNING", "huggingface_hub.demo", "a hub warning"),
    ]
    (warned,) = got[2:]
    assert warned[:2] == ("WARNING", "py.warnings")
    assert warned[2].endswith(": UserWarning: a python warning"), warned


def test_json_records_carry_extras_and_tracebacks() -> None:
    from cascade.http.logs import JsonFormatter

    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "cascade", logging.ERROR, __file__, 1, "failed %s", ("x",), sys.exc_info()
        )
    record.request_id = "abc"
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "failed x" and entry["request_id"] == "abc"
    assert entry["exc"].startswith("Traceback") and "ValueError: boom" in entry["exc"]
    assert {"msg", "args", "exc_info", "levelno"}.isdisjoint(entry)
