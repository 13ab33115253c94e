"""The option-order check: a cheap answer the gate keeps narrowly is asked again under other
option orders, and escalates (``order_unstable``) when its winner moves.

Pure functions; ``cascade.policy.flow`` asks the cheap tier for the rows ``plan`` builds and
hands its answer to ``judge``. A candidate is a choice or score question the cheap tier answered
and the post-rules kept, whose tempered confidence is above its cell's confidence threshold (the
least possible max p, ``1/n``, where the cell has none) by less than ``[consistency] margin``.
Each is asked ``orders`` more times: reversed, then shuffles seeded by ``seed`` and its option
count. What moves is where each option is shown (Laya's ``option_order``, composed with the
client's own); the answer comes back in the caller's order, so a score keeps its levels' scale
and only their slots move. Rows: at most ``max_extra_rows`` per request and never more than the
cheap tier's ``max_batch_size``, candidates in question order, the last one given fewer orders
when it does not fit. A failed extra call checks nothing: the answers stand.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import msgspec

from cascade.calls import EngineAnswer, EngineCall, QuestionResult
from cascade.policy.calibration import gate_view
from cascade.policy.model import LayaTier, Policy
from cascade.policy.routing import Gate, PreRoute, Reason, answer_confidence
from cascade.questions import n_options, option_band

CHECKED_TYPES = frozenset({"choice", "score"})
MARK = "#order"  # an extra row's id: the question's id, MARK, the order's number


class OrderCheck(msgspec.Struct, frozen=True):
    """One question's check: its extra rows, and whether every order kept its winner."""

    rows: int
    stable: bool


def order_id(qid: str, j: int) -> str:
    """The id of ``qid``'s ``j``-th reordered row."""
    return f"{qid}{MARK}{j}"


def orders(n: int, k: int, seed: int) -> list[list[int]]:
    """Up to ``k`` distinct orders of ``n`` options other than the identity: reversed first,
    then seeded shuffles (fewer when ``n!`` has too few)."""
    k = min(k, math.factorial(min(n, 10)) - 1)
    seen = {tuple(range(n))}
    out: list[list[int]] = []
    rng = random.Random(f"{seed}:{n}")
    candidate = list(range(n))[::-1]
    for _ in range(8 * k + 1):
        if len(out) >= k:
            break
        if tuple(candidate) not in seen:
            seen.add(tuple(candidate))
            out.append(candidate)
        candidate = rng.sample(range(n), n)
    return out


def row_limit(policy: Policy) -> int:
    """The most extra rows one request may add."""
    tier = policy.cheap_tier()
    cap = tier.max_batch_size if isinstance(tier, LayaTier) else policy.consistency.max_extra_rows
    return min(policy.consistency.max_extra_rows, cap)


def plan(
    policy: Policy,
    gate: Gate,
    call: EngineCall,
    pre: PreRoute,
    cheap: EngineAnswer,
    gated: Mapping[str, Reason],
) -> dict[str, list[list[int]]]:
    """The candidates of a request and the orders each is asked in (empty: nothing to check)."""
    check, route = policy.consistency, policy.route
    if not check.enabled or pre.mode != "cascade" or route.strong is None:
        return {}
    left = row_limit(policy)
    out: dict[str, list[list[int]]] = {}
    for qid, r in pre.questions.items():
        question, result = call.questions[qid], cheap.results.get(qid)
        if r.tier != route.cheap or qid in gated or result is None or left <= 0:
            continue
        n = len(result.probabilities)
        if question.type not in CHECKED_TYPES or n < 2:
            continue
        floor = gate.confidence.of(result.type).get(option_band(n))
        clearance = answer_confidence(gate_view(policy, result)) - (
            1 / n if floor is None else floor
        )
        if clearance < check.margin:
            out[qid] = orders(n, check.orders, check.seed)[:left]
            left -= len(out[qid])
    return out


def every_order(policy: Policy, call: EngineCall) -> dict[str, list[list[int]]]:
    """Every choice and score question of ``call`` with the orders the check would ask (no
    gate, no row bound): what ``cascade eval`` runs once, so any threshold replays offline."""
    check = policy.consistency
    return {
        q: orders(n, check.orders, check.seed)
        for q, v in call.questions.items()
        if v.type in CHECKED_TYPES and (n := n_options(v)) >= 2
    }


def reordered_call(call: EngineCall, planned: Mapping[str, list[list[int]]]) -> EngineCall:
    """The extra rows: each candidate once per order, under ``order_id`` ids."""
    questions = {}
    for qid, perms in planned.items():
        question = call.questions[qid]
        shown = question.option_order or list(range(len(perms[0])))
        for j, perm in enumerate(perms, 1):
            questions[order_id(qid, j)] = msgspec.structs.replace(
                question, option_order=[shown[i] for i in perm]
            )
    return msgspec.structs.replace(call, questions=questions)


def judge(
    policy: Policy,
    gate: Gate,
    cheap: EngineAnswer,
    planned: Mapping[str, list[list[int]]],
    again: EngineAnswer,
) -> tuple[dict[str, Reason], dict[str, OrderCheck]]:
    """The escalations of the checked questions whose winner moved (``order_unstable``, or
    ``budget`` where the gate's budget keeps them as it would a low confidence), and each
    checked question's record. Rows missing from ``again`` check nothing."""
    escalated: dict[str, Reason] = {}
    checks: dict[str, OrderCheck] = {}
    for qid, perms in planned.items():
        first = cheap.results[qid]
        rows = [again.results.get(order_id(qid, j)) for j in range(1, len(perms) + 1)]
        answered = [r.probabilities for r in rows if r is not None]
        if not answered:
            continue
        winner = _winner(first.probabilities)
        stable = all(_winner(p) == winner for p in answered)
        checks[qid] = OrderCheck(rows=len(perms), stable=stable)
        if not stable:
            escalated[qid] = _cut(policy, gate, first)
    return escalated, checks


def whole_request(policy: Policy, pre: PreRoute, escalated: dict[str, Reason]) -> dict[str, Reason]:
    """With ``escalate = "request"``, one escalation takes every cheap question along."""
    if policy.route.escalate != "request" or all(r == "budget" for r in escalated.values()):
        return escalated
    return {
        q: escalated[q] if escalated.get(q, "budget") != "budget" else "whole_request"
        for q, r in pre.questions.items()
        if r.tier == policy.route.cheap
    }


def _cut(policy: Policy, gate: Gate, result: QuestionResult) -> Reason:
    """``order_unstable``, or ``budget`` where the gate's budget cut keeps the answer."""
    confidence = answer_confidence(gate_view(policy, result))
    cut = gate.budget.of(result.type).get(option_band(len(result.probabilities)))
    if not gate.escalate or (cut is not None and confidence >= cut):
        return "budget"
    return "order_unstable"


def _winner(probabilities: list[float]) -> int:
    """The first maximum, as ``cascade.answers`` picks it."""
    return max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))
