"""Wire answers from raw probabilities, the same way whichever tier answered.

Two confidence profiles (``Settings.profile``):

- ``laya`` (default): choice/score ``confidence = 1 - H(p)/ln k`` (1.0 when k < 2); noul
  ``confidence = max(p, 1 - p)``; every answer also carries ``answer_confidence = max p`` (what
  ``min_confidence`` gates on) and ``action`` when the tier has an act head; choice/score carry
  ``x_jev_confidence``. Usage carries Laya's extra counts.
- ``jev``: the exact Jev shape: choice ``confidence = (n p_max - 1)/(n - 1)``, score
  ``max(0, 1 - sum p_i |i - mode| / D)``, noul without confidence, no extras.

Numbers are rounded to 4 decimals as both references do; the argmax is taken on unrounded
probabilities, first maximum in the caller's order winning.

``response`` and ``headers`` shape a whole decided request (``cascade.policy.flow``'s
``Decision``): the answers, the merged usage, the ``x_cascade`` extras and the ``x-cascade-*``
headers. They shape only what the flow decided.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from cascade.calls import EngineCall, EngineUsage, QuestionResult
from cascade.errors import CascadeError, ValidationFailed
from cascade.questions import BANDS, n_options, option_band, option_names, render_text
from cascade.schema import (
    Action,
    Answer,
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    Question,
    ScoreAnswer,
    ScoreQuestion,
    SystemOneResponse,
    Usage,
)
from cascade.tracing import headers as timed

if TYPE_CHECKING:
    from cascade.policy.flow import Decision

Profile = Literal["laya", "jev"]


def r4(x: float) -> float:
    return round(float(x), 4)


def bucket(qtype: str, n_options: int) -> str:
    """Laya's option-count bucket, e.g. ``choice:3-5`` (noul is always ``noul:2``)."""
    return f"{qtype}:{option_band(n_options)}"


def entropy_confidence(p: Sequence[float]) -> float:
    """``1 - H(p)/ln k`` clipped to [0, 1]; 1.0 for fewer than two options."""
    k = len(p)
    if k < 2:
        return 1.0
    h = -sum(x * math.log(min(max(x, 1e-12), 1.0)) for x in p)
    return min(1.0, max(0.0, 1.0 - h / math.log(k)))


def jev_choice_confidence(p: Sequence[float]) -> float:
    n = len(p)
    return 1.0 if n < 2 else min(1.0, max(0.0, (n * max(p) - 1.0) / (n - 1.0)))


def jev_score_confidence(p: Sequence[float]) -> float:
    n = len(p)
    if n < 2:
        return 1.0
    mode = max(range(n), key=lambda i: (p[i], -i))
    spread = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return max(0.0, 1.0 - sum(p[i] * abs(i - mode) for i in range(n)) / spread)


def _argmax(p: Sequence[float]) -> int:
    best = 0
    for i, x in enumerate(p):
        if x > p[best]:
            best = i
    return best


def build_answer(question: Question, result: QuestionResult, profile: Profile) -> Answer:
    p = result.probabilities
    laya = profile == "laya"
    extras: dict[str, Any] = {}
    if laya:
        extras["answer_confidence"] = r4(max(p))
        if result.act_probability is not None:
            extras["action"] = Action(act_probability=r4(result.act_probability))
    if isinstance(question, ChoiceQuestion):
        names = option_names(question)
        return ChoiceAnswer(
            choice=names[_argmax(p)],
            probabilities={n: r4(x) for n, x in zip(names, p, strict=True)},
            confidence=r4(entropy_confidence(p) if laya else jev_choice_confidence(p)),
            x_jev_confidence=r4(jev_choice_confidence(p)) if laya else None,
            **extras,
        )
    if isinstance(question, ScoreQuestion):
        return ScoreAnswer(
            score=r4(sum(i * x for i, x in enumerate(p))),
            legend={str(i): render_text(level) for i, level in enumerate(question.criteria)},
            probabilities={str(i): r4(x) for i, x in enumerate(p)},
            confidence=r4(entropy_confidence(p) if laya else jev_score_confidence(p)),
            x_jev_confidence=r4(jev_score_confidence(p)) if laya else None,
            **extras,
        )
    p_true = p[1]
    return NoulAnswer(
        noul=r4(p_true), confidence=r4(max(p_true, 1.0 - p_true)) if laya else None, **extras
    )


def check_min_confidence(value: float | dict[str, float] | None) -> None:
    """Laya's rule: a map may name only buckets (``choice:3-5`` ...) and ``default``."""
    if isinstance(value, dict):
        allowed = {f"{t}:{s}" for t in ("choice", "score", "noul") for s in BANDS}
        unknown = set(value) - allowed - {"default"}
        if unknown or not value:
            raise ValidationFailed.at(
                ["min_confidence"],
                f"min_confidence keys must be option buckets or 'default'; got {sorted(unknown)}",
            )


def apply_gate(
    answer: Answer, qtype: str, n_options: int, min_confidence: float | dict[str, float]
) -> None:
    """Laya's abstention gate on ``answer_confidence`` (laya profile only)."""
    if isinstance(min_confidence, dict):
        key = bucket(qtype, n_options)
        threshold = min_confidence.get(key, min_confidence.get("default", 0.0))
    else:
        threshold = min_confidence
    conf = answer.answer_confidence
    answer.abstention_threshold = float(threshold)
    if conf is None:
        answer.abstention = "unevaluated"
    elif conf < threshold:
        answer.abstention, answer.low_confidence = "abstained", True
    else:
        answer.abstention = "passed"


def build_usage(usage: EngineUsage, profile: Profile) -> Usage:
    if profile == "jev":
        return Usage(input_tokens=usage.input_tokens, output_tokens=0)
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=0,
        state_tokens=usage.state_tokens,
        state_tokens_dropped=usage.state_tokens_dropped,
        truncated=usage.state_tokens_dropped > 0,
        truncated_questions=list(usage.truncated_questions),
        options=dict(usage.options) or None,
        cached_tokens=usage.cached_tokens or None,
    )


DEMO_PREFIX = "DEMO-random-weights/"
DEMO_WARNING = "DEMO: tiny random weights, answers are meaningless"


def demo_label(tiers: list[str]) -> dict[str, Any]:
    """The fields a command's JSON output carries when ``tiers`` (those serving random
    weights: ``cascade.build.random_tiers``) is not empty."""
    return {"demo": True, "random_tiers": tiers, "warning": DEMO_WARNING} if tiers else {}


def demo_banner(command: str, tiers: list[str]) -> None:
    """Say on stderr that ``tiers`` serve random weights (nothing when none does)."""
    if tiers:
        print(
            f"cascade {command}: DEMO: tiny RANDOM weights ({', '.join(tiers)}); the "
            "figures mean nothing",
            file=sys.stderr,
        )


def response(
    call: EngineCall, decision: Decision, timings: dict[str, float], *, profile: Profile, demo: bool
) -> SystemOneResponse:
    """``decision`` as the client gets it; ``timings`` are seconds per hop and tier."""
    shaped_answers = {}
    gate = call.controls.min_confidence
    for qid, question in call.questions.items():
        answer = build_answer(question, decision.results[qid], profile)
        if gate is not None and profile == "laya":
            apply_gate(answer, question.type, n_options(question), gate)
        shaped_answers[qid] = answer
    usage = build_usage(decision.usage, profile)
    model = decision.model
    shaped = SystemOneResponse(
        model=DEMO_PREFIX + model if demo else model, answers=shaped_answers, usage=usage
    )
    if profile == "laya":
        shaped.x_cascade = {
            "tiers": decision.tiers,
            "reasons": {q: r.reason for q, r in decision.routes.items() if r.reason},
            "degraded": decision.degraded,
            "timings_s": {k: round(v, 6) for k, v in timings.items()},
            **({"demo": True} if demo else {}),
        }
    return shaped


def headers(
    counts: Counter[str],
    *,
    demo: bool,
    timings: Mapping[str, float] | None = None,
    costs: Mapping[str, float] | None = None,
) -> dict[str, str]:
    """``x-cascade-tiers``: tier names and question counts (question ids are client text: they
    stay in the body); ``x-cascade-demo`` in demo mode; with ``timings`` (seconds by tier) and
    ``costs`` (``[cost]`` units by tier that ran), ``Server-Timing``'s tier entries and
    ``x-cascade-cost`` (``cascade.tracing.headers``)."""
    found = {"x-cascade-tiers": ",".join(f"{t}={n}" for t, n in counts.items())}
    if demo:
        found["x-cascade-demo"] = "random weights; answers are meaningless"
    if timings is not None:
        found[timed.SERVER_TIMING] = timed.timing(timings)
    if costs is not None:
        found[timed.COST] = timed.cost(costs)
    return found


class Outcome(msgspec.Struct, kw_only=True):
    """One decided request as the front door sends it: the response, its headers, and what
    the front door counts and charges."""

    response: SystemOneResponse
    headers: dict[str, str]
    label: str  # "ok" or "degraded", the requests_total outcome
    tiers: dict[str, str]  # question id -> the tier whose answer was returned
    # question id -> why it is not answered (``decide(partial=True)`` only; not in ``response``)
    refused: dict[str, CascadeError] = msgspec.field(default_factory=dict)
    cached_tokens: int = 0  # of the response's input tokens, answered from the decision cache
    timings: dict[str, float] = msgspec.field(default_factory=dict)  # seconds, by tier
    costs: dict[str, float] = msgspec.field(default_factory=dict)  # [cost] units, by tier ran
