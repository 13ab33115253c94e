"""A model-agnostic async micro-batcher: rows of concurrent requests share one forward pass.

``submit(items)`` queues all rows of one request and resolves when every row has its output.
One worker task on the event loop forms batches (up to ``max_batch_items`` rows and
``max_batch_cost`` padded cost, waiting at most ``max_wait_s`` after the first row in line
arrived for more to come) and hands each batch to ``run_batch`` in ONE dedicated thread, so the
loop never runs model code. Contracts:

- Fair shares. Requests are served in start-time fair queuing order: every request belongs to
  a *flow* (``submit(..., flow=)``; a batch request's states share one), and a request is tagged
  with the work its flow's earlier requests already claimed, so a one-row request that arrives
  behind a batch of 64 states is served in the next batch, not after the 64. Between flows with
  nothing else queued it is first come, first served, so a request's wait is predictable.
- Admission by expected wait (``deadline``). The other flows' rows that will run before this
  request (tagged no later), in the batches ``_take`` will form of them, as ``cost_model``
  predicts them, plus what is left of the batch in flight, is the wait this request would
  suffer, scaled by ``correction``: the larger of what the measured waits say (between-batch
  gaps, other work on the machine) and of how far the last batches overran the model's
  prediction (the model lags a machine that suddenly slows down, such as warm-up figures taken
  on an idle machine against the first batches of a burst, and requests admitted on its word
  would wait several times their deadline); behind other work
  a request must also leave ``max_batch_s`` for the batch it will run in. When that passes the
  deadline, ``submit`` raises ``Overloaded`` at once with a ``retry_after`` of the excess; what
  it accepts runs to the end (no whole-call timeout throws accepted work away). A flow's own
  rows never count against it, so an idle batcher accepts any request. ``check`` asks the same
  before a caller spends work preparing rows.
- ``max_queue`` bounds the other flows' rows waiting (memory), also with ``Overloaded``; for a
  request with a deadline, until the first batch has run, one batch's worth does.
- A cancelled caller's queued rows are dropped before they are batched (``dropped_rows``).
- An exception from ``run_batch`` (or a wrong output count) goes to every caller in that batch.
- With ``sort_key``, a request's rows queue in key order (length, say), and a batch is the
  longest run at the head of the queue that fits the limits: similar rows share a forward pass,
  and no row is ever taken out of turn (which would break the waits admission promised).
- Metrics: batch size, batch compute time, queue wait (per request) and queue depth, labelled
  with the tier: the part of ``name`` before any ``/`` (``laya/english`` -> ``laya``). A tier's
  batchers share its depth gauge, each adding the rows it queues and taking away those that leave.
- A batch's cost is ``len(batch) * max(cost(row))``: the padded size a forward pass pays. With
  ``max_pad_fraction``, a row joins only while padding stays under that share of the batch's
  cost (on a CPU, padding is pure waste: batching saves little when rows are long). With
  ``max_batch_s``, a batch stops growing once ``cost_model`` predicts it would take longer: each
  of its rows waits for all of it.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from cascade import metrics
from cascade.engines.cost import CostModel
from cascade.errors import EngineFailed, EngineUnavailable, Overloaded

In = TypeVar("In")
Out = TypeVar("Out")
MIN_LEARNT_WAIT_S = 0.05  # shorter predicted waits are mostly noise: not learnt from
MIN_LEARNT_BATCH_S = 0.01  # nor are batches predicted shorter than this
_WAIT_UP, _WAIT_DOWN = 0.3, 0.05  # how fast the wait correction rises and falls
_LAG_DOWN = 0.3  # how fast the batch overrun falls back (it rises at once)
MAX_CORRECTION = 4.0


@dataclass(eq=False)
class _Request:
    future: asyncio.Future
    results: list[Any]
    remaining: int
    arrived: float
    flow: Hashable
    waited: bool = False  # its queue wait is recorded once, when its first row is batched
    predicted: float = 0.0  # the wait admission predicted for it, in seconds


@dataclass(eq=False)
class _Row:
    request: _Request
    index: int
    item: Any
    cost: int
    key: int = field(default=0)
    tag: float = 0.0  # its request's fair-queuing start tag, in units of cost
    seq: int = 0  # its request's arrival order, breaks ties between equal tags


def _order(row: _Row) -> tuple[float, int, int]:
    return row.tag, row.seq, row.key


class MicroBatcher(Generic[In, Out]):
    """Batches rows for ``run_batch(list[In]) -> list[Out]`` (same length, same order).

    ``calibration``: ``(costs, seconds)`` of runs made before serving (warm-up: the costs of
    the rows each run held), the first data of ``cost_model``; each batch then refines it.
    Without any, admission by deadline starts once the first batch has been measured.
    """

    def __init__(
        self,
        run_batch: Callable[[list[In]], list[Out]],
        *,
        name: str,
        max_batch_items: int,
        max_batch_cost: int,
        cost: Callable[[In], int] = lambda _: 1,
        max_wait_s: float = 0.002,
        max_queue: int = 256,
        sort_key: Callable[[In], int] | None = None,
        on_batch: Callable[[int, int, float], None] | None = None,
        max_pad_fraction: float | None = None,
        calibration: Sequence[tuple[Sequence[int], float]] = (),
        max_batch_s: float | None = None,
    ) -> None:
        self.name = name
        self._run_batch = run_batch
        self.max_batch_items, self.max_batch_cost = max_batch_items, max_batch_cost
        self._cost, self._sort_key = cost, sort_key
        self.max_wait_s, self.max_queue = max_wait_s, max_queue
        self._on_batch = on_batch
        self.max_pad_fraction = max_pad_fraction
        self.max_batch_s = max_batch_s
        self._pending: list[_Row] = []  # sorted by (tag, seq): the serving order
        self._inflight: list[_Row] = []
        self._inflight_since = 0.0
        self._inflight_expected = 0.0
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batcher-{name}")
        self._closed = False
        self.cost_model = CostModel()
        # Measured queue wait / predicted wait, learnt from the requests served: what the cost
        # model misses (time between batches, other work on the machine) scales predictions.
        self.wait_correction = 1.0
        # How many times the model's prediction the recent batches took (at least 1).
        self.batch_overrun = 1.0
        # Warm-up runs were timed on an idle machine: together they count as one batch, so the
        # first batches under traffic soon outweigh them.
        for costs, seconds in calibration:
            self.cost_model.observe(costs, seconds, weight=1 / len(calibration))
        self._vtime = 0.0  # the fair queue's virtual time: the tag of the last row served
        self._finish: dict[Hashable, float] = {}  # each flow's last claimed tag
        self._seq = itertools.count()
        self.dropped_rows = 0
        self.batches = 0
        tier = name.split("/", 1)[0]
        self._depth = metrics.QUEUE_DEPTH.labels(tier=tier)
        self._wait = metrics.QUEUE_WAIT.labels(tier=tier)
        self._size = metrics.BATCH_SIZE.labels(tier=tier)
        self._compute = metrics.BATCH_DURATION.labels(tier=tier)

    def queue_depth(self) -> int:
        """Rows waiting to be batched (rows in flight not included)."""
        return len(self._pending)

    def expected_wait(self, now: float, *, flow: Hashable | None = None,
                      before_tag: float | None = None) -> float:
        """Seconds the work ahead would keep a new request of ``flow`` waiting: the batch in
        flight (unless it holds only rows of ``flow``), plus the other flows' rows served before
        ``before_tag`` (all when None), as ``cost_model`` predicts them.

        A batch running longer than expected is assumed to need as long again as it has
        overrun, so a stuck engine soon refuses new work instead of queueing it forever.
        """
        return self._raw_wait(now, flow, before_tag) * self.correction

    @property
    def correction(self) -> float:
        """What predicted waits are multiplied by (see the module docstring)."""
        return max(self.wait_correction, self.batch_overrun)

    def _raw_wait(self, now: float, flow: Hashable | None, before_tag: float | None) -> float:
        ahead = [r for r in self._pending
                 if r.request.flow != flow and (before_tag is None or r.tag <= before_tag)]
        wait, i = 0.0, 0
        while i < len(ahead):  # the batches they will form, as ``_take`` will form them
            n = self._run_length(ahead, i)
            wait += self._seconds(n, max(r.cost for r in ahead[i: i + n]))
            i += n
        if any(r.request.flow != flow for r in self._inflight):
            wait += abs(self._inflight_expected - (now - self._inflight_since))
        return wait

    async def submit(self, items: list[In], *, flow: Hashable | None = None,
                     deadline: float | None = None) -> list[Out]:
        """Outputs for ``items`` in order.

        ``flow``: the fairness key (None: a flow of its own). ``deadline``: a loop-clock
        (``time.monotonic()``) instant; raises ``Overloaded`` at once when the expected wait
        would pass it, or when ``max_queue`` rows of other flows are already waiting.
        """
        if self._closed:
            raise EngineUnavailable(f"{self.name}: batcher closed")
        if not items:
            return []
        loop = asyncio.get_running_loop()
        flow = object() if flow is None else flow
        costs = [self._cost(item) for item in items]
        tag = max(self._vtime, self._finish.get(flow, self._vtime))
        predicted = self._admit(loop.time(), flow, tag, deadline)
        request = _Request(loop.create_future(), [None] * len(items), len(items), loop.time(), flow,
                           predicted=predicted)
        seq = next(self._seq)
        for i, (item, cost) in enumerate(zip(items, costs, strict=True)):
            key = self._sort_key(item) if self._sort_key else 0
            bisect.insort(self._pending, _Row(request, i, item, cost, key, tag, seq), key=_order)
        self._finish[flow] = tag + sum(costs)
        self._depth.inc(len(items))
        if self._worker is None:
            self._worker = loop.create_task(self._work(), name=f"batcher-{self.name}")
        self._wakeup.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            self._forget(request, count=True)
            raise

    def check(self, *, flow: Hashable | None = None, deadline: float | None = None) -> None:
        """Raise now what ``submit`` would raise on admission (closed, queue full, the wait past
        ``deadline``), so a caller refuses before it spends work preparing rows. ``submit``
        checks again."""
        if self._closed:
            raise EngineUnavailable(f"{self.name}: batcher closed")
        flow = object() if flow is None else flow
        tag = max(self._vtime, self._finish.get(flow, self._vtime))
        self._admit(time.monotonic(), flow, tag, deadline)

    def _admit(self, now: float, flow: Hashable, tag: float, deadline: float | None) -> float:
        """Refuse (``Overloaded``) or return the wait predicted for the request, uncorrected."""
        others = sum(1 for r in self._pending if r.request.flow != flow)
        # Until a batch has been timed under real traffic, the warm-up figures may be far too
        # kind (a burst of requests slows every batch): queue at most one batch of others' rows.
        limit = self.max_queue
        if deadline is not None and not self.batches:
            limit = min(limit, self.max_batch_items)
        if others and others + 1 > limit:
            wait = self.expected_wait(now)
            raise Overloaded(f"{self.name}: {others} rows queued",
                             retry_after=max(1.0, round(wait, 1)))
        raw = self._raw_wait(now, flow, tag)
        wait = raw * self.correction
        # Behind other work, a request must also have time for the batch it will run in.
        reserve = (self.max_batch_s or 0.0) if wait > 0 else 0.0
        if deadline is not None and now + wait + reserve > deadline:
            budget = max(0.0, deadline - now - reserve)
            raise Overloaded(
                f"{self.name}: about {wait:.1f} s of work ahead; this request may wait "
                f"{budget:.1f} s", retry_after=max(1.0, round(wait - budget, 1)),
            )
        return raw

    def _learn_wait(self, predicted: float, actual: float) -> None:
        """How the wait admission predicted came out: the correction follows the ratio, fast
        when waits run longer than predicted (a promise broken) and slowly back when shorter."""
        if predicted >= MIN_LEARNT_WAIT_S:
            ratio = min(max(actual / predicted, 0.5), MAX_CORRECTION)
            rate = _WAIT_UP if ratio > self.wait_correction else _WAIT_DOWN
            self.wait_correction += rate * (ratio - self.wait_correction)

    def _learn_overrun(self, expected: float, seconds: float) -> None:
        """A batch the model expected to take ``expected`` took ``seconds``."""
        if expected >= MIN_LEARNT_BATCH_S:
            ratio = min(max(seconds / expected, 1.0), MAX_CORRECTION)
            lag = self.batch_overrun
            self.batch_overrun = ratio if ratio > lag else lag + _LAG_DOWN * (ratio - lag)

    def _forget(self, request: _Request, *, count: bool) -> None:
        kept = [r for r in self._pending if r.request is not request]
        gone = len(self._pending) - len(kept)
        if count:
            self.dropped_rows += gone
        self._pending = kept
        self._depth.dec(gone)

    def _full(self) -> bool:
        rows = self._pending[: self.max_batch_items]
        padded = len(rows) * max(r.cost for r in rows)
        return len(rows) >= self.max_batch_items or padded >= self.max_batch_cost

    def _seconds(self, rows: int, widest: int) -> float:
        """Predicted compute of a batch of ``rows`` rows padded to ``widest``; 0 before any
        data."""
        return self.cost_model.seconds([widest] * rows) or 0.0

    def _run_length(self, rows: Sequence[_Row], start: int) -> int:
        """How many rows from ``rows[start]`` on form the next batch: the longest run that fits
        the item, padded-cost, padding-share and time limits (the first row always does)."""
        widest, real, n = rows[start].cost, rows[start].cost, 1
        for i in range(start + 1, min(len(rows), start + self.max_batch_items)):
            cost = rows[i].cost
            wide = max(widest, cost)
            padded = (n + 1) * wide
            if padded > self.max_batch_cost:
                break
            if self.max_pad_fraction is not None and (
                    padded - real - cost > self.max_pad_fraction * padded):
                break
            if self.max_batch_s is not None and self._seconds(n + 1, wide) > self.max_batch_s:
                break
            widest, real, n = wide, real + cost, n + 1
        return n

    def _take(self) -> list[_Row]:
        """The longest run of rows at the head of the serving order that fits the batch limits.
        Never rows from further back: a row taken out of turn would delay every request queued
        before it past the wait it was admitted with."""
        batch = self._pending[: self._run_length(self._pending, 0)]
        oldest = batch[0]
        del self._pending[: len(batch)]
        self._depth.dec(len(batch))
        self._vtime = max(self._vtime, oldest.tag)
        if len(self._finish) > 4 * len(self._pending) + 64:  # forget flows that are all served
            self._finish = {f: t for f, t in self._finish.items() if t > self._vtime}
        return batch

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            deadline = self._pending[0].request.arrived + self.max_wait_s
            while self._pending and not self._full() and (delay := deadline - loop.time()) > 0:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), delay)
                except TimeoutError:
                    break
            if self._pending:
                await self._run(loop, self._take())

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Row]) -> None:
        now = loop.time()
        for request in {id(r.request): r.request for r in batch}.values():
            if not request.waited:
                request.waited = True
                self._wait.observe(now - request.arrived)
                self._learn_wait(request.predicted, now - request.arrived)
        self._size.observe(len(batch))
        started = time.perf_counter()
        widest = max(r.cost for r in batch)
        self._inflight = batch
        self._inflight_since = now
        self._inflight_expected = self._seconds(len(batch), widest)
        try:
            outputs = await loop.run_in_executor(
                self._executor, self._run_batch, [r.item for r in batch]
            )
            if len(outputs) != len(batch):
                raise EngineFailed(f"{self.name}: {len(outputs)} outputs for {len(batch)} rows")
        except Exception as exc:  # fan the failure out to every caller in this batch
            for request in {id(r.request): r.request for r in batch}.values():
                self._forget(request, count=False)
                if not request.future.done():
                    request.future.set_exception(exc)
        else:
            for row, out in zip(batch, outputs, strict=True):
                request = row.request
                request.results[row.index] = out
                request.remaining -= 1
                if request.remaining == 0 and not request.future.done():
                    request.future.set_result(request.results)
        self._inflight = []
        seconds = time.perf_counter() - started
        self._compute.observe(seconds)
        self.batches += 1
        self._learn_overrun(self._inflight_expected, seconds)
        self.cost_model.observe([widest] * len(batch), seconds)  # padding costs what rows do
        if self._on_batch is not None:
            self._on_batch(len(batch), len(batch) * max(r.cost for r in batch), seconds)

    async def aclose(self) -> None:
        """Stop the worker, fail every queued caller with ``EngineUnavailable``."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for row in self._pending + self._inflight:
            if not row.request.future.done():
                row.request.future.set_exception(EngineUnavailable(f"{self.name}: closed"))
        self._depth.dec(len(self._pending))
        self._pending, self._inflight = [], []
        self._executor.shutdown(wait=False, cancel_futures=True)
