"""The accuracy-target threshold rule against a brute-force reference, on label sets with ties."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cascade.policy.stats import ALPHA, accuracy_threshold, lower_bound, upper_bound

# Few distinct confidences, so most sets tie; two of them adjacent floats (no room between).
CONFIDENCES = (0.2, 0.5, 0.6, 0.7, math.nextafter(0.7, 1.0), 0.9, 1.0)
# Targets whose binomial tails (denominators powers of 2, or of 5) can never equal ALPHA = 1/20:
# the float rule and the exact reference cannot disagree at the boundary.
TARGETS = (Fraction(1, 4), Fraction(1, 2), Fraction(3, 5), Fraction(3, 4), Fraction(4, 5))


def _certified(right: int, n: int, target: Fraction) -> bool:
    """P(X >= right | n, target) <= alpha, in exact arithmetic."""
    tail = sum(math.comb(n, i) * target**i * (1 - target) ** (n - i) for i in range(right, n + 1))
    return right > 0 and tail <= Fraction(str(ALPHA))


def _reference(scored: list[tuple[float, bool]], target: Fraction) -> tuple[int, int]:
    """``(kept, right)`` of the lowest threshold, tried at every distinct confidence, that keeps
    every answer at or above it and is certified; ``(0, 0)`` when none is."""
    for t in sorted({c for c, _ in scored}):
        kept = [ok for c, ok in scored if c >= t]
        if _certified(sum(kept), len(kept), target):
            return len(kept), sum(kept)
    return 0, 0


labels = st.lists(st.tuples(st.sampled_from(CONFIDENCES), st.booleans()), max_size=40)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(scored=labels, target=st.sampled_from(TARGETS), data=st.data())
def test_threshold_matches_the_reference_in_any_label_order(scored, target, data):
    t, kept, right = accuracy_threshold(scored, float(target))
    assert (kept, right) == _reference(scored, target)
    if kept:  # the threshold keeps exactly what it reports: ties are never split
        assert sum(c >= t for c, _ in scored) == kept
        assert sum(ok for c, ok in scored if c >= t) == right
    else:
        assert t == 1.0
    shuffled = data.draw(st.permutations(scored))
    assert accuracy_threshold(shuffled, float(target)) == (t, kept, right)


def test_a_tie_of_right_and_wrong_is_kept_or_escalated_whole():
    right_first = [(0.6, True)] * 60 + [(0.6, False)] * 60
    wrong_first = right_first[::-1]
    assert accuracy_threshold(right_first, 0.9) == (1.0, 0, 0)
    assert accuracy_threshold(wrong_first, 0.9) == (1.0, 0, 0)


def test_a_cut_falls_between_distinct_confidences():
    scored = [(0.7, True)] * 30 + [(0.7, False)] * 30 + [(0.9, True)] * 40
    assert accuracy_threshold(scored, 0.9) == (0.8, 40, 40)


def test_the_upper_bound_mirrors_the_lower():
    assert upper_bound(0, 30) == pytest.approx(1 - 0.05 ** (1 / 30), abs=1e-9)  # 0.0950
    assert upper_bound(2, 10) == pytest.approx(1 - lower_bound(8, 10), abs=1e-12)
    assert upper_bound(10, 10) == 1.0
    assert upper_bound(0, 0) == 1.0  # nothing seen: anything is possible
    # the tail at the bound is alpha: P(X <= 12 | 60, upper) = 0.05
    p = upper_bound(12, 60)
    tail = sum(math.comb(60, i) * p**i * (1 - p) ** (60 - i) for i in range(13))
    assert tail == pytest.approx(ALPHA, abs=1e-9)
