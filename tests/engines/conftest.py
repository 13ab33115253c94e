"""Helpers of the engine tests: a clock a test moves by hand, and a recording ``run_batch``."""

from __future__ import annotations

import asyncio
import threading


class FakeClock:
    """A monotonic clock that moves only when told to (``advance``), from any thread."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Recorder:
    """A run_batch that records each batch and its thread; optionally blocks at ``gate``, fails,
    or takes ``seconds_per_row`` of ``clock``'s time."""

    def __init__(
        self,
        fail: Exception | None = None,
        *,
        clock: FakeClock | None = None,
        seconds_per_row: float = 0.0,
    ) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[int] = set()
        self.entered = threading.Event()  # set once a batch has reached the gate
        self.gate = threading.Event()
        self.gate.set()
        self.fail = fail
        self.clock, self.seconds_per_row = clock, seconds_per_row

    def __call__(self, items: list[int]) -> list[int]:
        self.entered.set()
        self.gate.wait(5)
        if self.clock is not None:
            self.clock.advance(self.seconds_per_row * len(items))
        self.batches.append(list(items))
        self.threads.add(threading.get_ident())
        if self.fail is not None:
            raise self.fail
        return [i * 10 for i in items]

    async def inside(self) -> None:
        """Until the batcher's worker thread is inside a batch (held at the gate when closed)."""
        assert await asyncio.to_thread(self.entered.wait, 5)


async def settle() -> None:
    """One turn of the loop: tasks just created (or cancelled) run up to their first wait (a
    ``submit`` up to awaiting its result), no timer involved."""
    await asyncio.sleep(0)
