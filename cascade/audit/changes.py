"""What an admin action changed, small and bounded: the policy's changed tables and keys, and
the tenants whose key count a reload changed (names and counts, never a key)."""

from __future__ import annotations

from typing import Any

import msgspec

from cascade.policy.model import Policy
from cascade.tenants.keys import Tenants

MAX_CHANGED = 32  # changed policy paths kept in one record


def _plain(policy: Policy) -> dict[str, Any]:
    return msgspec.to_builtins(policy, enc_hook=str)


def policy_changes(old: Policy, new: Policy) -> list[str]:
    """The top-level tables of ``new`` that differ from ``old``, each as ``table`` or, for a
    table, ``table.key`` per changed key; at most ``MAX_CHANGED`` (then ``... N more``)."""
    before, after = _plain(old), _plain(new)
    found: list[str] = []
    for table in sorted(set(before) | set(after)):
        a, b = before.get(table), after.get(table)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            found += [
                f"{table}.{key}" for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)
            ]
        else:
            found.append(table)
    if len(found) > MAX_CHANGED:
        found = [*found[:MAX_CHANGED], f"... {len(found) - MAX_CHANGED} more"]
    return found


def key_changes(old: Tenants, new: Tenants) -> list[tuple[str, int, int]]:
    """(tenant name, keys before, keys after) for each tenant whose count of key hashes
    changed, by name ("" : the unnamed keys)."""
    before, after = old.key_counts(), new.key_counts()
    return [
        (name, before.get(name, 0), after.get(name, 0))
        for name in sorted(set(before) | set(after))
        if before.get(name, 0) != after.get(name, 0)
    ]
