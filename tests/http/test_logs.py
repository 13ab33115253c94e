"""cascade.http.logs: repeated log lines are rate-limited per (logger, template)."""

from __future__ import annotations

import logging

from cascade.http.logs import RepeatFilter


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
        True, True, False]


def test_the_served_process_filters_its_root_handlers(monkeypatch) -> None:  # noqa: ANN001
    from cascade.cli.serve import configure_logging
    from cascade.settings import Settings

    root = logging.getLogger()
    handler = logging.StreamHandler()
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(root, "level", root.level)
    configure_logging(Settings(log_repeat_burst=2), None)
    (repeats,) = [f for f in handler.filters if isinstance(f, RepeatFilter)]
    assert repeats.burst == 2


def test_uvicorn_warnings_share_the_limit_and_the_format(tmp_path) -> None:  # noqa: ANN001
    """2,000 malformed request heads made 2,000 uvicorn WARNING lines in its own format, past
    the limiter; now they are lines of ours, and at most ``burst`` per interval pass."""
    import os
    import re
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.servers import free_port, wait_http

    port = free_port()
    log_path = tmp_path / "serve.log"
    cmd = [str(Path(sys.executable).parent / "cascade"), "serve", "--upstream",
           "http://127.0.0.1:9", "--port", str(port), "--log-level", "warning"]
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
    lines = [_record('%s - "%s %s HTTP/%s" %d', "c", "GET", "/", "1.1", 200,
                     name="uvicorn.access") for _ in range(50)]
    assert all(repeats.filter(r) for r in lines)
