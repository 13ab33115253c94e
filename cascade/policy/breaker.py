"""A circuit breaker per tier: failure ratio in a sliding window, cooldown, half-open probes.

Time is injected (``now``, seconds on any monotonic clock), so the breaker is pure state and
tests need no sleeping. It is not thread-safe: use one per tier from the event loop.

``allow(now)`` before a call, then ``record(now, ok)`` after it, or ``release(now)`` when the
outcome says nothing about the tier's health. States::

    closed ──(>= min_calls in window_s, failures/calls >= failure_ratio)──> open
    open ──(cooldown_s elapsed)──> half_open
    half_open ──(half_open_probes successes)──> closed      (window cleared)
    half_open ──(a probe fails)──> open                    (cooldown restarts)

In half-open at most ``half_open_probes`` calls are let through at once. A probe released
without a verdict frees its slot at once for the next call; one that never reports at all is
forgotten after ``cooldown_s``, so the breaker cannot stay half-open forever. Outcomes reported
while the breaker is open are ignored; a call admitted before it opened that reports during
half-open counts as one of the probes.

What counts as a failure is the caller's choice; the gateway's is: timeouts, unavailability and
5xx-like engine failures of a remote tier count; client errors (the tier answered, and the
request was at fault), overload (back-pressure, not ill health) and cancellations are released.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

from cascade.policy.model import BreakerConfig

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """See the module docstring."""

    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self._calls: deque[tuple[float, bool]] = deque()  # (time, ok) while closed
        self._failures = 0  # failures in _calls, kept in step so every check is O(1)
        self._opened_at: float | None = None
        self._probes: list[float] = []  # grant times of outstanding half-open probes
        self._probe_successes = 0

    def state(self, now: float) -> BreakerState:
        if self._opened_at is None:
            return "closed"
        if now - self._opened_at < self.config.cooldown_s:
            return "open"
        return "half_open"

    def allow(self, now: float) -> bool:
        """Whether a call may go to the tier now. In half-open, granting counts as a probe."""
        state = self.state(now)
        if state == "closed":
            return True
        if state == "open":
            return False
        self._probes = [t for t in self._probes if now - t < self.config.cooldown_s]
        if len(self._probes) >= self.config.half_open_probes:
            return False
        self._probes.append(now)
        return True

    def record(self, now: float, ok: bool) -> None:
        """The outcome of a call that ``allow`` let through."""
        state = self.state(now)
        if state == "closed":
            self._record_closed(now, ok)
        elif state == "half_open" and self._probes:
            self._probes.pop(0)
            if not ok:
                self._open(now)
                return
            self._probe_successes += 1
            if self._probe_successes >= self.config.half_open_probes:
                self._close()

    def release(self, now: float) -> None:
        """A call that ``allow`` let through ended without a verdict on the tier's health: in
        half-open its probe slot is freed at once; otherwise nothing changes."""
        if self.state(now) == "half_open" and self._probes:
            self._probes.pop(0)

    def retry_after(self, now: float) -> float:
        """Seconds until the breaker next lets a call through (0 when it does now)."""
        if self.state(now) != "open" or self._opened_at is None:
            return 0.0
        return self._opened_at + self.config.cooldown_s - now

    def failure_ratio(self, now: float) -> float:
        """Failures / calls in the current window (0 with no calls)."""
        self._prune(now)
        if not self._calls:
            return 0.0
        return self._failures / len(self._calls)

    def _record_closed(self, now: float, ok: bool) -> None:
        self._calls.append((now, ok))
        self._failures += not ok
        self._prune(now)
        cfg = self.config
        if len(self._calls) >= cfg.min_calls and self.failure_ratio(now) >= cfg.failure_ratio:
            self._open(now)

    def _prune(self, now: float) -> None:
        while self._calls and now - self._calls[0][0] > self.config.window_s:
            _, ok = self._calls.popleft()
            self._failures -= not ok

    def _open(self, now: float) -> None:
        self._opened_at = now
        self._calls.clear()
        self._failures = 0
        self._probes.clear()
        self._probe_successes = 0

    def _close(self) -> None:
        self._opened_at = None
        self._calls.clear()
        self._failures = 0
        self._probes.clear()
        self._probe_successes = 0
