"""The metrics maths and the deferral sweep on small fixtures computed by hand."""

from __future__ import annotations

import pytest

from cascade.eval.decide import CascadeOut, ItemRow, TierOut
from cascade.eval.scores import Scored, accuracy, brier, ece, macro_f1, reliability
from cascade.eval.summary import summarize
from cascade.eval.sweep import Sweep


def _scored(qtype: str, qid: str, gold, answer, gold_index: int, p: list[float]) -> Scored:
    return Scored(
        type=qtype,
        band="3-5" if len(p) == 3 else "2",
        question=qid,
        gold=gold,
        answer=answer,
        gold_index=gold_index,
        probabilities=p,
    )


FIXTURE = [
    _scored("choice", "team", "a", "a", 0, [0.7, 0.2, 0.1]),  # right, bin 7
    _scored("choice", "team", "b", "a", 1, [0.5, 0.3, 0.2]),  # wrong, bin 5
    _scored("noul", "urgent", True, True, 1, [0.25, 0.75]),  # right, bin 7
    _scored("noul", "urgent", False, True, 0, [0.1, 0.9]),  # wrong, bin 9
]


def test_accuracy_brier_ece_and_macro_f1_match_hand_computed_values():
    assert accuracy(FIXTURE) == 0.5
    # Σ_k (p_k - y_k)²: 0.14, 0.78, 0.125, 1.62
    assert brier(FIXTURE) == pytest.approx((0.14 + 0.78 + 0.125 + 1.62) / 4)
    # bin 7: 2 answers, accuracy 1, mean confidence 0.725; bin 5: 0 vs 0.5; bin 9: 0 vs 0.9
    assert ece(FIXTURE) == pytest.approx(2 / 4 * 0.275 + 1 / 4 * 0.5 + 1 / 4 * 0.9)
    # classes (team, a): TP 1, FP 1 -> 2/3; (team, b): FN 1 -> 0; nouls do not count
    assert macro_f1(FIXTURE) == pytest.approx(1 / 3)
    bins = reliability(FIXTURE)
    assert [b["n"] for b in bins] == [0, 0, 0, 0, 0, 1, 0, 2, 0, 1]
    assert bins[7]["confidence"] == pytest.approx(0.725) and bins[7]["accuracy"] == 1.0


def test_top_label_bins_are_equal_width_and_one_falls_in_the_last():
    edge = [
        _scored("noul", "q", True, True, 1, [0.0, 1.0]),
        _scored("noul", "q", True, True, 1, [0.3, 0.7]),
    ]
    assert [b["n"] for b in reliability(edge)][7:] == [1, 0, 1]
    assert ece(edge) == pytest.approx(0.5 * 0.3)


def _row(
    i: int,
    conf: float,
    cheap_right: bool,
    strong_right: bool,
    *,
    tier="cheap",
    reason=None,
    pre_routed=False,
    cheap=True,
) -> ItemRow:
    def out(right: bool, c: float) -> TierOut:
        p = [1 - c, c] if right else [c, 1 - c]
        return TierOut(answer=right, probabilities=p, confidence=c)

    chosen = cheap_right if tier == "cheap" else strong_right
    # the flow's verdict: only a cheap answer no other rule sent strong reaches the gate
    gate = (reason or "kept") if cheap and reason in (None, "low_confidence") else None
    return ItemRow(
        id=f"item{i}",
        question="q",
        type="noul",
        band="2",
        gold=True,
        gold_index=1,
        cheap=out(cheap_right, conf) if cheap else None,
        strong=out(strong_right, 0.8),
        cascade=CascadeOut(
            answer=chosen, tier=tier, reason=reason, pre_routed=pre_routed, gate=gate
        ),
        tokens={"cheap": 10.0, "strong": 100.0},
    )


ROWS = [
    _row(1, 0.55, False, True, tier="strong", reason="low_confidence"),
    _row(2, 0.60, True, True),
    _row(3, 0.65, False, False),
    _row(4, 0.80, True, False),
    _row(5, 0.90, True, True),
    _row(
        6, 0.70, False, True, tier="strong", reason="state_too_long", pre_routed=True, cheap=False
    ),
]
PRICE = {"cheap": 1.0, "strong": 20.0}  # a question: cheap 0.01, strong 2.0


def test_the_sweep_escalates_the_least_confident_gated_questions_first():
    sweep = Sweep(ROWS, PRICE)
    assert sweep.m == 5 and sweep.n == 6
    got = [(round(p.escalation_rate * 6), round(p.accuracy * 6), p.cost) for p in sweep.points]
    assert got == [
        (1, 4, pytest.approx(2.05)),
        (2, 5, pytest.approx(4.05)),
        (3, 5, pytest.approx(6.05)),
        (4, 5, pytest.approx(8.05)),
        (5, 4, pytest.approx(10.05)),
        (6, 4, pytest.approx(12.05)),
    ]
    # 11 points at 0, 10, ..., 100 % of the 5 gated questions (k = 0,1,1,2,2,3,3,4,4,5,5)
    ks = [round(p.escalation_rate * 6) - 1 for p in sweep.curve()]
    assert ks == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert sweep.strong_only_cost == pytest.approx(12.0)


def test_summary_cascade_figures_from_the_rows():
    summary = summarize(ROWS, slots=["cheap", "strong"], price=PRICE, meta={})
    cascade = summary["tiers"]["cascade"]
    assert cascade["escalation_rate"] == pytest.approx(2 / 6)
    assert cascade["confidence_escalation_rate"] == pytest.approx(1 / 5)
    assert (cascade["fixed"], cascade["broke"]) == (1, 0)
    assert cascade["accuracy"] == pytest.approx(5 / 6)
    assert summary["tiers"]["cheap"]["accuracy"] == pytest.approx(3 / 5)
    assert summary["tiers"]["strong"]["accuracy"] == pytest.approx(4 / 6)
    assert cascade["operating_point"]["cost"] == pytest.approx(4.05)
    # the strong tier's accuracy (4/6) is reached with no escalation at all: cost 2.05 of 12
    at = cascade["cost"]["at_strong_accuracy"]
    assert at["escalation_rate"] == pytest.approx(1 / 6)
    assert at["saved"] == pytest.approx(1 - 2.05 / 12)
    assert len(cascade["deferral_curve"]) == 11
