"""The rows of the decision store, whatever holds them: one per answered question.

``COLUMNS`` are the ``decisions`` columns both backends write, in this order; ``request_rows``
builds a request's rows from its decision (stamped by the version that decided it,
``cascade.policy.stamp``), ``shadow_rows`` a shadow answer's updates, and ``LogRow`` is what
readers get back (JSON columns decoded, with the row's label).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from cascade.questions import n_options, option_band
from cascade.schema import Label

if TYPE_CHECKING:
    from cascade.calls import EngineAnswer, EngineCall
    from cascade.policy.flow import Decision
    from cascade.policy.stamp import Stamp

StateMode = Literal["text", "hash", "none"]

COLUMNS = (
    "request_id",
    "ts",
    "model",
    "policy_hash",
    "checkpoints",
    "question_id",
    "type",
    "band",
    "question",
    "state",
    "state_mode",
    "cheap",
    "strong",
    "final_tier",
    "reason",
    "degraded",
    "shadow",
    "latency_s",
    "tenant",
    "cheap_tokens",
    "strong_tokens",
    "calibration_hash",
    "tenant_policy_hash",
    "replica",
    "trace_id",
)


class CheapEntry(msgspec.Struct, kw_only=True):
    tier: str
    checkpoint: str | None
    probabilities: list[float]


class StrongEntry(msgspec.Struct, kw_only=True):
    tier: str
    probabilities: list[float]


class LabelEntry(msgspec.Struct, kw_only=True):
    """A row's label (``POST /v1/feedback``): the latest given, when, by what, how many times,
    by whom (the tenant; "" without one, and in files before schema 4)."""

    value: Label
    ts: float
    source: str
    count: int = 1
    tenant: str = ""


class LogRow(msgspec.Struct, kw_only=True):
    """One ``decisions`` row with its JSON columns decoded (``degraded``/``shadow`` as bools),
    and its label if it has one. Rows of files before schema 3 have ``tenant`` "" and no token
    shares (None); before schema 5 no calibration hash, tenant policy hash or replica; before 6 no
    trace id."""

    id: int
    request_id: str
    ts: float
    model: str
    policy_hash: str
    checkpoints: dict[str, str]
    question_id: str
    type: str
    band: str
    question: dict[str, Any]  # the wire question (msgspec.convert(..., Question) to type it)
    state: Any  # state_mode text: the state (one object per request); hash: sha256 hex of its
    # canonical JSON; none: None
    state_mode: StateMode
    cheap: CheapEntry | None
    strong: StrongEntry | None
    final_tier: str
    reason: str | None
    degraded: bool
    shadow: bool
    latency_s: float
    tenant: str = ""
    cheap_tokens: float | None = None  # this row's share of the cheap call's input tokens
    strong_tokens: float | None = None  # ... of the strong call's (a shadow call's included)
    calibration_hash: str = ""
    tenant_policy_hash: str | None = None  # the tenant's own policy's, when it has one
    replica: str = ""  # the gateway that wrote it (hostname or CASCADE_REPLICA)
    trace_id: str = ""  # its request's OpenTelemetry trace ("": tracing off, or before schema 6)
    label: LabelEntry | None = None


class NotADecisionLog(ValueError):
    """A file or database that is no decision log this cascade reads (not SQLite, no
    ``decisions`` table, or a newer schema); the message names it."""


def state_hash(state: Any) -> str:
    """sha256 hex of the state's canonical JSON (sorted keys, no whitespace)."""
    return hashlib.sha256(msgspec.json.encode(state, order="sorted")).hexdigest()


def request_rows(
    call: EngineCall,
    decision: Decision,
    latency_s: float,
    ts: float,
    state_mode: StateMode,
    replica: str,
) -> tuple[list[tuple[Any, ...]], tuple[str, str] | None]:
    """The request's rows (``COLUMNS`` order), and in text mode its ``states`` row (key,
    JSON): the state is stored once per request, each row names it by key."""
    stamp = decision.stamp
    stored = state = None
    if state_mode == "text":
        text = to_json(call.state)
        state = hashlib.sha256(text.encode()).hexdigest()
        stored = (state, text)
    elif state_mode == "hash":
        state = state_hash(call.state)
    cheap = decision.answers.get(stamp.cheap or "")
    strong = decision.answers.get(stamp.strong or "")
    checkpoint = decision.pre.cheap_checkpoint
    weights = to_json(stamp.weights)
    rows = []
    for qid, question in call.questions.items():
        route = decision.routes[qid]
        cheap_json = strong_json = None
        if cheap is not None and qid in cheap.results:
            cheap_json = to_json(
                CheapEntry(
                    tier=stamp.cheap or "",
                    probabilities=cheap.results[qid].probabilities,
                    checkpoint=checkpoint or cheap.model,
                )
            )
        if strong is not None and qid in strong.results:
            strong_json = to_json(
                StrongEntry(
                    tier=stamp.strong or "", probabilities=strong.results[qid].probabilities
                )
            )
        rows.append(
            (
                call.request_id,
                ts,
                call.model,
                stamp.policy_hash,
                weights,
                qid,
                question.type,
                option_band(n_options(question)),
                to_json(question),
                state,
                state_mode,
                cheap_json,
                strong_json,
                route.tier,
                route.reason,
                int(qid in decision.degraded),
                0,
                latency_s,
                stamp.tenant,
                share(cheap, qid),
                share(strong, qid),
                stamp.calibration_hash,
                stamp.tenant_policy_hash,
                replica,
                stamp.trace_id or None,
            )
        )
    return rows, stored


def shadow_rows(call: EngineCall, strong: EngineAnswer, stamp: Stamp) -> list[tuple[Any, ...]]:
    """A shadow answer's updates: (strong JSON, token share, request id, tenant, question)."""
    return [
        (
            to_json(StrongEntry(tier=stamp.strong or "", probabilities=result.probabilities)),
            share(strong, qid),
            call.request_id,
            stamp.tenant,
            qid,
        )
        for qid, result in strong.results.items()
    ]


def to_json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def share(answer: EngineAnswer | None, qid: str) -> float | None:
    """A question's share of the input tokens of the call that answered it (None: it did not)."""
    if answer is None or qid not in answer.results:
        return None
    return answer.usage.input_tokens / len(answer.results)


def decode_row(raw: dict[str, Any], label: tuple[Any, ...]) -> LogRow:
    """A ``LogRow`` from its columns by name (JSON still text, ``state`` already resolved) and
    its label's (label JSON, ts, source, count, tenant; all None: no label)."""
    for key in ("checkpoints", "question", "cheap", "strong"):
        if raw[key] is not None:
            raw[key] = msgspec.json.decode(raw[key])
    raw["degraded"], raw["shadow"] = bool(raw["degraded"]), bool(raw["shadow"])
    raw["tenant"] = raw["tenant"] or ""
    raw["calibration_hash"] = raw["calibration_hash"] or ""
    raw["replica"] = raw["replica"] or ""
    raw["trace_id"] = raw["trace_id"] or ""
    value, ts, source, count, labeller = label
    if value is not None:
        raw["label"] = {
            "value": msgspec.json.decode(value),
            "ts": ts,
            "source": source,
            "count": count,
            "tenant": labeller or "",
        }
    return msgspec.convert(raw, LogRow)
