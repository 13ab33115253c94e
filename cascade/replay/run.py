"""A replay from end to end: read the logged requests, judge each, summarize (blocking: the
gateway's dry run calls it in a worker thread)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cascade.policy.fingerprint import calibration_hash, policy_hash
from cascade.policy.model import Policy
from cascade.replay.judge import CallTier, Judged, Unjudged, judge
from cascade.replay.logged import logged_requests
from cascade.replay.report import summarize
from cascade.store import is_url


def replay(
    policy: Policy,
    sources: Sequence[str | Path],
    *,
    weights: Mapping[str, str],
    prices: Mapping[str, float],
    since: float | None = None,
    tenant: str | None = None,
    limit: int | None = None,
    call_tier: CallTier | None = None,
) -> dict[str, Any]:
    """The report of ``policy`` (its tiers' weights hashing to ``weights``) replayed over the
    logged requests of ``sources`` (``cascade.replay.report.summarize``); ``call_tier``: asks
    a tier for the answers the log lacks (``cascade.replay.judge``)."""
    requests, truncated = logged_requests(sources, since=since, tenant=tenant, limit=limit)
    judged: list[Judged] = []
    unjudged: Counter[str] = Counter()
    for request in requests:
        try:
            judged += judge(policy, weights, request, call_tier)
        except Unjudged as why:
            unjudged[why.reason] += len(request.rows)
    served = Counter(row.policy_hash for r in requests for row in r.rows.values())
    meta = {
        "candidate": {
            "policy_hash": policy_hash(policy),
            "calibration_hash": calibration_hash(policy),
        },
        "log": [_named(s) for s in sources],
        "truncated": truncated,
        "served_policies": dict(served.most_common()),
    }
    return summarize(judged, unjudged, requests=len(requests), prices=prices, meta=meta)


def _named(source: str | Path) -> str:
    """A source as the report names it: a URL without its password."""
    if not is_url(source):
        return str(source)
    from cascade.store.postgres import safe_url

    return safe_url(str(source))
