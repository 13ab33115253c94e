"""What a tenant spent on one decided request, into the ``cascade_tenant_*`` counters: per tier
that ran, a request, its input tokens and their cost (``cascade.policy.costs``); per tier whose
answer was returned, its questions."""

from __future__ import annotations

from collections import Counter

from cascade import metrics
from cascade.policy.costs import price
from cascade.policy.flow import Decision
from cascade.policy.model import Policy


def record(tenant: str, policy: Policy, decision: Decision) -> None:
    for tier, answer in decision.answers.items():
        tokens = answer.usage.input_tokens
        metrics.TENANT_REQUESTS.labels(tenant=tenant, tier=tier).inc()
        metrics.TENANT_TOKENS.labels(tenant=tenant, tier=tier).inc(tokens)
        metrics.TENANT_COST.labels(tenant=tenant, tier=tier).inc(
            tokens * price(policy, tier) / 1000)
    for tier, count in Counter(decision.tiers.values()).items():
        metrics.TENANT_QUESTIONS.labels(tenant=tenant, tier=tier).inc(count)
