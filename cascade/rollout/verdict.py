"""The guards' verdict on a candidate policy against the current one: a sequential test.

The gateway looks at the two arms' counts every ``guards.interval_s``; each look may end the
rollout, so the error level ``alpha`` is spent over the looks: look k (1-based) gets
``alpha_k = alpha * 6 / (pi^2 k^2)`` (the sum over every k is ``alpha``). ``alpha_k`` is split
(Bonferroni) over the guards that are set and the two directions (broken, holds): each test runs
at ``level = alpha_k / (2 * guards)``, with a two-sided Clopper-Pearson interval per arm at that
level (``level / 2`` on each end; an empty arm's interval is [0, 1]).

A guard is BROKEN with confidence when even the ends most favourable to the candidate break it:

- strong share: ``lower(candidate) - upper(current) > max_strong_share_delta``;
- labelled accuracy: ``upper(candidate) - lower(current) < min_labelled_accuracy_delta``;
- error rate: ``lower(candidate degraded share) > max_error_rate``.

It HOLDS with confidence when even the least favourable ends hold it (the same comparisons with
the other ends). The verdict: ``rollback`` as soon as any guard is broken (no minimum sample: the
test bounds the false rollbacks by ``alpha`` over the whole rollout); ``promote`` when every set
guard holds and each arm has at least ``min_questions`` questions (and ``min_labels`` labelled
ones when the accuracy guard is set); else ``wait``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import msgspec

from cascade.policy.model import Guards
from cascade.policy.stats import lower_bound, upper_bound


class ArmCounts(msgspec.Struct, frozen=True):
    """One arm's questions in the window: rows of its ``policy_hash`` (``cascade.rollout.arms``)."""

    questions: int = 0
    strong: int = 0  # answered by the strong tier (the final tier is not the cheap one)
    degraded: int = 0  # degraded answers: the error guard's numerator
    labelled: int = 0  # questions with a feedback label
    correct: int = 0  # of the labelled, those whose served answer equals the label


class Verdict(msgspec.Struct, frozen=True):
    action: Literal["wait", "rollback", "promote"]
    reasons: tuple[str, ...]
    # each guard's estimates and interval ends, for logs, /admin and the audit note
    figures: dict[str, float | None]


def look_alpha(alpha: float, look: int) -> float:
    """The share of ``alpha`` that look ``look`` (1-based) may spend."""
    return alpha * 6.0 / (math.pi**2 * look**2)


@lru_cache(maxsize=4096)
def interval(k: int, n: int, level: float) -> tuple[float, float]:
    """Two-sided (1 - level) Clopper-Pearson interval of k successes in n; [0, 1] when n = 0."""
    if n <= 0:
        return 0.0, 1.0
    return lower_bound(k, n, level / 2), upper_bound(k, n, level / 2)


def _share(k: int, n: int) -> float | None:
    return k / n if n else None


def _pct(level: float) -> str:
    return f"{100 * (1 - level):.2f} %"


def _diff(a: float | None, b: float | None) -> str:
    return f"{(a or 0.0) - (b or 0.0):+.2f}"


def judge(current: ArmCounts, candidate: ArmCounts, guards: Guards, look: int) -> Verdict:
    """The verdict at look ``look`` (1-based) on the arms' counts since the rollout started."""
    if look < 1:
        raise ValueError(f"look is 1-based, got {look}")
    set_guards = [
        g is not None
        for g in (
            guards.max_strong_share_delta,
            guards.min_labelled_accuracy_delta,
            guards.max_error_rate,
        )
    ]
    alpha_k = look_alpha(guards.alpha, look)
    level = alpha_k / (2 * max(1, sum(set_guards)))
    figures: dict[str, float | None] = {"look": float(look), "alpha_look": alpha_k, "level": level}
    broken: list[str] = []
    open_: list[str] = []

    if guards.max_strong_share_delta is not None:
        limit = guards.max_strong_share_delta
        cur, cand = current.strong, candidate.strong
        cur_lo, cur_hi = interval(cur, current.questions, level)
        cand_lo, cand_hi = interval(cand, candidate.questions, level)
        est_cur, est_cand = _share(cur, current.questions), _share(cand, candidate.questions)
        figures |= {
            "strong_share.current": est_cur,
            "strong_share.current_low": cur_lo,
            "strong_share.current_high": cur_hi,
            "strong_share.candidate": est_cand,
            "strong_share.candidate_low": cand_lo,
            "strong_share.candidate_high": cand_hi,
        }
        text = f"strong share {est_cand or 0:.2f} vs {est_cur or 0:.2f} ({_diff(est_cand, est_cur)}"
        if cand_lo - cur_hi > limit:
            broken.append(f"{text} > {limit:+.2f} at {_pct(level)})")
        elif not cand_hi - cur_lo <= limit:
            open_.append(f"{text}, not yet <= {limit:+.2f} at {_pct(level)})")

    if guards.min_labelled_accuracy_delta is not None:
        limit = guards.min_labelled_accuracy_delta
        cur_lo, cur_hi = interval(current.correct, current.labelled, level)
        cand_lo, cand_hi = interval(candidate.correct, candidate.labelled, level)
        est_cur = _share(current.correct, current.labelled)
        est_cand = _share(candidate.correct, candidate.labelled)
        figures |= {
            "accuracy.current": est_cur,
            "accuracy.current_low": cur_lo,
            "accuracy.current_high": cur_hi,
            "accuracy.candidate": est_cand,
            "accuracy.candidate_low": cand_lo,
            "accuracy.candidate_high": cand_hi,
        }
        text = (
            f"labelled accuracy {est_cand or 0:.2f} vs {est_cur or 0:.2f} "
            f"({_diff(est_cand, est_cur)}"
        )
        if cand_hi - cur_lo < limit:
            broken.append(f"{text} < {limit:+.2f} at {_pct(level)})")
        elif not cand_lo - cur_hi >= limit:
            open_.append(f"{text}, not yet >= {limit:+.2f} at {_pct(level)})")

    if guards.max_error_rate is not None:
        limit = guards.max_error_rate
        lo, hi = interval(candidate.degraded, candidate.questions, level)
        est = _share(candidate.degraded, candidate.questions)
        figures |= {"error_rate.candidate": est, "error_rate.low": lo, "error_rate.high": hi}
        text = f"error rate {est or 0:.2f}"
        if lo > limit:
            broken.append(f"{text} > {limit:.2f} at {_pct(level)}")
        elif not hi <= limit:
            open_.append(f"{text}, not yet <= {limit:.2f} at {_pct(level)}")

    if broken:
        return Verdict("rollback", tuple(broken), figures)
    short = [
        f"{name} has {arm.questions} questions < {guards.min_questions}"
        for name, arm in (("current", current), ("candidate", candidate))
        if arm.questions < guards.min_questions
    ]
    if guards.min_labelled_accuracy_delta is not None:
        short += [
            f"{name} has {arm.labelled} labels < {guards.min_labels}"
            for name, arm in (("current", current), ("candidate", candidate))
            if arm.labelled < guards.min_labels
        ]
    if open_ or short:
        return Verdict("wait", tuple(open_ + short), figures)
    return Verdict("promote", ("every guard holds",), figures)
