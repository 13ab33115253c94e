"""The guards' sequential test: fast rollbacks of a bad candidate, promotion of an equal one, and
a false-rollback rate within alpha over many looks."""

from __future__ import annotations

import numpy as np
import pytest

from cascade.policy.model import Guards
from cascade.rollout.verdict import ArmCounts, judge, look_alpha

SHARE_ONLY = Guards(
    max_strong_share_delta=0.05, min_labelled_accuracy_delta=None, max_error_rate=None
)


def _arm(n: int, strong: float = 0.2, degraded: float = 0.0, labelled: int = 0, acc: float = 0.9):
    return ArmCounts(
        questions=n,
        strong=round(n * strong),
        degraded=round(n * degraded),
        labelled=labelled,
        correct=round(labelled * acc),
    )


def _first(current, candidate, guards: Guards, looks: int = 60) -> tuple[str, int]:
    """The first verdict other than wait, and its look, with arms growing by ``current(k)``."""
    for k in range(1, looks + 1):
        verdict = judge(current(k), candidate(k), guards, k)
        if verdict.action != "wait":
            return verdict.action, k
    return "wait", looks


def test_the_looks_spend_alpha_and_no_more():
    assert sum(look_alpha(0.05, k) for k in range(1, 100_000)) == pytest.approx(0.05, rel=1e-4)
    assert look_alpha(0.05, 1) > look_alpha(0.05, 2) > 0


def test_a_candidate_that_sends_everything_strong_is_rolled_back_within_a_few_looks():
    action, look = _first(lambda k: _arm(50 * k, 0.2), lambda k: _arm(50 * k, 1.0), Guards())
    assert (action, look) == ("rollback", 1)
    verdict = judge(_arm(50, 0.22), _arm(50, 0.91), Guards(), 1)
    assert verdict.action == "rollback"
    assert verdict.reasons[0].startswith("strong share 0.92 vs 0.22 (+0.70 > +0.05 at 99.")
    assert (
        verdict.figures["strong_share.candidate_low"] > verdict.figures["strong_share.current_high"]
    )


def test_a_small_strong_share_rise_is_caught_too():
    action, look = _first(lambda k: _arm(200 * k, 0.2), lambda k: _arm(200 * k, 0.35), SHARE_ONLY)
    assert action == "rollback" and look <= 5


def test_equal_arms_wait_while_small_and_are_promoted_once_large_enough():
    small = judge(_arm(300, 0.2, 0.01, 300), _arm(300, 0.2, 0.01, 300), Guards(), 1)
    assert small.action == "wait"
    action, look = _first(lambda k: _arm(500 * k, 0.2), lambda k: _arm(500 * k, 0.2), SHARE_ONLY)
    assert action == "promote" and look > 1


def test_promotion_needs_the_minimum_samples_even_when_every_guard_holds():
    loose = Guards(max_strong_share_delta=1.0, min_labelled_accuracy_delta=-1.0, max_error_rate=1.0)
    few = judge(_arm(150, labelled=100), _arm(150, labelled=100), loose, 1)
    assert few.action == "wait"
    assert "candidate has 150 questions < 200" in few.reasons
    no_labels = judge(_arm(500, labelled=10), _arm(500, labelled=60), loose, 1)
    assert no_labels.reasons == ("current has 10 labels < 50",)
    assert judge(_arm(500, labelled=60), _arm(500, labelled=60), loose, 1).action == "promote"
    no_accuracy = Guards(
        max_strong_share_delta=1.0, min_labelled_accuracy_delta=None, max_error_rate=1.0
    )
    assert judge(_arm(500), _arm(500), no_accuracy, 1).action == "promote"  # labels not needed


def test_an_accuracy_drop_is_rolled_back():
    def current(k):
        return _arm(500 * k, labelled=100 * k, acc=0.9)

    def candidate(k):
        return _arm(500 * k, labelled=100 * k, acc=0.7)

    action, look = _first(current, candidate, Guards())
    assert action == "rollback" and look <= 3
    verdict = judge(current(look), candidate(look), Guards(), look)
    assert verdict.reasons[0].startswith("labelled accuracy 0.70 vs 0.90 (-0.20 < -0.02")


def test_a_high_error_rate_is_rolled_back():
    action, look = _first(lambda k: _arm(100 * k), lambda k: _arm(100 * k, degraded=0.3), Guards())
    assert (action, look) == ("rollback", 1)


def test_an_unset_guard_is_not_checked():
    current, candidate = _arm(1000, 0.2, labelled=500, acc=0.9), _arm(1000, 1.0, 0.5, 500, 0.1)
    assert judge(current, candidate, Guards(), 1).action == "rollback"
    none = Guards(
        max_strong_share_delta=None, min_labelled_accuracy_delta=None, max_error_rate=None
    )
    verdict = judge(current, candidate, none, 1)
    assert verdict.action == "promote"
    assert not any(key.startswith(("strong", "accuracy", "error")) for key in verdict.figures)
    only_errors = Guards(max_strong_share_delta=None, min_labelled_accuracy_delta=None)
    assert judge(current, candidate, only_errors, 1).reasons[0].startswith("error rate 0.50")


def test_empty_arms_wait_with_whole_intervals():
    verdict = judge(ArmCounts(), ArmCounts(), Guards(), 1)
    assert verdict.action == "wait"
    assert verdict.figures["strong_share.candidate"] is None
    assert (
        verdict.figures["strong_share.current_low"],
        verdict.figures["strong_share.current_high"],
    ) == (
        0.0,
        1.0,
    )


def test_look_is_one_based():
    with pytest.raises(ValueError):
        judge(ArmCounts(), ArmCounts(), Guards(), 0)


ROLLOUTS, LOOKS, PER_LOOK = 300, 40, 50


def test_false_rollbacks_of_equal_arms_stay_within_alpha():
    """The null at its edge: equal arms and guards with no slack (a strong share or an accuracy
    delta of 0, an error rate limit equal to the true rate), so any random excess counts. Each of
    300 rollouts gets 40 looks of 50 more questions (and 20 more labels) per arm."""
    guards = Guards(
        max_strong_share_delta=0.0, min_labelled_accuracy_delta=0.0, max_error_rate=0.05, alpha=0.05
    )
    rng = np.random.default_rng(20261205)
    rollbacks = 0
    for _ in range(ROLLOUTS):
        arms = np.zeros((2, 5), dtype=np.int64)
        for k in range(1, LOOKS + 1):
            for arm in arms:
                labelled = 20
                arm += (
                    PER_LOOK,
                    rng.binomial(PER_LOOK, 0.2),
                    rng.binomial(PER_LOOK, 0.05),
                    labelled,
                    rng.binomial(labelled, 0.8),
                )
            current, candidate = (ArmCounts(*map(int, arm)) for arm in arms)
            if judge(current, candidate, guards, k).action == "rollback":
                rollbacks += 1
                break
    rate = rollbacks / ROLLOUTS
    print(f"false rollbacks: {rollbacks}/{ROLLOUTS} = {rate:.3f} (alpha {guards.alpha})")
    assert rate <= guards.alpha
