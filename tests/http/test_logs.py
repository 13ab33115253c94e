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
