"""Spend from decision logs: per tenant and tier, requests, questions, input tokens and cost.

A tier counts a question when it answered it (a row with its entry: the cheap tier's for every
question it ran, escalated ones too; the strong tier's for those it answered, shadow answers
included: they cost it too), and a request when it answered any of its questions. ``final``:
the questions whose returned answer was that tier's. Tokens are the rows' shares of each call's
input tokens (``cheap_tokens``/``strong_tokens``, from schema 3 on; older rows count none and
are counted in ``rows_without_tokens``). Cost is ``cascade eval``'s model: a price per 1000 input
tokens by slot (``cascade.eval.sweep.costs``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from cascade.store import LogRow

ALL = "(all)"  # the tenant of the totals


class Spend(msgspec.Struct, kw_only=True):
    requests: int = 0
    questions: int = 0
    final: int = 0
    input_tokens: float = 0.0
    cost: float = 0.0


class SpendUsage(msgspec.Struct, kw_only=True):
    """``by``: (tenant, tier) -> spend, totals under tenant ``ALL``; ``prices``: per 1000
    input tokens by tier name."""

    by: dict[tuple[str, str], Spend]
    prices: dict[str, float]
    rows: int = 0
    rows_without_tokens: int = 0


def usage(
    rows: Iterable[tuple[str, LogRow]],
    price: Mapping[str, float],
    overrides: Mapping[str, float] | None = None,
) -> SpendUsage:
    """Spend of ``rows`` (each with the name of its file, so request ids of different files
    stay apart). ``price``: by slot (``cheap``, ``strong``); ``overrides``: by tier name."""
    overrides = overrides or {}
    out = SpendUsage(by={}, prices={})
    seen: set[tuple[str, str, str, str, float]] = set()
    for source, row in rows:
        out.rows += 1
        if row.cheap_tokens is None and row.strong_tokens is None:
            out.rows_without_tokens += 1
        for slot, entry, tokens in (
            ("cheap", row.cheap, row.cheap_tokens),
            ("strong", row.strong, row.strong_tokens),
        ):
            if entry is None:
                continue
            tier = entry.tier
            each = out.prices.setdefault(tier, overrides.get(tier, price.get(slot, 0.0)))
            first = (source, tier, row.tenant, row.request_id, row.ts) not in seen
            seen.add((source, tier, row.tenant, row.request_id, row.ts))
            for tenant in (row.tenant, ALL):
                spend = out.by.setdefault((tenant, tier), Spend())
                spend.requests += first
                spend.questions += 1
                spend.final += row.final_tier == tier
                spend.input_tokens += tokens or 0.0
                spend.cost += (tokens or 0.0) * each / 1000
    return out


def as_json(found: SpendUsage) -> dict[str, Any]:
    """``{"rows": [...per tenant and tier], "total": [...per tier], "prices", ...}``."""

    def line(tenant: str, tier: str, spend: Spend) -> dict[str, Any]:
        return {"tenant": tenant, "tier": tier, **msgspec.to_builtins(spend)}

    tiers = list(found.prices)  # in the order met: the cheap tier first, as a rule
    ordered = sorted(
        found.by.items(), key=lambda kv: (kv[0][0] == ALL, kv[0][0], tiers.index(kv[0][1]))
    )
    return {
        "rows": [line(t, tier, s) for (t, tier), s in ordered if t != ALL],
        "total": [line(t, tier, s) for (t, tier), s in ordered if t == ALL],
        "prices_per_1k_tokens": found.prices,
        "log_rows": found.rows,
        "rows_without_tokens": found.rows_without_tokens,
    }
