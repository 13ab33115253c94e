"""What crosses the engine interface: the validated call in, raw probabilities out, and the
cheap tier's tokenizer-only preview of a call that pre-routing reads.

An engine receives an already validated request (``EngineCall``) and returns raw, unrounded
probabilities per question (``EngineAnswer``). Answer shapes, confidences and rounding are the
gateway's job (``cascade.answers``), so every tier is reported the same way to clients.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from cascade.errors import Overloaded
from cascade.schema import Controls, OptionSpans, Question, QuestionType


class Image(msgspec.Struct, frozen=True):
    """An image the gateway checked without decoding it (format, bytes, pixels, JPEG scans).

    The tier that reads its pixels decodes it, once; a remote tier gets ``data`` as received.
    """

    data: bytes
    mime: str  # image/png, image/jpeg or image/webp
    width: int
    height: int


class Budget(msgspec.Struct, frozen=True):
    """How long a call may wait for a tier, and whose work it is.

    ``deadline``: a ``time.monotonic()`` instant. An engine with a queue refuses the call at once
    (``Overloaded``) when its measured cost of the work ahead says the call would still be waiting
    then; work it accepts runs to the end. ``flow``: a server-side id that every call of one
    client request shares (a batch's states): engines share their capacity fairly between flows,
    and a flow's own rows never count as the wait it imposes on itself.
    """

    deadline: float
    flow: int


def capped(call: EngineCall, timeout_s: float, tier: str, remote: bool) -> EngineCall:
    """``call`` with its budget capped for ``tier``: an in-process tier's ``timeout_s`` bounds
    the wait it accepts (a remote tier's is its whole-call limit instead). Raises ``Overloaded``
    when the request's budget is already spent: nothing is sent to any tier then."""
    budget, now = call.budget, time.monotonic()
    if budget is not None and now >= budget.deadline:
        raise Overloaded(f"{tier}: the request's wait budget is spent", retry_after=1.0)
    if budget is None or remote:
        return call
    bounded = Budget(deadline=min(budget.deadline, now + timeout_s), flow=budget.flow)
    return msgspec.structs.replace(call, budget=bounded)


class EngineCall(msgspec.Struct, kw_only=True):
    state: str | dict[str, Any] | list[Any]
    questions: dict[str, Question]
    model: str  # the name the client asked for; upstream engines may forward it
    images: list[Image] = msgspec.field(default_factory=list)
    controls: Controls = msgspec.field(default_factory=Controls)
    request_id: str = ""  # the client's id (x-request-id): forwarded, never trusted for decisions
    budget: Budget | None = None  # None: no deadline, a flow of its own


class QuestionResult(msgspec.Struct, kw_only=True):
    """Unrounded probabilities for one question, in the caller's order.

    choice: the caller's criteria order; score: levels 0..n-1; noul: ``[P(false), P(true)]``.
    """

    type: QuestionType
    probabilities: list[float]
    act_probability: float | None = None  # Laya's act head, when the tier has one
    # Laya's ``pooled`` vector of the row it read, float16 little-endian (the novelty gate's
    # input, ``cascade.policy.novelty``); None from tiers and exports without one
    vector: bytes | None = None


class EngineUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    state_tokens: int | None = None
    state_tokens_dropped: int = 0
    truncated_questions: list[str] = msgspec.field(default_factory=list)
    options: dict[str, OptionSpans] = msgspec.field(default_factory=dict)
    # State tokens each truncated question's row dropped, when the tier reports it per question
    # (Laya); a truncated question missing here dropped ``state_tokens_dropped``.
    dropped: dict[str, int] = msgspec.field(default_factory=dict)
    # Input tokens of each question's row, from tiers that answer questions independently
    # (``Engine.independent_questions``): what the decision cache splits a call's usage by.
    row_tokens: dict[str, int] = msgspec.field(default_factory=dict)
    # Of ``input_tokens``, those answered from the decision cache instead of by the tier.
    cached_tokens: int = 0


class EngineAnswer(msgspec.Struct, kw_only=True):
    model: str  # what actually answered, e.g. "laya-english" or the upstream's model name
    results: dict[str, QuestionResult]
    usage: EngineUsage


def merge(answers: Sequence[EngineAnswer]) -> EngineAnswer:
    """Answers of one tier to parts of a call (or calls one after another) as one: results and
    per-question figures joined (a later answer wins a question), tokens added up, the longest
    truncation kept, and the model of the last answer (what answered last)."""
    usages = [a.usage for a in answers]
    return EngineAnswer(
        model=answers[-1].model,
        results={q: r for a in answers for q, r in a.results.items()},
        usage=EngineUsage(
            input_tokens=sum(u.input_tokens for u in usages),
            state_tokens=next((u.state_tokens for u in usages if u.state_tokens is not None), None),
            state_tokens_dropped=max(u.state_tokens_dropped for u in usages),
            truncated_questions=list(
                dict.fromkeys(q for u in usages for q in u.truncated_questions)
            ),
            options={q: o for u in usages for q, o in u.options.items()},
            dropped={q: d for u in usages for q, d in u.dropped.items()},
            row_tokens={q: t for u in usages for q, t in u.row_tokens.items()},
            cached_tokens=sum(u.cached_tokens for u in usages),
        ),
    )


class RowPreview(msgspec.Struct, frozen=True):
    n_options: int
    row_tokens: int  # tokens of this question's row after capping/truncation
    state_tokens: int  # tokens of the full serialized state
    state_tokens_dropped: int  # state tokens this row cannot fit (0 = the whole state fits)
    collapsed: bool  # some option spans collapsed to identical token spans


class CallPreview(msgspec.Struct, frozen=True):
    checkpoint: str  # the cheap tier's checkpoint chosen for the call
    script: str  # dominant script of the state text ("latin", "cyrillic", "han", ..., "unknown")
    readable: bool  # the chosen checkpoint reads this script (english: latin/unknown only)
    rows: dict[str, RowPreview]
