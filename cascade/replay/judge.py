"""One logged request re-decided by a candidate policy, question by question.

The flow itself decides (``cascade.policy.flow.decide``, no previews, the policy's own
thresholds), its tier calls answered with the answers the log recorded; no tier is called
unless ``call_tier`` is given (then for the answers the log lacks only; a failure of it is the
tier failing, as live). A request it cannot judge is counted by reason, never guessed, every
question of it:

    older_schema      a row from before token shares (schema 3): no cost, no stamp to check
    changed_tier      a row answered by another tier, or other weights, than the candidate's
    tenant_policy     a row decided by a tenant's own policy (an overlay the replay does not
                      apply to the candidate)
    no_cheap_answer   the candidate asks the cheap tier for an answer that was never logged
    no_strong_answer  the candidate escalates a question whose strong answer was never logged
    no_state          with ``--call-tiers``: such an answer, for a request whose state was not
                      stored (``[decision_log] state`` "hash" or "none")

A candidate that refuses the request (a model name it does not know) judges it: ``tier`` None.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.errors import CascadeError, EngineFailed
from cascade.policy.flow import Ask, Failure, Preview, Reply, decide, run, subcall
from cascade.policy.model import Policy
from cascade.questions import answer_label
from cascade.replay.logged import LoggedRequest
from cascade.schema import Question
from cascade.store import LogRow
from cascade.store.rows import CheapEntry, StrongEntry

Which = Literal["cheap", "strong"]
REASONS = (
    "older_schema",
    "changed_tier",
    "tenant_policy",
    "no_cheap_answer",
    "no_strong_answer",
    "no_state",
)
# ``--call-tiers``: a tier's answer to a call, asked live (a ``CascadeError`` when it fails)
CallTier = Callable[[str, EngineCall], EngineAnswer]


class Side(msgspec.Struct, kw_only=True):
    """What one version answered: the slot whose answer was returned (None: it refused the
    request), the answer, and the input tokens its tier calls cost for this question."""

    tier: Which | None
    answer: Any
    tokens: dict[str, float]  # slot -> this question's share of that tier's call
    called: list[Which] = msgspec.field(default_factory=list)  # tiers asked live (--call-tiers)


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


def judge(
    policy: Policy,
    weights: Mapping[str, str],
    request: LoggedRequest,
    call_tier: CallTier | None = None,
) -> list[Judged]:
    """Each question of ``request`` under ``policy`` (whose tiers' weights hash to
    ``weights``, by tier name); raises ``Unjudged``. ``call_tier``: asks a tier for the answers
    the log lacks (``--call-tiers``; else those are ``no_*_answer``)."""
    rows = request.rows
    for row in rows.values():
        _check_row(policy, weights, row)
    call = request.call()
    replies = _Replies(policy, request, call_tier)
    try:
        decision = run(decide(policy, call, previews=False), replies.reply)
    except CascadeError:
        decision = None
    out = []
    for qid, row in rows.items():
        question = call.questions[qid]
        if decision is None or qid not in decision.routes:
            candidate = Side(tier=None, answer=None, tokens={})
        else:
            tier: Which = "cheap" if decision.routes[qid].tier == policy.route.cheap else "strong"
            candidate = Side(
                tier=tier,
                answer=_label(question, decision.results[qid]),
                tokens=replies.tokens(qid),
                called=sorted(s for s, q in replies.called.items() if qid in q),
            )
        out.append(
            Judged(
                request=request.request_id,
                tenant=request.tenant,
                question=qid,
                served=served(question, row),
                candidate=candidate,
                label=_feedback(row),
                teacher=_teacher(question, row),
            )
        )
    return out


class _Replies:
    """The flow's tier calls answered from the logged rows, and what the log lacks from
    ``call_tier`` when given; what each question's calls cost."""

    def __init__(self, policy: Policy, request: LoggedRequest, call_tier: CallTier | None) -> None:
        self.policy, self.request, self.call_tier = policy, request, call_tier
        self.asked: dict[Which, set[str]] = {"cheap": set(), "strong": set()}
        self.called: dict[Which, set[str]] = {"cheap": set(), "strong": set()}
        self.fresh: dict[tuple[Which, str], float] = {}  # a called question's token share

    def reply(self, ask: Ask) -> Reply:
        assert not isinstance(ask, Preview)  # the flow runs without previews
        slot: Which = "cheap" if ask.tier == self.policy.route.cheap else "strong"
        qids = list(ask.call.questions)
        self.asked[slot].update(qids)
        logged = {q: entry for q in qids if (entry := _entry(self.request.rows[q], slot))}
        results = {
            q: QuestionResult(
                type=self.request.rows[q].question["type"], probabilities=e.probabilities
            )
            for q, e in logged.items()
        }
        tokens = sum(self._share(q, slot) for q in logged)
        missing = [q for q in qids if q not in logged]
        if missing:
            if self.call_tier is None:
                raise Unjudged(f"no_{slot}_answer")
            if not self.request.state_stored():
                raise Unjudged("no_state")
            try:
                answer = self.call_tier(ask.tier, subcall(ask.call, missing))
            except CascadeError as exc:
                return Failure(exc)
            if set(answer.results) != set(missing):
                return Failure(EngineFailed(f"`{ask.tier}` answered other questions"))
            self.called[slot].update(missing)
            for q in missing:
                self.fresh[(slot, q)] = answer.usage.input_tokens / len(missing)
            results.update(answer.results)
            tokens += answer.usage.input_tokens
        return EngineAnswer(
            model=ask.tier,
            results={q: results[q] for q in qids},
            usage=EngineUsage(input_tokens=round(tokens)),
        )

    def tokens(self, qid: str) -> dict[str, float]:
        """The question's share of each tier call that asked it."""
        return {
            slot: self.fresh.get((slot, qid), self._share(qid, slot))
            for slot in ("cheap", "strong")
            if qid in self.asked[slot]
        }

    def _share(self, qid: str, slot: Which) -> float:
        row = self.request.rows[qid]
        return (row.cheap_tokens if slot == "cheap" else row.strong_tokens) or 0.0


def _entry(row: LogRow, slot: Which) -> CheapEntry | StrongEntry | None:
    return row.cheap if slot == "cheap" else row.strong


def served(question: Question, row: LogRow) -> Side:
    """What the gateway returned for ``row`` (its raw answer: the log keeps no calibration
    view) and what its tier calls cost, shadow calls left out."""
    cheap = row.cheap is not None and row.final_tier == row.cheap.tier
    entry = row.cheap if cheap else row.strong
    assert entry is not None  # a returned answer is always logged
    called: set[Which] = {"cheap"} if row.cheap is not None else set()
    if row.strong is not None and not row.shadow:
        called.add("strong")
    return Side(
        tier="cheap" if cheap else "strong",
        answer=msgspec.to_builtins(answer_label(question, entry.probabilities)),
        tokens=_tokens(row, called),
    )


def _check_row(policy: Policy, weights: Mapping[str, str], row: LogRow) -> None:
    if (row.cheap is not None and row.cheap_tokens is None) or (
        row.strong is not None and row.strong_tokens is None
    ):
        raise Unjudged("older_schema")
    if row.tenant_policy_hash is not None:
        raise Unjudged("tenant_policy")
    for slot, entry in (("cheap", row.cheap), ("strong", row.strong)):
        name = getattr(policy.route, slot)
        if entry is None:
            continue
        if entry.tier != name or (name in weights and row.checkpoints.get(name) != weights[name]):
            raise Unjudged("changed_tier")


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
