"""Where cached values live: ``CacheStore`` and the in-process ``MemoryStore`` (LRU by bytes, TTL).

A store maps keys to bytes. Lookups never raise: a store that cannot answer answers None (a
miss) and a write it cannot make is dropped, so the cache can only ever cost a recomputation.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from cascade import metrics

# What one entry costs beyond its key's and value's objects: the OrderedDict's hash slot and
# linked-list node, the (expiry, value) tuple with its float, and what the allocator and the
# table's growth add (measured: `cascade bench cache-memory`; CPython 3.11, 64-bit).
ENTRY_OVERHEAD = 280


class CacheStore(Protocol):
    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]: ...

    async def put_many(self, items: Mapping[str, bytes]) -> None: ...

    async def aclose(self) -> None: ...


def entry_bytes(key: str, value: bytes) -> int:
    """What ``MemoryStore`` accounts for one entry."""
    return sys.getsizeof(key) + sys.getsizeof(value) + ENTRY_OVERHEAD


class MemoryStore:
    """Least recently used entries go first once ``max_bytes`` would be exceeded; an entry
    older than ``ttl_s`` (on ``clock``) is a miss and is dropped when met. A value larger than
    the whole bound is not stored. ``bytes`` and ``len()`` are what its gateway's registry
    exports (``cascade_cache_bytes``, ``cascade_cache_entries``)."""

    def __init__(
        self, *, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.bytes = 0
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> bytes | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires, value = found
        if self.clock() >= expires:
            self._drop(key, "ttl")
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: str, value: bytes) -> None:
        size = entry_bytes(key, value)
        if key in self._entries:
            self._drop(key, None)
        if size <= self.max_bytes:
            while self.bytes + size > self.max_bytes:
                self._drop(next(iter(self._entries)), "size")
            self._entries[key] = (self.clock() + self.ttl_s, value)
            self.bytes += size

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.get(key) for key in keys]

    async def put_many(self, items: Mapping[str, bytes]) -> None:
        for key, value in items.items():
            self.put(key, value)

    async def aclose(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def _drop(self, key: str, reason: str | None) -> None:
        _, value = self._entries.pop(key)
        self.bytes -= entry_bytes(key, value)
        if reason is not None:
            metrics.CACHE_EVICTIONS.labels(reason=reason).inc()
