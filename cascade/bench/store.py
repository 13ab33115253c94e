"""``cascade bench store``: what the decision store costs a response, SQLite against PostgreSQL.

In process, no tiers: CLIENTS concurrent clients each record one answered request after another
(two questions, a decision made by the real flow on deterministic answers) for SECONDS, through
the store's own ``record`` (it returns once the rows are durable: committed in the file, or in
the database or its spool). Per backend and client count: rows written per second and the p50
and p99 of ``record``'s wait. The SQLite file lives in a temporary directory; PostgreSQL is the
URL given (``--postgres``), into which the bench writes rows (under request ids ``bench-...``).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from cascade.calls import EngineCall
from cascade.engines.fake import deterministic_answer
from cascade.policy.flow import Ask, Decision, Reply, TierCall, decide, run
from cascade.policy.model import Checkpoints, ClefTier, LayaTier, Policy, Route
from cascade.policy.stamp import Stamp
from cascade.schema import ChoiceQuestion, NoulQuestion, Question
from cascade.store.base import DecisionStore

POLICY = Policy(
    tiers={"laya": LayaTier(checkpoints=Checkpoints(english="x")), "clef": ClefTier(release="x")},
    route=Route(cheap="laya", strong="clef"),
)
QUESTIONS: dict[str, Question] = {
    "urgent": NoulQuestion(instructions="Is it urgent?"),
    "team": ChoiceQuestion(instructions="Which team?", criteria=["billing", "tech"]),
}


def _decided(call: EngineCall) -> Decision:
    def reply(ask: Ask) -> Reply:
        assert isinstance(ask, TierCall)  # no previews asked
        return deterministic_answer(ask.call)

    return run(decide(POLICY, call, previews=False, stamp=Stamp(policy_hash="bench")), reply)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def _drive(store: DecisionStore, clients: int, seconds: float, tag: str) -> dict[str, Any]:
    waits: list[float] = []
    end = time.perf_counter() + seconds

    async def client(c: int) -> None:
        for n in range(10_000_000):
            if time.perf_counter() >= end:
                return
            call = EngineCall(
                state=f"ticket {tag} {c} {n}",
                model="jev-latest",
                request_id=f"bench-{tag}-{c}-{n}",
                questions=dict(QUESTIONS),
            )
            decision = _decided(call)
            started = time.perf_counter()
            await store.record(call, decision, 0.001)
            waits.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    took = time.perf_counter() - started
    return {
        "clients": clients,
        "requests": len(waits),
        "rows_per_s": round(len(waits) * len(QUESTIONS) / took, 1),
        "p50_ms": round(_p(waits, 0.5) * 1000, 3),
        "p99_ms": round(_p(waits, 0.99) * 1000, 3),
    }


def run_bench(*, postgres: str | None, clients: list[int], seconds: float) -> dict[str, Any]:
    """Every backend at every client count."""
    from cascade.store.sqlite import SqliteStore

    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="cascade-bench-store-") as tmp:
        backends: dict[str, Any] = {"sqlite": lambda: SqliteStore(Path(tmp) / "d.db")}
        if postgres is not None:
            from cascade.store.postgres import PostgresStore

            backends["postgresql"] = lambda: PostgresStore(postgres, spool=Path(tmp) / "spool")
        stamp = f"{int(time.time())}"
        for name, make in backends.items():
            store = make()
            try:
                results[name] = [
                    asyncio.run(_drive(store, n, seconds, f"{stamp}-{name}-{n}")) for n in clients
                ]
            finally:
                store.close()
    return {"seconds": seconds, "backends": results}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'backend':<11} {'clients':>7} {'requests':>9} {'rows/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
    ]
    for name, rows in result["backends"].items():
        lines += [
            f"{name:<11} {r['clients']:>7} {r['requests']:>9} {r['rows_per_s']:>9} "
            f"{r['p50_ms']:>8} {r['p99_ms']:>8}"
            for r in rows
        ]
    return "\n".join(lines)
