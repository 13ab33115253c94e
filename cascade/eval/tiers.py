"""The tiers an evaluation or a distillation runs: their engines (built as the gateway builds
them) and their identities (tier-cache keys, calibration stamps)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from cascade.build import build_engine, fingerprints
from cascade.engines.base import Engine
from cascade.engines.http import HttpEngine
from cascade.policy.model import Policy, Tier, UpstreamTier
from cascade.settings import Settings


def identity(name: str, tier: Tier, reported: Mapping[str, Any] | None = None) -> str:
    """What a tier's outputs are cached under: the content hash of its weights (Laya: of the
    checkpoints its ONNX exports are built from and keyed by; Clef: of the release's files),
    recomputed when the files change. An upstream's weights cannot be seen from here: its
    URLs and model, and the models and revisions it ``reported`` (``HttpEngine.reported``)."""
    if isinstance(tier, UpstreamTier):
        told = msgspec.json.encode(reported or {}, order="sorted").decode()
        return f"upstream:{tier.model or ''}@{','.join(tier.urls)}:{told}"
    return fingerprints(Policy.single_tier(name, tier))[name]


async def identity_of(name: str, tier: Tier, engine: Engine) -> str:
    """``identity``, asking an upstream's ``engine`` what it serves."""
    told = await engine.reported() if isinstance(engine, HttpEngine) else None
    return identity(name, tier, told)


async def identities(policy: Policy, engines: Mapping[str, Engine]) -> dict[str, str]:
    """{tier name: ``identity_of``} of every tier of the policy with an engine in ``engines``."""
    return {
        name: await identity_of(name, policy.tiers[name], engine)
        for name, engine in engines.items()
    }


@asynccontextmanager
async def running(
    policy: Policy, settings: Settings, slots: Sequence[str]
) -> AsyncIterator[dict[str, Engine]]:
    """The started engines of the policy's ``slots`` (cheap, strong), closed on exit."""
    names = [n for s in slots if (n := getattr(policy.route, s)) is not None]
    engines = {n: build_engine(n, policy.tiers[n], settings) for n in names}
    try:
        await asyncio.gather(*(e.start() for e in engines.values()))
        yield engines
    finally:
        await asyncio.gather(*(e.aclose() for e in engines.values()), return_exceptions=True)
