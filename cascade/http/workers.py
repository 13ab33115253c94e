"""The threads that decode and validate request bodies and images.

They are apart from asyncio's default executor, which the engines use (tokenizing, preparing
images), so hostile bodies (many compressed frames, large images) can only queue behind each
other: they never take the threads that answer other requests. Both the threads and the queue
in front of them are bounded: a full queue is ``Overloaded`` (503 + Retry-After) at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from cascade.errors import Overloaded

T = TypeVar("T")


class DecodePool:
    """``threads`` worker threads and at most ``max_waiting`` jobs queued behind them.

    ``run`` is called from the event loop only (the counter is not thread-safe). A cancelled
    caller stops waiting at once; a job a thread has started runs to its end (pure CPU work).
    """

    def __init__(self, threads: int, max_waiting: int) -> None:
        self.threads = threads
        self.max_waiting = max_waiting
        self.pending = 0
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="cascade-decode")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self.pending >= self.threads + self.max_waiting:
            raise Overloaded(
                f"request decoding is busy ({self.pending} bodies decoding or waiting)",
                retry_after=1,
            )
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self.pending -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
