"""Decisions to record without running a flow (the store's unit tests)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

from cascade.calls import EngineAnswer, EngineUsage
from cascade.policy.flow import Decision
from cascade.policy.routing import PreRoute, QuestionRoute
from cascade.policy.stamp import Stamp

STAMP = Stamp(
    policy_hash="p" * 64,
    calibration_hash="c" * 64,
    weights={"laya": "h1", "clef": "h2"},
    cheap="laya",
    strong="clef",
)


def decided(
    routes: Mapping[str, QuestionRoute],
    answers: Mapping[str, EngineAnswer] | None = None,
    degraded: Mapping[str, str] | None = None,
    checkpoint: str | None = None,
    stamp: Stamp = STAMP,
) -> Decision:
    return Decision(
        pre=PreRoute(mode="cascade", cheap_checkpoint=checkpoint, questions={}),
        escalated={},
        routes=dict(routes),
        degraded=dict(degraded or {}),
        results={},
        answers=dict(answers or {}),
        usage=EngineUsage(input_tokens=0),
        model="m",
        shadow=None,
        stamp=stamp,
    )


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A real file system of ``size`` (``mount``'s units, e.g. ``64k``) mounted at ``path``: a
    tmpfs, so its disk fills for real (ENOSPC). Needs root, as the PostgreSQL tests do; always
    unmounted."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True, timeout=30)


def synthetic_log(path: Path, requests: int, *, shadowed: frozenset[int] = frozenset()) -> None:
    """A SQLite decision log (state text stored) of ``requests`` requests of two questions,
    decided by the real flow on deterministic answers (``cascade bench store``'s), the strong
    tier's shadow answer recorded for the request numbers in ``shadowed``."""
    import asyncio

    from cascade.bench.store import QUESTIONS, _decided
    from cascade.calls import EngineCall
    from cascade.engines.fake import deterministic_answer
    from cascade.store.sqlite import SqliteStore

    store = SqliteStore(path, state_mode="text", queue_size=requests + 1)

    async def main() -> None:
        for n in range(requests):
            call = EngineCall(
                state=f"ticket {n}: charged twice",
                model="jev-latest",
                request_id=f"r{n}",
                questions=dict(QUESTIONS),
            )
            decision = _decided(call)
            await store.record(call, decision, 0.01)
            if n in shadowed:
                store.shadowed(call, deterministic_answer(call), decision.stamp)

    asyncio.run(main())
    store.close()
