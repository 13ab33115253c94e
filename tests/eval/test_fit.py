"""Fitting: Clopper-Pearson bounds, temperatures that lower ECE, escalation targets that hold on
held-back questions (measured through the gateway's own routing functions)."""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.eval.data import Item
from cascade.eval.decide import rows_of
from cascade.eval.fit import fit, fit_temperature
from cascade.eval.runner import Outputs, TierRun
from cascade.eval.scores import Scored, ece
from cascade.eval.summary import summarize
from cascade.policy.calibration import (
    CalibrationFile,
    CalibrationStamp,
    apply_calibration,
    bands_of,
)
from cascade.policy.model import Policy, Route
from cascade.policy.stats import accuracy_threshold, betainc, lower_bound, quantile_threshold
from cascade.schema import Question


def _binomial_tail(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


@pytest.mark.parametrize(
    ("k", "n", "p"), [(8, 10, 0.6), (30, 30, 0.9), (45, 60, 0.7), (1, 5, 0.01), (99, 120, 0.85)]
)
def test_betainc_is_the_binomial_tail(k, n, p):
    assert betainc(k, n - k + 1, p) == pytest.approx(_binomial_tail(k, n, p), rel=1e-9)


def test_clopper_pearson_lower_bounds():
    assert lower_bound(30, 30) == pytest.approx(0.05 ** (1 / 30), abs=1e-9)  # 0.9050
    assert lower_bound(8, 10) == pytest.approx(0.4931, abs=1e-4)  # two-sided 90 % lower
    assert lower_bound(0, 10) == 0.0
    # the bound is where the tail equals 5 %
    assert _binomial_tail(45, 60, lower_bound(45, 60)) == pytest.approx(0.05, abs=1e-9)


def test_accuracy_threshold_keeps_the_largest_certified_set():
    # 40 confident right answers, then 20 unsure ones of which half are right
    scored = [(0.99 - i * 0.001, True) for i in range(40)]
    scored += [(0.5 - i * 0.01, i % 2 == 0) for i in range(20)]
    t, kept, right = accuracy_threshold(scored, 0.9)
    assert lower_bound(right, kept) >= 0.9
    assert kept >= 40 and 0.4 < t <= 0.96
    ranked = sorted(scored, key=lambda s: -s[0])
    for j in range(kept + 1, len(ranked) + 1):  # no larger accepted set is certified
        assert lower_bound(sum(ok for _, ok in ranked[:j]), j) < 0.9
    assert sum(c >= t for c, _ in scored) == kept
    assert accuracy_threshold([(0.9, False)] * 50, 0.5) == (1.0, 0, 0)


def test_quantile_threshold_splits_at_the_rate():
    confs = [i / 100 for i in range(100)]
    t = quantile_threshold(confs, 0.3)
    assert sum(c < t for c in confs) == 30
    assert quantile_threshold(confs, 0.0) == 0.0 and quantile_threshold(confs, 1.0) == 1.0


def _softmax(z: list[float]) -> list[float]:
    top = max(z)
    e = [math.exp(x - top) for x in z]
    return [x / sum(e) for x in e]


def _overconfident(rng: random.Random, n: int, k: int, sharpen: float):
    """True probabilities p; the gold drawn from p; the tier reports p sharpened (T = 1/s)."""
    out = []
    for _ in range(n):
        p = _softmax([rng.gauss(0, 1.0) for _ in range(k)])
        gold = rng.choices(range(k), weights=p)[0]
        out.append((_softmax([sharpen * math.log(x) for x in p]), gold))
    return out


def test_a_fitted_temperature_undoes_over_confidence_and_lowers_ece():
    from cascade.policy.calibration import temper

    pairs = _overconfident(random.Random(1), 3000, 4, sharpen=2.5)
    t = fit_temperature(pairs)
    assert t == pytest.approx(2.5, rel=0.12)

    def scored(tempered: float):
        out = []
        for p, gold in pairs:
            q = temper(p, tempered)
            answer = q.index(max(q))
            out.append(
                Scored(
                    type="choice",
                    band="3-5",
                    question="q",
                    gold=gold,
                    answer=answer,
                    gold_index=gold,
                    probabilities=q,
                )
            )
        return out

    before, after = ece(scored(1.0)), ece(scored(t))
    assert before > 0.15 and after < before / 3
    assert fit_temperature(_overconfident(random.Random(2), 50, 3, sharpen=100)) == 5.0  # clamp


POLICY = Policy(
    tiers={
        "laya": {"kind": "laya", "checkpoints": {"english": "/x"}},
        "clef": {"kind": "upstream", "urls": ["http://127.0.0.1:9"]},
    },
    route=Route(cheap="laya", strong="clef"),
)
POLICY = msgspec.convert(msgspec.to_builtins(POLICY), Policy)
QUESTIONS = {
    "noul": {"type": "noul", "instructions": "urgent?"},
    "pick": {"type": "choice", "instructions": "team?", "criteria": {"a": "A", "b": "B", "c": "C"}},
    "wide": {
        "type": "choice",
        "instructions": "intent?",
        "criteria": {f"k{i}": f"K{i}" for i in range(8)},
    },
}


def _synthetic(rng: random.Random, n: int) -> list[tuple[Item, Outputs]]:
    """Items whose cheap answers are over-confident in different ways per cell."""
    out = []
    for i in range(n):
        qid = rng.choice(list(QUESTIONS))
        question = msgspec.convert(QUESTIONS[qid], Question)
        k = 2 if qid == "noul" else len(question.criteria)
        ((p, gold),) = _overconfident(
            rng, 1, k, sharpen={"noul": 3.0, "pick": 1.5, "wide": 2.0}[qid]
        )
        label = (gold == 1) if qid == "noul" else f"{'abc'[gold]}" if qid == "pick" else f"k{gold}"
        call = EngineCall(state=f"s{i}", questions={qid: question}, model="jev-latest")
        answer = EngineAnswer(
            model="english",
            results={qid: QuestionResult(type=question.type, probabilities=p)},
            usage=EngineUsage(input_tokens=10),
        )
        strong = EngineAnswer(
            model="clef",
            results={qid: QuestionResult(type=question.type, probabilities=[1.0 / k] * k)},
            usage=EngineUsage(input_tokens=50),
        )
        out.append(
            (
                Item(id=str(i), call=call, gold={qid: label}),
                Outputs(preview=None, cheap=TierRun(answer=answer), strong=TierRun(answer=strong)),
            )
        )
    return out


def _rows(policy: Policy, data):
    return [row for item, outputs in data for row in rows_of(policy, item, outputs)]


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_escalation_target_holds_on_held_back_items(rate):
    rng = random.Random(int(rate * 100))
    fit_half, held_back = _synthetic(rng, 900), _synthetic(rng, 900)
    thresholds, temperatures, _ = fit(_rows(POLICY, fit_half), "escalation", rate)
    cal = CalibrationFile(
        stamp=CalibrationStamp(
            checkpoints={}, items=900, questions=900, target="escalation", value=rate
        ),
        thresholds=bands_of(thresholds),
        temperatures=bands_of(temperatures),
    )
    calibrated = apply_calibration(POLICY, cal, file="synthetic.toml")
    summary = summarize(
        _rows(calibrated, held_back),
        slots=["cheap", "strong"],
        price={"cheap": 1, "strong": 20},
        meta={},
    )
    achieved = summary["tiers"]["cascade"]["confidence_escalation_rate"]
    assert achieved == pytest.approx(rate, abs=0.03)
    # temperatures were fitted per cell and they differ (each cell is over-confident its own way)
    assert len({round(t, 1) for t in temperatures.values()}) == 3


def test_a_small_band_keeps_its_own_escalation_quantile():
    """12 eight-option questions beside hundreds of two- and three-option ones: their band is
    too small to fit alone, but pooled with everything its threshold sat above every one of
    its own confidences (max p of 8 options runs lower) and escalated all of them."""
    rng = random.Random(7)
    data = _synthetic(rng, 600)
    wide = [d for d in data if "wide" in d[0].call.questions][:12]
    rows = _rows(POLICY, [d for d in data if "wide" not in d[0].call.questions] + wide)
    diagnostics = fit(rows, "escalation", 0.3)[2]
    assert diagnostics["choice:6-10"].n == 12 and diagnostics["choice:6-10"].pooled
    assert 0.2 <= diagnostics["choice:6-10"].escalation <= 0.4


def test_the_quantile_threshold_is_midway_between_the_sorted_neighbours() -> None:
    rng = random.Random(3)
    for n in (2, 7, 1000):
        confs = [rng.random() for _ in range(n)]
        ordered, k = sorted(confs), round(0.3 * n)
        assert quantile_threshold(confs, 0.3) == (ordered[k - 1] + ordered[k]) / 2
