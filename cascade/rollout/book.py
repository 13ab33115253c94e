"""Where a rollout's state is kept: the decision store (``cascade.rollout.state``: it survives a
restart, and a fleet on one PostgreSQL shares it) or, with no decision log, this process's
memory (a restart starts the rollout again). Every method blocks: call it in a thread."""

from __future__ import annotations

import itertools
import threading

import msgspec

from cascade.rollout import state
from cascade.rollout.state import RolloutFinished, RolloutState, RolloutStatus


class Book:
    """The rollouts of ``target`` (a decision log's SQLite path or PostgreSQL URL; None: memory)
    as this ``replica`` opens and decides them."""

    def __init__(self, target: str | None, replica: str) -> None:
        self.target, self.replica = target, replica
        self._rows: dict[int, RolloutState] = {}  # memory only
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def open(
        self, current: str, candidate: str, share: float, *, actor: str, now: float
    ) -> RolloutState:
        """The running rollout of this pair, joined, else a new one started ``now``."""
        if self.target is not None:
            return state.open_rollout(
                self.target, current, candidate, share, actor=actor, replica=self.replica, now=now
            )
        with self._lock:
            found = self._latest(current, candidate)
            if found is not None and found.status == "running":
                return found
            row = RolloutState(
                id=next(self._ids),
                current_hash=current,
                candidate_hash=candidate,
                started=now,
                share=share,
                status="running",
                decided=None,
                reason="",
                actor=actor,
                looks=0,
                replica=self.replica,
            )
            self._rows[row.id] = row
            return row

    def latest(self, current: str, candidate: str) -> RolloutState | None:
        """The newest rollout of this pair (None: never started)."""
        if self.target is not None:
            return state.latest(self.target, current, candidate)
        with self._lock:
            return self._latest(current, candidate)

    def update(
        self,
        rollout_id: int,
        *,
        now: float,
        status: RolloutStatus | None = None,
        share: float | None = None,
        looks: int | None = None,
        reason: str | None = None,
        actor: str | None = None,
    ) -> RolloutState:
        """Change a running rollout; ``RolloutFinished`` when it was decided already (by this
        replica or another), so two never both decide."""
        if self.target is not None:
            return state.update(
                self.target,
                rollout_id,
                now=now,
                status=status,
                share=share,
                looks=looks,
                reason=reason,
                actor=actor,
            )
        with self._lock:
            row = self._rows[rollout_id]
            if row.status != "running":
                raise RolloutFinished(f"rollout {rollout_id} is {row.status}")
            changes = {"status": status, "share": share, "looks": looks, "reason": reason}
            given = {k: v for k, v in {**changes, "actor": actor}.items() if v is not None}
            if status is not None:
                given["decided"] = now
            row = self._rows[rollout_id] = msgspec.structs.replace(row, **given)
            return row

    def _latest(self, current: str, candidate: str) -> RolloutState | None:
        mine = [
            r
            for r in self._rows.values()
            if (r.current_hash, r.candidate_hash) == (current, candidate)
        ]
        return max(mine, key=lambda r: r.id, default=None)
