"""Each answer's timing and cost headers, on both contracts, whether tracing is on or off.

``Server-Timing`` (W3C; browsers' and proxies' timing panels read it): ``admission`` (auth and
the tenant's limits), ``decode`` (body read and decode), each tier's time (``pre_route``: the
gateway's own routing before the first tier call) and ``gateway`` (the whole request in this
process), in milliseconds. ``x-cascade-cost``: the ``[cost]`` model of ``cascade eval`` (a price
per 1000 input tokens by tier, in its units) applied to what each tier that ran was charged,
and their ``total``, as ``GET /v1/usage`` counts it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

SERVER_TIMING = "server-timing"
COST = "x-cascade-cost"
_TOKEN = re.compile(r"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")  # RFC 9110 token characters only


def timing(entries: Mapping[str, float]) -> str:
    """``name;dur=MS`` entries, comma-separated, from seconds by name."""
    return ", ".join(
        f"{_TOKEN.sub('_', name)};dur={seconds * 1000:.3f}" for name, seconds in entries.items()
    )


def slowest(each: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """A batch's tier times: each tier's longest over its states (they run side by side)."""
    found: dict[str, float] = {}
    for timings in each:
        for name, seconds in timings.items():
            found[name] = max(found.get(name, 0.0), seconds)
    return found


def cost(by_tier: Mapping[str, float]) -> str:
    """``tier=COST,...,total=COST`` (6 significant digits)."""
    total = sum(by_tier.values())
    return ",".join(f"{name}={value:.6g}" for name, value in {**by_tier, "total": total}.items())


def summed(each: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """A batch's cost by tier: the sum over its states."""
    found: dict[str, float] = {}
    for costs in each:
        for name, value in costs.items():
            found[name] = found.get(name, 0.0) + value
    return found
