"""The metrics maths: accuracy, macro-F1, Brier score, ECE and reliability bins.

Definitions (each over the questions a tier answered that have a gold label naming an option):

- accuracy: share of answers equal to the gold label (argmax, the first maximum winning);
- macro-F1 (choice questions only): the mean over classes of 2·TP / (2·TP + FP + FN), a class
  being a (question id, option key) pair present in the gold labels or the answers;
- Brier: the mean over questions of Σ_k (p_k − 1[k = gold])², the multi-class form (for a noul
  it is twice the binary (p_true − y)²);
- ECE: top-label expected calibration error with 10 equal-width bins of max p
  (bin ``min(floor(10·max p), 9)``): Σ_b (n_b / n) · |accuracy_b − mean max p_b|.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

import msgspec

from cascade.questions import BANDS

N_BINS = 10


class Bin(TypedDict):
    """One reliability bin: its range of max p, its count, and (None when empty) the mean
    confidence and the accuracy of its members."""

    lo: float
    hi: float
    n: int
    confidence: float | None
    accuracy: float | None


class Scored(msgspec.Struct, frozen=True, kw_only=True):
    """One answered question with a gold label."""

    type: str
    band: str
    question: str  # the question id (macro-F1 classes are per question id)
    gold: Any
    answer: Any
    gold_index: int
    probabilities: list[float]

    @property
    def correct(self) -> bool:
        return bool(self.answer == self.gold)


def accuracy(scored: Sequence[Scored]) -> float | None:
    return sum(s.correct for s in scored) / len(scored) if scored else None


def brier(scored: Sequence[Scored]) -> float | None:
    if not scored:
        return None
    return sum(
        sum((p - (1.0 if k == s.gold_index else 0.0)) ** 2 for k, p in enumerate(s.probabilities))
        for s in scored
    ) / len(scored)


def bin_of(confidence: float) -> int:
    return min(math.floor(confidence * N_BINS), N_BINS - 1)


def reliability(scored: Sequence[Scored]) -> list[Bin]:
    """Per equal-width bin of max p: its range, count, mean confidence and accuracy."""
    bins: list[list[Scored]] = [[] for _ in range(N_BINS)]
    for s in scored:
        bins[bin_of(max(s.probabilities))].append(s)
    return [
        {
            "lo": b / N_BINS,
            "hi": (b + 1) / N_BINS,
            "n": len(members),
            "confidence": (
                sum(max(s.probabilities) for s in members) / len(members) if members else None
            ),
            "accuracy": accuracy(members),
        }
        for b, members in enumerate(bins)
    ]


def ece(scored: Sequence[Scored]) -> float | None:
    if not scored:
        return None
    total = 0.0
    for b in reliability(scored):
        right, confidence = b["accuracy"], b["confidence"]
        if right is not None and confidence is not None:  # the bin is not empty
            total += b["n"] / len(scored) * abs(right - confidence)
    return total


def macro_f1(scored: Sequence[Scored]) -> float | None:
    choices = [s for s in scored if s.type == "choice"]
    if not choices:
        return None
    tp: dict[tuple[str, Any], int] = defaultdict(int)
    fp: dict[tuple[str, Any], int] = defaultdict(int)
    fn: dict[tuple[str, Any], int] = defaultdict(int)
    for s in choices:
        if s.correct:
            tp[(s.question, s.gold)] += 1
        else:
            fp[(s.question, s.answer)] += 1
            fn[(s.question, s.gold)] += 1
    classes = set(tp) | set(fp) | set(fn)
    return sum(2 * tp[c] / (2 * tp[c] + fp[c] + fn[c]) for c in classes) / len(classes)


def scores(scored: Sequence[Scored]) -> dict[str, Any]:
    """``n``, ``accuracy``, ``macro_f1``, ``brier``, ``ece`` of one group of answers."""
    return {
        "n": len(scored),
        "accuracy": accuracy(scored),
        "macro_f1": macro_f1(scored),
        "brier": brier(scored),
        "ece": ece(scored),
    }


def breakdown(scored: Sequence[Scored]) -> dict[str, Any]:
    """``scores`` overall, and per question type and per option band."""
    return {
        **scores(scored),
        "by_type": {k: scores(g) for k, g in _groups(scored, lambda s: s.type)},
        "by_band": {k: scores(g) for k, g in _groups(scored, lambda s: s.band)},
    }


def _groups(scored: Iterable[Scored], key: Any) -> list[tuple[str, list[Scored]]]:
    groups: dict[str, list[Scored]] = defaultdict(list)
    for s in scored:
        groups[key(s)].append(s)
    return sorted(
        groups.items(), key=lambda kv: (BANDS.index(kv[0]) if kv[0] in BANDS else -1, kv[0])
    )
