"""Shadow calls: a cheap-final request mirrored to the strong tier in the background, bounded.

The strong answer goes to the decision log (the row's shadow columns) and to live control
(agreement metrics; the teacher's labels). A shadow call never touches a breaker and never
delays the request it mirrors; at ``[shadow] max_concurrent`` calls in flight, or with the
strong tier's breaker not closed, it is skipped and counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall
from cascade.control.live import LiveControl
from cascade.errors import ClientError, EngineError, Overloaded
from cascade.policy.breaker import CircuitBreaker
from cascade.policy.costs import kind_of
from cascade.policy.flow import ShadowCall
from cascade.policy.serving import Serving
from cascade.policy.stamp import Stamp
from cascade.store.base import DecisionStore
from cascade.tracing.calls import traced

# One tier call of a version, outside the breaker's counts: (serving, tier, call).
ShadowCaller = Callable[[Serving, str, EngineCall], Awaitable[EngineAnswer]]


class ShadowMirror:
    def __init__(
        self,
        call: ShadowCaller,
        breakers: Mapping[str, CircuitBreaker],
        clock: Callable[[], float],
        control: LiveControl,
    ) -> None:
        self._call, self._breakers, self._clock, self._control = call, breakers, clock, control
        self._tasks: set[asyncio.Task[None]] = set()

    def mirror(
        self, serving: Serving, shadow: ShadowCall, stamp: Stamp, decisions: DecisionStore | None
    ) -> None:
        """Send ``shadow`` in the background (its answer logged to ``decisions``), unless too
        many are in flight or its tier's breaker is not closed."""
        busy = len(self._tasks) >= serving.policy.shadow.max_concurrent
        if busy or self._breakers[shadow.tier].state(self._clock()) != "closed":
            metrics.SHADOW.labels(outcome="skipped_busy").inc()
            return
        task = asyncio.get_running_loop().create_task(self._run(serving, shadow, stamp, decisions))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settled(self) -> None:
        """Wait for the shadow calls in flight to end."""
        await asyncio.gather(*self._tasks)

    async def aclose(self) -> None:
        """Cancel the shadow calls in flight and wait for them."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(
        self, serving: Serving, shadow: ShadowCall, stamp: Stamp, decisions: DecisionStore | None
    ) -> None:
        try:
            answering = self._call(serving, shadow.tier, shadow.call)
            strong = await traced(
                shadow.tier,
                "shadow",
                kind_of(serving.policy.tiers[shadow.tier]),
                shadow.call,
                answering,
            )
        except (EngineError, Overloaded, ClientError):
            metrics.SHADOW.labels(outcome="failed").inc()
            return
        metrics.SHADOW.labels(outcome="sent").inc()
        if decisions is not None:
            decisions.shadowed(shadow.call, strong, stamp)
        self._control.shadowed(shadow, strong)  # agreement metrics; the teacher's labels
