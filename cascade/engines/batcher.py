"""A model-agnostic async micro-batcher: rows of concurrent requests share one forward pass.

``submit(items)`` queues all rows of one request and resolves when every row has its output.
One worker task on the event loop forms batches (up to ``max_batch_items`` rows and
``max_batch_cost`` padded cost, waiting at most ``max_wait_s`` after the oldest row arrived for
more to come) and hands each batch to ``run_batch`` in ONE dedicated thread, so the loop never
runs model code. Contracts:

- Overload fails fast: when ``max_queue`` rows are already waiting, ``submit`` raises
  ``Overloaded`` with a ``retry_after`` estimated from recent throughput.
- A cancelled caller's queued rows are dropped before they are batched (``dropped_rows``).
- An exception from ``run_batch`` (or a wrong output count) goes to every caller in that batch.
- With ``sort_key``, rows near the oldest one in length are grouped to cut padding; the batch
  always contains the oldest waiting row, so no row starves.
- Metrics: batch size, batch compute time, queue wait (per request) and queue depth, labelled
  with the tier: the part of ``name`` before any ``/`` (``laya/english`` -> ``laya``). A tier's
  batchers share its depth gauge, each adding the rows it queues and taking away those that leave.
- A batch's cost is ``len(batch) * max(cost(row))``: the padded size a forward pass pays. With
  ``max_pad_fraction``, a row joins only while padding stays under that share of the batch's
  cost (on a CPU, padding is pure waste: batching saves little when rows are long).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from cascade import metrics
from cascade.errors import EngineFailed, EngineUnavailable, Overloaded

In = TypeVar("In")
Out = TypeVar("Out")
LOOKAHEAD = 4  # rows considered for grouping: this many batches' worth


@dataclass(eq=False)
class _Request:
    future: asyncio.Future
    results: list[Any]
    remaining: int
    arrived: float
    waited: bool = False  # its queue wait is recorded once, when its first row is batched


@dataclass(eq=False)
class _Row:
    request: _Request
    index: int
    item: Any
    cost: int
    key: int = field(default=0)


class MicroBatcher(Generic[In, Out]):
    """Batches rows for ``run_batch(list[In]) -> list[Out]`` (same length, same order)."""

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
    ) -> None:
        self.name = name
        self._run_batch = run_batch
        self.max_batch_items, self.max_batch_cost = max_batch_items, max_batch_cost
        self._cost, self._sort_key = cost, sort_key
        self.max_wait_s, self.max_queue = max_wait_s, max_queue
        self._on_batch = on_batch
        self.max_pad_fraction = max_pad_fraction
        self._pending: list[_Row] = []
        self._inflight: list[_Row] = []
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batcher-{name}")
        self._closed = False
        self._row_seconds = 0.01  # moving estimate, used only for Retry-After
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

    async def submit(self, items: list[In]) -> list[Out]:
        """Outputs for ``items`` in order; raises ``Overloaded`` at once when the queue is full."""
        if self._closed:
            raise EngineUnavailable(f"{self.name}: batcher closed")
        if not items:
            return []
        if self._pending and len(self._pending) + len(items) > self.max_queue:
            wait = len(self._pending) * self._row_seconds
            raise Overloaded(
                f"{self.name}: {len(self._pending)} rows queued",
                retry_after=max(1.0, round(wait, 1)),
            )
        loop = asyncio.get_running_loop()
        request = _Request(loop.create_future(), [None] * len(items), len(items), loop.time())
        self._pending += [
            _Row(request, i, item, self._cost(item), self._sort_key(item) if self._sort_key else 0)
            for i, item in enumerate(items)
        ]
        self._depth.inc(len(items))
        if self._worker is None:
            self._worker = loop.create_task(self._work(), name=f"batcher-{self.name}")
        self._wakeup.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            self._forget(request, count=True)
            raise

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

    def _fits(self, batch: list[_Row], widest: int, pick: _Row) -> bool:
        padded = (len(batch) + 1) * max(widest, pick.cost)
        if padded > self.max_batch_cost:
            return False
        if self.max_pad_fraction is None:
            return True
        real = sum(r.cost for r in batch) + pick.cost
        return padded - real <= self.max_pad_fraction * padded

    def _take(self) -> list[_Row]:
        """The oldest row plus its nearest neighbours by sort key, within the batch limits."""
        oldest = self._pending[0]
        window = self._pending[: self.max_batch_items * LOOKAHEAD]
        if self._sort_key is not None:
            window = sorted(window, key=lambda r: r.key)
        lo = hi = window.index(oldest)
        batch, widest = [oldest], oldest.cost
        open_left, open_right = True, True
        while len(batch) < self.max_batch_items and (open_left or open_right):
            left = window[lo - 1] if open_left and lo > 0 else None
            right = window[hi + 1] if open_right and hi + 1 < len(window) else None
            if left is None and right is None:
                break
            go_right = left is None or (
                right is not None and right.key - oldest.key <= oldest.key - left.key
            )
            pick = right if go_right else left
            assert pick is not None
            if not self._fits(batch, widest, pick):
                # neighbours further out on this side only differ more from the oldest row
                open_right, open_left = (False, open_left) if go_right else (open_right, False)
                continue
            batch.append(pick)
            widest = max(widest, pick.cost)
            if go_right:
                hi += 1
            else:
                lo -= 1
        taken = set(map(id, batch))
        self._pending = [r for r in self._pending if id(r) not in taken]
        self._depth.dec(len(batch))
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
        self._size.observe(len(batch))
        started = time.perf_counter()
        self._inflight = batch
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
        self._row_seconds = 0.8 * self._row_seconds + 0.2 * seconds / len(batch)
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
