"""One logged request re-decided by a candidate policy, question by question.

The flow itself decides (``cascade.policy.flow.decide``, no previews, the policy's own
thresholds), its tier calls answered with the answers the log recorded; no tier is called. A
request it cannot judge is counted by reason, never guessed, every question of it:

    older_schema      a row from before token shares (schema 3): no cost, no stamp to check
    changed_tier      a row answered by another tier, or other weights, than the candidate's
    tenant_policy     a row decided by a tenant's own policy (an overlay the replay does not
                      apply to the candidate)
    no_cheap_answer   the candidate asks the cheap tier for an answer that was never logged
    no_strong_answer  the candidate escalates a question whose strong answer was never logged

A candidate that refuses the request (a model name it does not know) judges it: ``tier`` None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from cascade.calls import EngineAnswer, EngineUsage, QuestionResult
from cascade.errors import CascadeError
from cascade.policy.flow import Ask, Preview, Reply, decide, run
from cascade.policy.model import Policy
from cascade.questions import answer_label
from cascade.replay.logged import LoggedRequest
from cascade.schema import Question
from cascade.store import LogRow

Which = Literal["cheap", "strong"]
REASONS = ("older_schema", "changed_tier", "tenant_policy", "no_cheap_answer",
           "no_strong_answer")


class Side(msgspec.Struct, kw_only=True):
    """What one version answered: the slot whose answer was returned (None: it refused the
    request), the answer, and the input tokens its tier calls cost for this question."""

    tier: Which | None
    answer: Any
    tokens: dict[str, float]  # slot -> this question's share of that tier's call


class Judged(msgspec.Struct, kw_only=True):
    """One question: what was served, what the candidate answers, and its judges (``label``:
    a feedback label; ``teacher``: the strong tier's shadow answer)."""

    request: str  # its id
    tenant: str
    question: str
    served: Side
    candidate: Side
    label: Any = None
    teacher: Any = None


class Unjudged(Exception):
    """Why a request cannot be judged (one of ``REASONS``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def judge(policy: Policy, weights: Mapping[str, str], request: LoggedRequest) -> list[Judged]:
    """Each question of ``request`` under ``policy`` (whose tiers' weights hash to
    ``weights``, by tier name); raises ``Unjudged``."""
    rows = request.rows
    for row in rows.values():
        _check_row(policy, weights, row)
    call = request.call()
    asked: dict[Which, set[str]] = {"cheap": set(), "strong": set()}

    def reply(ask: Ask) -> Reply:
        assert not isinstance(ask, Preview)  # the flow runs without previews
        slot: Which = "cheap" if ask.tier == policy.route.cheap else "strong"
        asked[slot].update(ask.call.questions)
        return _logged_answer(ask.tier, slot, rows, list(ask.call.questions))

    try:
        decision = run(decide(policy, call, previews=False), reply)
    except CascadeError:
        decision = None
    out = []
    for qid, row in rows.items():
        question = call.questions[qid]
        if decision is None or qid not in decision.routes:
            candidate = Side(tier=None, answer=None, tokens={})
        else:
            tier: Which = "cheap" if decision.routes[qid].tier == policy.route.cheap else "strong"
            candidate = Side(tier=tier, answer=_label(question, decision.results[qid]),
                             tokens=_tokens(row, {s for s, q in asked.items() if qid in q}))
        out.append(Judged(request=request.request_id, tenant=request.tenant, question=qid,
                          served=served(question, row),
                          candidate=candidate, label=_feedback(row),
                          teacher=_teacher(question, row)))
    return out


def served(question: Question, row: LogRow) -> Side:
    """What the gateway returned for ``row`` (its raw answer: the log keeps no calibration
    view) and what its tier calls cost, shadow calls left out."""
    cheap = row.cheap is not None and row.final_tier == row.cheap.tier
    entry = row.cheap if cheap else row.strong
    assert entry is not None  # a returned answer is always logged
    called: set[Which] = {"cheap"} if row.cheap is not None else set()
    if row.strong is not None and not row.shadow:
        called.add("strong")
    return Side(tier="cheap" if cheap else "strong",
                answer=msgspec.to_builtins(answer_label(question, entry.probabilities)),
                tokens=_tokens(row, called))


def _check_row(policy: Policy, weights: Mapping[str, str], row: LogRow) -> None:
    if ((row.cheap is not None and row.cheap_tokens is None)
            or (row.strong is not None and row.strong_tokens is None)):
        raise Unjudged("older_schema")
    if row.tenant_policy_hash is not None:
        raise Unjudged("tenant_policy")
    for slot, entry in (("cheap", row.cheap), ("strong", row.strong)):
        name = getattr(policy.route, slot)
        if entry is None:
            continue
        if entry.tier != name or (name in weights and row.checkpoints.get(name) != weights[name]):
            raise Unjudged("changed_tier")


def _logged_answer(tier: str, slot: Which, rows: Mapping[str, LogRow],
                   qids: list[str]) -> EngineAnswer:
    results = {}
    tokens = 0.0
    for qid in qids:
        row = rows.get(qid)
        entry = None if row is None else row.cheap if slot == "cheap" else row.strong
        if row is None or entry is None:
            raise Unjudged(f"no_{slot}_answer")
        results[qid] = QuestionResult(type=row.question["type"],
                                      probabilities=entry.probabilities)
        tokens += (row.cheap_tokens if slot == "cheap" else row.strong_tokens) or 0.0
    return EngineAnswer(model=tier, results=results,
                        usage=EngineUsage(input_tokens=round(tokens)))


def _tokens(row: LogRow, called: set[Which]) -> dict[str, float]:
    shares = {"cheap": row.cheap_tokens, "strong": row.strong_tokens}
    return {slot: shares[slot] or 0.0 for slot in sorted(called)}


def _label(question: Question, result: QuestionResult) -> Any:
    return msgspec.to_builtins(answer_label(question, result.probabilities))


def _feedback(row: LogRow) -> Any:
    return None if row.label is None else msgspec.to_builtins(row.label.value)


def _teacher(question: Question, row: LogRow) -> Any:
    if not row.shadow or row.strong is None:
        return None
    return msgspec.to_builtins(answer_label(question, row.strong.probabilities))
