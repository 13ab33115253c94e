"""What a tenant spent on one decided request, into the ``cascade_tenant_*`` counters and the
tenant's ``UsageBook`` (``GET /v1/usage``): per tier that ran, a request, its input tokens and
their cost (``cascade.policy.costs``), tokens answered from the decision cache counted at
``[cache] charge_cached`` of a token, as the tenant's ``input_tokens_per_min`` is charged; per
tier whose answer was returned, its questions."""

from __future__ import annotations

import math
from collections import Counter

from cascade import metrics
from cascade.policy.costs import price
from cascade.policy.flow import Decision
from cascade.policy.model import Policy
from cascade.tenants.usage import Tally, UsageBook


def record(tenant: str, policy: Policy, decision: Decision, book: UsageBook) -> dict[str, Tally]:
    """The request's tallies by tier (also each answer's ``x-cascade-cost``)."""
    tiers: dict[str, Tally] = {}
    for tier, answer in decision.answers.items():
        cached = answer.usage.cached_tokens
        tokens = answer.usage.input_tokens - cached + math.ceil(cached * policy.cache.charge_cached)
        cost = tokens * price(policy, tier) / 1000
        tiers[tier] = Tally(requests=1, input_tokens=tokens, cost=cost)
        metrics.TENANT_REQUESTS.labels(tenant=tenant, tier=tier).inc()
        metrics.TENANT_TOKENS.labels(tenant=tenant, tier=tier).inc(tokens)
        metrics.TENANT_COST.labels(tenant=tenant, tier=tier).inc(cost)
    for tier, count in Counter(decision.tiers.values()).items():
        tiers.setdefault(tier, Tally()).questions += count
        metrics.TENANT_QUESTIONS.labels(tenant=tenant, tier=tier).inc(count)
    book.request(tenant, tiers)
    return tiers
