"""Rate limiting for repeated log lines: an outage must not turn into one WARNING per request
(3,300 lines in 70 s were measured with the strong tier down).

The served process's handlers carry the filter, and uvicorn logs through them too
(``cascade.http.server``), so its warnings about malformed requests are limited like ours. The
access log (``uvicorn.access``, one line per request by design) is not a repeat and passes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

_MAX_KEYS = 1024  # templates remembered; older windows are dropped past this
ACCESS_LOG = "uvicorn.access"


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

    def __init__(self, burst: int = 5, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
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
            record.msg = (f"{record.msg} [suppressed {window.suppressed} similar lines in the "
                          f"previous {self.interval_s:g} s]")
        return True

    def _prune(self, now: float) -> None:
        expired = [k for k, w in self._windows.items() if now - w.start >= self.interval_s]
        for key in expired or list(self._windows)[: _MAX_KEYS // 2]:
            del self._windows[key]
