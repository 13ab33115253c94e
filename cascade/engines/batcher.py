"""A model-agnostic async micro-batcher: rows of concurrent requests share one forward pass.

``submit(items)`` queues all rows of one request and resolves when every row has its output.
One worker task on the event loop forms batches (up to ``max_batch_items`` rows and
``max_batch_cost`` padded cost, waiting at most ``max_wait_s`` after the first row in line
arrived for more to come) and hands each batch to ``run_batch`` in ONE dedicated thread, so the
loop never runs model code. Every time it reads (arrivals, waits, batch compute) comes from one
``clock`` (``time.monotonic`` unless a test injects another), the clock deadlines are given on.
Contracts:

- Fair shares: rows are served in start-time fair queuing order (``fair_queue``); every request
  belongs to a *flow* (``submit(..., flow=)``; a batch request's states share one).
- Admission by expected wait (``deadline``), decided by ``admission`` from the other flows' rows
  that will run before this request (tagged no later), in the batches ``_take`` will form of
  them, as ``cost_model`` predicts them, plus what is left of the batch in flight. A refusal
  raises ``Overloaded`` at once with a ``retry_after``; what is accepted runs to the end (no
  whole-call timeout throws accepted work away). ``check`` asks the same before a caller spends
  work preparing rows. Each request's measured wait and each batch's measured compute are
  handed back to ``admission`` and ``cost_model`` to learn from.
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
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cascade import metrics
from cascade.engines.admission import QueueAdmission, QueueState, Refuse
from cascade.engines.cost import CostModel
from cascade.engines.fair_queue import FairQueue
from cascade.errors import EngineFailed, EngineUnavailable, Overloaded

In = TypeVar("In")
Out = TypeVar("Out")


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
    key: int = 0
    tag: float = 0.0  # its request's fair-queuing start tag, in units of cost
    seq: int = 0  # its request's arrival order, breaks ties between equal tags


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._run_batch = run_batch
        self.max_batch_items, self.max_batch_cost = max_batch_items, max_batch_cost
        self._cost, self._sort_key = cost, sort_key
        self.max_wait_s = max_wait_s
        self._on_batch = on_batch
        self.max_pad_fraction = max_pad_fraction
        self.max_batch_s = max_batch_s
        self._clock = clock
        self._queue: FairQueue[_Row] = FairQueue()
        self._inflight: list[_Row] = []
        self._inflight_since = 0.0
        self._inflight_expected = 0.0
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batcher-{name}")
        self._closed = False
        self.cost_model = CostModel()
        self.cost_model.warm_up(calibration)
        self.admission = QueueAdmission(
            max_queue=max_queue, max_batch_items=max_batch_items, max_batch_s=max_batch_s
        )
        self.dropped_rows = 0
        self.batches = 0
        tier = name.split("/", 1)[0]
        self._depth = metrics.QUEUE_DEPTH.labels(tier=tier)
        self._wait = metrics.QUEUE_WAIT.labels(tier=tier)
        self._size = metrics.BATCH_SIZE.labels(tier=tier)
        self._compute = metrics.BATCH_DURATION.labels(tier=tier)

    def queue_depth(self) -> int:
        """Rows waiting to be batched (rows in flight not included)."""
        return len(self._queue.rows)

    def expected_wait(
        self, now: float, *, flow: Hashable | None = None, before_tag: float | None = None
    ) -> float:
        """Seconds the work ahead would keep a new request of ``flow`` waiting, corrected by
        ``admission`` (see ``_raw_wait``)."""
        return self._raw_wait(now, flow, before_tag) * self.admission.correction

    def _raw_wait(self, now: float, flow: Hashable | None, before_tag: float | None) -> float:
        """The batch in flight (unless it holds only rows of ``flow``), plus the other flows'
        rows served before ``before_tag`` (all when None), as ``cost_model`` predicts them.

        A batch running longer than expected is assumed to need as long again as it has
        overrun, so a stuck engine soon refuses new work instead of queueing it forever.
        """
        ahead = [
            r
            for r in self._queue.rows
            if r.request.flow != flow and (before_tag is None or r.tag <= before_tag)
        ]
        wait, i = 0.0, 0
        while i < len(ahead):  # the batches they will form, as ``_take`` will form them
            n = self._run_length(ahead, i)
            wait += self._seconds(n, max(r.cost for r in ahead[i : i + n]))
            i += n
        if any(r.request.flow != flow for r in self._inflight):
            wait += abs(self._inflight_expected - (now - self._inflight_since))
        return wait

    async def submit(
        self, items: list[In], *, flow: Hashable | None = None, deadline: float | None = None
    ) -> list[Out]:
        """Outputs for ``items`` in order.

        ``flow``: the fairness key (None: a flow of its own). ``deadline``: an instant on the
        batcher's clock (``time.monotonic()``); raises ``Overloaded`` at once when admission
        refuses the request.
        """
        if self._closed:
            raise EngineUnavailable(f"{self.name}: batcher closed")
        if not items:
            return []
        loop = asyncio.get_running_loop()
        flow = object() if flow is None else flow
        costs = [self._cost(item) for item in items]
        tag = self._queue.start_tag(flow)
        now = self._clock()
        predicted = self._admit(now, flow, tag, deadline)
        request = _Request(
            loop.create_future(), [None] * len(items), len(items), now, flow, predicted=predicted
        )
        self._queue.push(
            flow,
            tag,
            [
                _Row(request, i, item, cost, self._sort_key(item) if self._sort_key else 0)
                for i, (item, cost) in enumerate(zip(items, costs, strict=True))
            ],
        )
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
        self._admit(self._clock(), flow, self._queue.start_tag(flow), deadline)

    def _admit(self, now: float, flow: Hashable, tag: float, deadline: float | None) -> float:
        """Raise ``Overloaded`` if admission refuses; else the wait predicted, uncorrected."""
        state = QueueState(
            others=sum(1 for r in self._queue.rows if r.request.flow != flow),
            timed=self.batches > 0,
            ahead=lambda: self._raw_wait(now, flow, tag),
            backlog=lambda: self._raw_wait(now, None, None),
        )
        verdict = self.admission.decide(state, now=now, deadline=deadline)
        if isinstance(verdict, Refuse):
            raise Overloaded(f"{self.name}: {verdict.reason}", retry_after=verdict.retry_after)
        return verdict.predicted

    def _forget(self, request: _Request, *, count: bool) -> None:
        gone = self._queue.remove(lambda r: r.request is request)
        if count:
            self.dropped_rows += gone
        self._depth.dec(gone)

    def _full(self) -> bool:
        rows = self._queue.rows[: self.max_batch_items]
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
                padded - real - cost > self.max_pad_fraction * padded
            ):
                break
            if self.max_batch_s is not None and self._seconds(n + 1, wide) > self.max_batch_s:
                break
            widest, real, n = wide, real + cost, n + 1
        return n

    def _take(self) -> list[_Row]:
        """The longest run of rows at the head of the serving order that fits the batch limits.
        Never rows from further back: a row taken out of turn would delay every request queued
        before it past the wait it was admitted with."""
        batch = self._queue.pop(self._run_length(self._queue.rows, 0))
        self._depth.dec(len(batch))
        return batch

    async def _work(self) -> None:
        while True:
            if not self._queue.rows:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            deadline = self._queue.rows[0].request.arrived + self.max_wait_s
            while self._queue.rows and not self._full() and (delay := deadline - self._clock()) > 0:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), delay)
                except TimeoutError:
                    break
            if self._queue.rows:
                await self._run(self._take())

    async def _run(self, batch: list[_Row]) -> None:
        now = self._clock()
        for request in {id(r.request): r.request for r in batch}.values():
            if not request.waited:
                request.waited = True
                self._wait.observe(now - request.arrived)
                self.admission.waited(request.predicted, now - request.arrived)
        self._size.observe(len(batch))
        widest = max(r.cost for r in batch)
        self._inflight = batch
        self._inflight_since = now
        self._inflight_expected = self._seconds(len(batch), widest)
        started = self._clock()
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(
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
        seconds = self._clock() - started
        self._compute.observe(seconds)
        self.batches += 1
        self.admission.ran(self._inflight_expected, seconds)
        self.cost_model.observe([widest] * len(batch), seconds)  # padding costs what rows do
        if self._on_batch is not None:
            self._on_batch(len(batch), len(batch) * widest, seconds)

    async def aclose(self) -> None:
        """Stop the worker, fail every queued caller with ``EngineUnavailable``."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for row in self._queue.rows + self._inflight:
            if not row.request.future.done():
                row.request.future.set_exception(EngineUnavailable(f"{self.name}: closed"))
        self._depth.dec(self._queue.remove(lambda _row: True))
        self._inflight = []
        self._executor.shutdown(wait=False, cancel_futures=True)
