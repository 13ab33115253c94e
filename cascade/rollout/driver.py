"""The background look of a running canary (I/O only; ``cascade.http.rollouts`` applies what it
finds). Every ``guards.interval_s`` it reads the rollout's shared state (``Book.latest``: another
replica, or an admin on one, may have stepped, promoted or ended it: ``follow``), then, with a
decision log, each arm's counts since the rollout started (``arm_counts``, in a thread) and the
guards' verdict on them (``judge``, look number shared through the state): ``judged``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from cascade.rollout.arms import arm_counts
from cascade.rollout.book import Book
from cascade.rollout.canary import Canary, CanarySplit
from cascade.rollout.state import RolloutFinished, RolloutState
from cascade.rollout.verdict import ArmCounts, Verdict, judge

log = logging.getLogger("cascade")
IDLE_S = 1.0  # how often it looks for a canary when none runs
NONE = ArmCounts()
OnState = Callable[[Canary, RolloutState | None], Awaitable[None]]
OnVerdict = Callable[[Canary, dict[str, ArmCounts], Verdict], Awaitable[None]]


class RolloutDriver:
    """Looks at ``split``'s canary in ``book``; ``target``: the decision log (None: nothing to
    count, so no verdict)."""

    def __init__(
        self,
        book: Book,
        split: CanarySplit,
        target: str | None,
        *,
        follow: OnState,
        judged: OnVerdict,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.book, self.split, self.target, self.clock = book, split, target, clock
        self.follow, self.judged = follow, judged
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            canary = self.split.canary
            await asyncio.sleep(IDLE_S if canary is None else canary.rollout.guards.interval_s)
            canary = self.split.canary
            if canary is None:
                continue
            try:
                await self.look(canary)
            except Exception:  # the store is down: the canary goes on, the next look retries
                log.exception("rollout %s: this look failed; the next one retries", canary.id)

    async def look(self, canary: Canary) -> None:
        """One look (the module docstring)."""
        current, candidate = canary.current_hash, canary.serving.policy_hash
        found = await asyncio.to_thread(self.book.latest, current, candidate)
        if found is None or (found.id, found.status, found.share) != (
            canary.id,
            "running",
            canary.share,
        ):
            await self.follow(canary, found)
            return
        if self.target is None:
            return
        counts = await asyncio.to_thread(
            arm_counts, self.target, [current, candidate], canary.started
        )
        try:
            found = await asyncio.to_thread(
                self.book.update, canary.id, looks=found.looks + 1, now=self.clock()
            )
        except RolloutFinished:  # decided elsewhere since: follow it at the next look
            return
        arms = {"current": counts.get(current, NONE), "candidate": counts.get(candidate, NONE)}
        verdict = judge(arms["current"], arms["candidate"], canary.rollout.guards, found.looks)
        await self.judged(canary, arms, verdict)
