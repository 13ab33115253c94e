"""The tiers an evaluation or a distillation runs: their engines (built as the gateway builds
them) and their identities (tier-cache keys, calibration stamps)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from cascade.build import build_engine, fingerprints
from cascade.engines.base import Engine
from cascade.policy.model import Policy, Tier, UpstreamTier
from cascade.settings import Settings


def identity(name: str, tier: Tier) -> str:
    """What a tier's outputs are cached under: the content hash of its weights (Laya: of the
    checkpoints its ONNX exports are built from and keyed by; Clef: of the release's files),
    recomputed when the files change; ``upstream:MODEL@URLS`` for an upstream, whose weights
    cannot be seen from here."""
    if isinstance(tier, UpstreamTier):
        return f"upstream:{tier.model or ''}@{','.join(tier.urls)}"
    return fingerprints(Policy.single_tier(name, tier))[name]


def identities(policy: Policy) -> dict[str, str]:
    """{tier name: ``identity``} of every tier of the policy."""
    return {name: identity(name, tier) for name, tier in policy.tiers.items()}


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
