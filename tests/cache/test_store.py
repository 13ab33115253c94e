"""The in-memory store: least recently used out first by bytes, entries expire (fake clock)."""

from __future__ import annotations

from cascade import metrics
from cascade.cache.store import MemoryStore, entry_bytes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def evictions(reason: str) -> float:
    return metrics.CACHE_EVICTIONS.labels(reason=reason)._value.get()


def test_least_recently_used_entries_go_first_when_bytes_run_out() -> None:
    one = entry_bytes("a", b"x" * 100)
    store = MemoryStore(max_bytes=3 * one, ttl_s=60)
    before = evictions("size")
    for key in "abc":
        store.put(key, b"x" * 100)
    assert store.bytes == 3 * one and len(store) == 3
    assert store.get("a") is not None  # a is now the most recently used
    store.put("d", b"x" * 100)
    assert store.get("b") is None and all(store.get(k) for k in "acd")
    assert store.bytes == 3 * one <= store.max_bytes
    assert evictions("size") == before + 1


def test_a_bigger_value_evicts_as_many_entries_as_it_needs() -> None:
    small = entry_bytes("a", b"x" * 10)
    store = MemoryStore(max_bytes=4 * small, ttl_s=60)
    for key in "abcd":
        store.put(key, b"x" * 10)
    store.put("big", b"x" * (2 * small))
    assert store.bytes <= store.max_bytes
    assert store.get("a") is None and store.get("b") is None and store.get("big") is not None


def test_a_value_larger_than_the_bound_is_not_stored_and_overwrites_account_once() -> None:
    store = MemoryStore(max_bytes=1000, ttl_s=60)
    store.put("huge", b"x" * 2000)
    assert store.get("huge") is None and store.bytes == 0
    store.put("k", b"1" * 10)
    store.put("k", b"2" * 20)
    assert store.get("k") == b"2" * 20 and store.bytes == entry_bytes("k", b"2" * 20)


def test_entries_expire_after_ttl_on_the_clock() -> None:
    clock = Clock()
    store = MemoryStore(max_bytes=10_000, ttl_s=30, clock=clock)
    before = evictions("ttl")
    store.put("k", b"v")
    clock.now += 29.9
    assert store.get("k") == b"v"
    clock.now += 0.1
    assert store.get("k") is None and store.bytes == 0 and len(store) == 0
    assert evictions("ttl") == before + 1
