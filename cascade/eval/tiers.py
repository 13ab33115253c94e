"""The tiers an evaluation runs: their engines (built as the gateway builds them) and the
identities of their weights (cache keys, calibration stamps)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from cascade.build import build_engine, fingerprints
from cascade.engines.base import Engine
from cascade.policy.model import Policy, UpstreamTier
from cascade.settings import Settings


def identities(policy: Policy) -> dict[str, str]:
    """{tier name: content hash of its weights}, or ``upstream:MODEL@URLS`` for an upstream
    (whose weights cannot be seen from here)."""
    found = fingerprints(policy)
    for name, tier in policy.tiers.items():
        if isinstance(tier, UpstreamTier):
            found[name] = f"upstream:{tier.model or ''}@{','.join(tier.urls)}"
    return found


@asynccontextmanager
async def running(policy: Policy, settings: Settings, slots: Sequence[str]
                  ) -> AsyncIterator[dict[str, Engine]]:
    """The started engines of the policy's ``slots`` (cheap, strong), closed on exit."""
    names = [n for s in slots if (n := getattr(policy.route, s)) is not None]
    engines = {n: build_engine(n, policy.tiers[n], settings) for n in names}
    try:
        await asyncio.gather(*(e.start() for e in engines.values()))
        yield engines
    finally:
        await asyncio.gather(*(e.aclose() for e in engines.values()), return_exceptions=True)
