"""Which arm of a canary decides a request: a pure function of its tenant, its request id and
the candidate's share, so a request id (or, sticky per tenant, a tenant) gets the same arm on
every replica and after every restart."""

from __future__ import annotations

import hashlib
from typing import Literal

Arm = Literal["current", "candidate"]
SCALE = 2**64


def arm_of(tenant: str, request_id: str, *, share: float, sticky: str = "request") -> Arm:
    """``candidate`` for ``share`` of the keys: the key's blake2b hash (tenant and request id;
    ``sticky = "tenant"``: the tenant alone) read as a number in [0, 1). Raising the share
    keeps every key that was on the candidate there."""
    key = tenant if sticky == "tenant" else f"{tenant}\x00{request_id}"
    point = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / SCALE
    return "candidate" if point < share else "current"
