"""Admission by expected wait: whether a request may join a tier's queue, and what it learns.

Sans-IO: no clock, no event loop, no model. The batcher hands ``decide`` the state of its queue
(the other flows' rows waiting, whether a batch has been timed under traffic, and the seconds of
work its cost model predicts ahead of the request), ``now`` from its one clock and the request's
``deadline`` on that clock; it tells ``waited`` and ``ran`` how its predictions came out. Policy:

- The predicted wait is scaled by ``correction``: the larger of what the measured waits say
  (between-batch gaps, other work on the machine: ``wait_correction``, rising 0.3 of the way to
  each new ratio, falling 0.05) and of how far the last batches overran the cost model's
  prediction (``batch_overrun``: rises at once, falls back 0.3 of the way per batch). The model
  lags a machine that suddenly slows down, such as warm-up figures taken on an idle machine
  against the first batches of a burst, and requests admitted on its word would wait several
  times their deadline.
- Behind other work, a request must also leave ``max_batch_s`` for the batch it will run in.
  When the corrected wait plus that passes the deadline, it is refused with a ``retry_after`` of
  the excess (at least 1 s). A flow's own rows are not counted, so an idle queue admits anything.
- ``max_queue`` bounds the other flows' rows waiting; for a request with a deadline, until the
  first batch has been timed, one batch's worth (``max_batch_items``) does: warm-up figures may
  be far too kind. Refused with the corrected time of all the work queued as ``retry_after``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MIN_LEARNT_WAIT_S = 0.05  # shorter predicted waits are mostly noise: not learnt from
MIN_LEARNT_BATCH_S = 0.01  # nor are batches predicted shorter than this
_WAIT_UP, _WAIT_DOWN = 0.3, 0.05  # how fast the wait correction rises and falls
_LAG_DOWN = 0.3  # how fast the batch overrun falls back (it rises at once)
MAX_CORRECTION = 4.0


@dataclass(frozen=True)
class QueueState:
    """What admission reads of a queue for one request. The waits are the cost model's
    predictions, uncorrected, and computed only when the decision needs them."""

    others: int  # rows of other flows waiting
    timed: bool  # a batch has been timed under traffic
    ahead: Callable[[], float]  # seconds before this request's batch can start
    backlog: Callable[[], float]  # seconds of all the work queued and in flight


@dataclass(frozen=True)
class Admit:
    predicted: float  # the wait predicted for the request, uncorrected: ``waited`` learns from it


@dataclass(frozen=True)
class Refuse:
    reason: str
    retry_after: float  # seconds


def _retry_after(seconds: float) -> float:
    return max(1.0, round(seconds, 1))


class QueueAdmission:
    """The admission policy of one queue and its learnt correction (see the module docstring)."""

    def __init__(
        self, *, max_queue: int, max_batch_items: int, max_batch_s: float | None = None
    ) -> None:
        self.max_queue, self.max_batch_items, self.max_batch_s = (
            max_queue,
            max_batch_items,
            max_batch_s,
        )
        # Measured queue wait / predicted wait, learnt from the requests served.
        self.wait_correction = 1.0
        # How many times the model's prediction the recent batches took (at least 1).
        self.batch_overrun = 1.0

    @property
    def correction(self) -> float:
        """What predicted waits are multiplied by."""
        return max(self.wait_correction, self.batch_overrun)

    def decide(self, queue: QueueState, *, now: float, deadline: float | None) -> Admit | Refuse:
        """Admit the request or refuse it at once, with how long to wait before trying again."""
        limit = self.max_queue
        if deadline is not None and not queue.timed:
            limit = min(limit, self.max_batch_items)
        if queue.others and queue.others + 1 > limit:
            return Refuse(
                f"{queue.others} rows queued", _retry_after(queue.backlog() * self.correction)
            )
        raw = queue.ahead()
        wait = raw * self.correction
        reserve = (self.max_batch_s or 0.0) if wait > 0 else 0.0
        if deadline is not None and now + wait + reserve > deadline:
            budget = max(0.0, deadline - now - reserve)
            return Refuse(
                f"about {wait:.1f} s of work ahead; this request may wait {budget:.1f} s",
                _retry_after(wait - budget),
            )
        return Admit(raw)

    def waited(self, predicted: float, actual: float) -> None:
        """A request admitted on a wait of ``predicted`` seconds started after ``actual``: the
        correction follows the ratio, fast when waits run longer than predicted (a promise
        broken) and slowly back when shorter."""
        if predicted >= MIN_LEARNT_WAIT_S:
            ratio = min(max(actual / predicted, 0.5), MAX_CORRECTION)
            rate = _WAIT_UP if ratio > self.wait_correction else _WAIT_DOWN
            self.wait_correction += rate * (ratio - self.wait_correction)

    def ran(self, expected: float, seconds: float) -> None:
        """A batch the cost model expected to take ``expected`` seconds took ``seconds``."""
        if expected >= MIN_LEARNT_BATCH_S:
            ratio = min(max(seconds / expected, 1.0), MAX_CORRECTION)
            lag = self.batch_overrun
            self.batch_overrun = ratio if ratio > lag else lag + _LAG_DOWN * (ratio - lag)
