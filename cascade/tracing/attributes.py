"""Span attributes of a decided request and of a tier call: the GenAI semantic conventions that
fit, and ``cascade.*``. Sizes, ids, tier names and numbers only: no state, option or question
text, and no question ids (client text, as ``x-cascade-tiers`` keeps them out of headers);
per-question lists are in the request's question order and capped at ``MAX_LIST``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cascade.calls import EngineAnswer, EngineCall, EngineUsage


# What is read of the flow's ``Stamp`` and ``Decision`` (``cascade.policy``, a layer above):
class StampView(Protocol):
    @property
    def tenant(self) -> str: ...
    @property
    def policy_hash(self) -> str: ...
    @property
    def tenant_policy_hash(self) -> str | None: ...


class RouteView(Protocol):
    @property
    def tier(self) -> str: ...
    @property
    def reason(self) -> str | None: ...


class DecisionView(Protocol):
    @property
    def routes(self) -> Mapping[str, RouteView]: ...
    @property
    def escalated(self) -> Mapping[str, Any]: ...
    @property
    def degraded(self) -> Mapping[str, str]: ...
    @property
    def refused(self) -> Mapping[str, Any]: ...
    @property
    def model(self) -> str: ...
    @property
    def usage(self) -> EngineUsage: ...


MAX_LIST = 64  # values per list attribute (a request has at most a few dozen questions)
OPERATION = "decide"  # gen_ai.operation.name of a tier call (typed decisions, not chat)


def counts(values: Counter[str]) -> str:
    """``a=2,b=1``: the shape of ``x-cascade-tiers``."""
    return ",".join(f"{key}={n}" for key, n in sorted(values.items()))


def tier_call(tier: str, slot: str, call: EngineCall, provider: str) -> dict[str, Any]:
    """A tier call's attributes before it runs; ``slot``: cheap, strong or shadow."""
    return {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": call.model,
        "cascade.tier": tier,
        "cascade.slot": slot,
        "cascade.questions": len(call.questions),
        "cascade.images": len(call.images),
    }


def tier_answer(answer: EngineAnswer) -> dict[str, Any]:
    """What a tier answered: its model, tokens, cache share and each question's confidence."""
    usage = answer.usage
    cached = getattr(usage, "cached_tokens", 0)
    return {
        "gen_ai.response.model": answer.model,
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "cascade.cached_tokens": cached,
        "cascade.cache": "hit"
        if cached and cached >= usage.input_tokens
        else "partial"
        if cached
        else "miss",
        "cascade.confidence": [
            max(r.probabilities, default=0.0) for r in list(answer.results.values())[:MAX_LIST]
        ],
    }


def started(call: EngineCall, stamp: StampView) -> dict[str, Any]:
    """A request's attributes as it starts: whose, under which policy version."""
    found: dict[str, Any] = {
        "cascade.tenant": stamp.tenant,
        "cascade.policy_hash": stamp.policy_hash,
    }
    if call.request_id:
        found["cascade.request_id"] = call.request_id[:128]
    if stamp.tenant_policy_hash:
        found["cascade.tenant_policy_hash"] = stamp.tenant_policy_hash
    return found


def decided(call: EngineCall, decision: DecisionView, outcome: str) -> dict[str, Any]:
    """A decided request's attributes (its tenant and policy hash are set when it starts)."""
    reasons = Counter[str](r.reason for r in decision.routes.values() if r.reason is not None)
    found: dict[str, Any] = {
        "cascade.outcome": outcome,
        "cascade.questions": len(call.questions),
        "cascade.route": counts(Counter(r.tier for r in decision.routes.values())),
        "gen_ai.response.model": decision.model,
        "gen_ai.usage.input_tokens": decision.usage.input_tokens,
        "cascade.escalated": len(decision.escalated),
        "cascade.degraded": len(decision.degraded),
        "cascade.refused": len(decision.refused),
    }
    if reasons:
        found["cascade.reasons"] = counts(reasons)
    return found
