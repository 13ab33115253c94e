"""``cascade bench cache-memory``: the decision cache's memory at its bound, accounted vs real.

Fills an in-memory store (``cascade.cache.store.MemoryStore``) past ``max_bytes`` with entries
shaped like Laya's (a 64-hex key, one question's encoded part: three to twelve probabilities,
tokens, truncation) and compares the bytes the store accounts with the growth of this process's
resident memory (``VmRSS``), after a garbage collection on both sides.
"""

from __future__ import annotations

import gc
import hashlib
import random
from pathlib import Path
from typing import Any

from cascade.cache import parts
from cascade.cache.store import MemoryStore
from cascade.calls import QuestionResult


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _part(rng: random.Random) -> bytes:
    n = rng.randint(2, 12)
    weights = [rng.random() for _ in range(n)]
    total = sum(weights)
    result = QuestionResult(
        type="choice", probabilities=[w / total for w in weights], act_probability=rng.random()
    )
    return parts.encode(
        parts.CachedPart(
            model="english",
            result=result,
            row_tokens=rng.randint(40, 512),
            state_tokens=rng.randint(20, 400),
        )
    )


def run(max_bytes: int, *, fill: float = 1.5, seed: int = 0) -> dict[str, Any]:
    """Insert ``fill`` × the entries ``max_bytes`` holds; the store's figures and RSS growth."""
    rng = random.Random(seed)
    store = MemoryStore(max_bytes=max_bytes, ttl_s=3600)
    gc.collect()
    before = _rss_bytes()
    inserted = 0
    while inserted < 8 or store.bytes < max_bytes * 0.95 or inserted < fill * len(store):
        key = hashlib.sha256(inserted.to_bytes(8, "big")).hexdigest()
        store.put(key, _part(rng))
        inserted += 1
    gc.collect()
    grown = _rss_bytes() - before
    return {
        "max_bytes": max_bytes,
        "inserted": inserted,
        "entries": len(store),
        "accounted_bytes": store.bytes,
        "rss_growth_bytes": grown,
        "rss_per_accounted": grown / store.bytes if store.bytes else None,
        "bytes_per_entry": store.bytes / len(store) if len(store) else None,
    }


def table(result: dict[str, Any]) -> str:
    mib = 2**20
    return (
        f"bound {result['max_bytes'] / mib:.0f} MiB: {result['entries']} entries kept of "
        f"{result['inserted']} inserted, {result['bytes_per_entry']:.0f} B each; accounted "
        f"{result['accounted_bytes'] / mib:.1f} MiB, RSS grew "
        f"{result['rss_growth_bytes'] / mib:.1f} MiB "
        f"({result['rss_per_accounted']:.2f}x the accounted bytes)"
    )
