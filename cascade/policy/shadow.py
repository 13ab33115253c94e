"""Shadow sampling and the agreement maths between a cheap and a strong answer.

A policy fraction of cheap-final requests is mirrored to the strong tier off the response path
(``shadow_questions`` decides which, deterministically per request key); ``compare`` then
measures, for every question of the two answers (``agreement`` for one), how far the tiers agree:

- choice: top-1 agreement (1.0 when both pick the same option, first maximum wins, else 0.0);
- noul: |Δp| on P(true);
- score: |Δ| of the expected level (sum of i * p_i), in levels.

Every result also carries the total variation distance of the two distributions, and the
question's type and option band, the labels agreement is exported under. Agreement with the
strong tier is a proxy, not accuracy: keep a human-labelled slice as well.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Literal

import msgspec

from cascade.calls import EngineAnswer, QuestionResult
from cascade.policy.model import Policy
from cascade.policy.routing import PreRoute
from cascade.questions import Band, option_band
from cascade.schema import QuestionType

Metric = Literal["top1", "abs_dp", "abs_dscore"]
METRIC: dict[QuestionType, Metric] = {"choice": "top1", "noul": "abs_dp", "score": "abs_dscore"}


class Agreement(msgspec.Struct, frozen=True):
    type: QuestionType
    band: Band
    metric: Metric  # what ``value`` measures (see the module docstring)
    value: float
    tvd: float  # 0.5 * sum |p_cheap - p_strong|, in [0, 1]


def agreement(cheap: QuestionResult, strong: QuestionResult) -> Agreement:
    """Compare two answers to the same question. Raises ValueError when their shapes differ."""
    p, q = cheap.probabilities, strong.probabilities
    if cheap.type != strong.type or len(p) != len(q) or not p:
        raise ValueError(
            f"cannot compare a {cheap.type}[{len(p)}] answer with a {strong.type}[{len(q)}] one"
        )
    qtype = cheap.type
    if qtype == "choice":
        value = 1.0 if p.index(max(p)) == q.index(max(q)) else 0.0
    elif qtype == "noul":
        value = abs(p[1] - q[1])
    else:
        value = abs(_expected_level(p) - _expected_level(q))
    tvd = 0.5 * sum(abs(a - b) for a, b in zip(p, q, strict=True))
    return Agreement(qtype, option_band(len(p)), METRIC[qtype], value, tvd)


def compare(cheap: EngineAnswer, strong: EngineAnswer) -> dict[str, Agreement]:
    """Agreement for every question both answers hold, in the cheap answer's order."""
    return {
        qid: agreement(result, strong.results[qid])
        for qid, result in cheap.results.items()
        if qid in strong.results
    }


def shadow_sampled(policy: Policy, key: str) -> bool:
    """Whether the request with ``key`` (e.g. its id) is in the policy's shadow fraction.

    A hash of (seed, key), not a random draw: the same request is always sampled or not, and
    the decision needs no state. Concurrency (``shadow.max_concurrent``) is the caller's bound.
    """
    fraction = policy.shadow.fraction
    if fraction <= 0.0 or policy.route.strong is None:
        return False
    digest = hashlib.blake2b(f"{policy.shadow.seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def shadow_questions(
    policy: Policy, pre: PreRoute, escalated: Mapping[str, str], key: str
) -> list[str]:
    """The questions to mirror for this request: all of them when every question was answered
    finally by the cheap tier and ``key`` is sampled; otherwise none."""
    cheap = policy.route.cheap
    if pre.mode != "cascade" or escalated or cheap is None:
        return []
    if any(r.tier != cheap for r in pre.questions.values()):
        return []
    return list(pre.questions) if shadow_sampled(policy, key) else []


def _expected_level(p: list[float]) -> float:
    return sum(i * pi for i, pi in enumerate(p))
