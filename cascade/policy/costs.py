"""The cost model of ``cascade eval`` and the spend counters: each tier costs a price per 1000
input tokens (``[cost]`` in the policy, by tier name), defaulting by kind to ``DEFAULT_COST``
(relative units: Laya 1, Clef or an upstream 20, about the ratio of their parameter counts,
0.42B and 9B)."""

from __future__ import annotations

from collections.abc import Mapping

from cascade.policy.model import ClefTier, LayaTier, Policy, Tier

DEFAULT_COST = {"laya": 1.0, "clef": 20.0, "upstream": 20.0}


def kind_of(tier: Tier) -> str:
    return (
        "laya"
        if isinstance(tier, LayaTier)
        else "clef"
        if isinstance(tier, ClefTier)
        else ("upstream")
    )


def price(policy: Policy, tier: str) -> float:
    """Price per 1000 input tokens of the tier named ``tier``."""
    return policy.cost.get(tier, DEFAULT_COST[kind_of(policy.tiers[tier])])


def costs(policy: Policy, overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """Price per 1000 input tokens of the cheap and strong slots: ``overrides`` (by tier name
    or slot, ``cheap``/``strong``), then the policy's ``[cost]``, then ``DEFAULT_COST`` by the
    tier's kind."""
    overrides = overrides or {}
    out = {}
    for slot in ("cheap", "strong"):
        name = getattr(policy.route, slot)
        if name is None:
            continue
        out[slot] = overrides.get(name, overrides.get(slot, price(policy, name)))
    return out
