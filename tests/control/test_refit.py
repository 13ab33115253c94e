"""The refit against synthetic labels whose correctness probability is a known function of the
confidence (P(correct | c) = c), so the right threshold is computable; cells without enough
labels keep their configured threshold; the budget and the target conflicting both ways; and a
frozen gate."""

from __future__ import annotations

import random

import pytest

from cascade import metrics
from cascade.control.evidence import Labelled
from cascade.control.live import LiveControl
from cascade.control.refit import Refit, capped
from cascade.policy.model import Control, Targets
from cascade.policy.stats import lower_bound
from tests.control.load import Clock, decided, policy, replay

TARGET = 0.9


def labels(
    n: int, rng: random.Random, *, qtype: str = "choice", lo: float = 0.5, source: str = "feedback"
) -> list[Labelled]:
    """max p uniform on [lo, 1], right with probability max p."""
    out = []
    for _ in range(n):
        c = rng.uniform(lo, 1.0)
        out.append(
            Labelled(
                type=qtype,
                band="2",
                confidence=c,
                correct=rng.random() < c,  # type: ignore[arg-type]
                source=source,
                ts=0.0,
            )
        )  # type: ignore[arg-type]
    return out


def analytic(n: int, target: float = TARGET) -> float:
    """The threshold t where the expected kept answers (n (1 - t) / 0.5 of them, accuracy
    (1 + t) / 2) have a 95 % lower bound of exactly ``target``."""
    lo, hi = 0.5, 1.0
    for _ in range(50):
        t = (lo + hi) / 2
        kept = n * (1 - t) / 0.5
        bound = lower_bound(round(kept * (1 + t) / 2), round(kept))
        lo, hi = (lo, t) if bound >= target else (t, hi)
    return hi


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fitted_threshold_is_the_analytic_one(seed: int) -> None:
    refit = Refit(Control(target_accuracy=TARGET))
    refit.observe(labels(2000, random.Random(seed)))
    (fitted,) = refit.fit()
    want = analytic(2000)
    print(
        f"seed {seed}: fitted {fitted.threshold:.4f}, analytic {want:.4f} "
        f"(population 0.8), n={fitted.n} kept={fitted.kept} bound={fitted.bound:.4f}"
    )
    assert fitted.cell == ("choice", "2") and fitted.n == 2000 and not fitted.pooled
    assert abs(fitted.threshold - want) < 0.05  # its spread over seeds is 0.02
    assert fitted.bound >= TARGET


def test_the_fit_is_unbiased_over_many_label_sets() -> None:
    fits = []
    for seed in range(20):
        refit = Refit(Control(target_accuracy=TARGET))
        refit.observe(labels(2000, random.Random(100 + seed)))
        fits.append(refit.fit()[0].threshold)
    mean = sum(fits) / len(fits)
    print(f"mean of 20 fits {mean:.4f}, analytic {analytic(2000):.4f}")
    assert abs(mean - analytic(2000)) < 0.012


def test_a_cell_without_enough_labels_keeps_its_configured_threshold() -> None:
    clock = Clock()
    control = LiveControl(policy(target_accuracy=TARGET), clock=clock)
    rng = random.Random(3)
    control.observe(labels(2000, rng) + labels(29, rng, qtype="noul"))
    clock.now = 1.0
    gate = control.gate()
    assert gate.live("noul", "2") == 0.7  # 29 < min_labels: configured
    assert abs(gate.live("choice", "2") - analytic(2000)) < 0.05  # type: ignore[operator]
    pooled = Refit(Control(target_accuracy=TARGET, pool="band"))
    pooled.observe(labels(2000, rng) + labels(29, rng, qtype="noul"))
    by_cell = {f.cell: f for f in pooled.fit()}
    assert by_cell[("noul", "2")].pooled and by_cell[("noul", "2")].n == 2029


def test_only_the_teacher_the_policy_names_is_learnt_from() -> None:
    rng = random.Random(4)
    feedback = Refit(Control(target_accuracy=TARGET))
    feedback.observe(labels(500, rng, source="shadow"))
    assert feedback.fit() == []
    both = Refit(Control(target_accuracy=Targets(choice=TARGET), teacher="feedback+shadow"))
    both.observe(labels(500, rng, source="shadow"))
    assert [f.sources for f in both.fit()] == ["shadow"]


def test_clamps_bound_the_refit_and_an_uncertifiable_cell_escalates_everything() -> None:
    rng = random.Random(5)
    found = labels(2000, rng)
    for clamp, want in (({"max_threshold": 0.8}, 0.8), ({"min_threshold": 0.9}, 0.9)):
        clamped = Refit(Control(target_accuracy=TARGET, **clamp))  # type: ignore[arg-type]
        clamped.observe(found)
        assert clamped.fit()[0].threshold == want
    hopeless = Refit(Control(target_accuracy=0.99))
    hopeless.observe(labels(100, rng))
    assert hopeless.fit()[0].threshold == 1.0


def _judged(
    correct: bool, *, tenant: str = "", asked: str | None = None, confidence: float = 0.6
) -> Labelled:
    return Labelled(
        type="noul",
        band="2",
        confidence=confidence,
        correct=correct,
        source="feedback",
        ts=0.0,
        tenant=tenant,
        asked=asked,
    )


def test_a_relabel_replaces_the_questions_earlier_label_never_adds_to_it() -> None:
    refit = Refit(Control(target_accuracy=TARGET, min_labels=30, max_tenant_share=1.0))
    for i in range(60):  # one asked question, 60 labels: one judged answer, the latest
        refit.observe([_judged(i % 2 == 0, tenant="acme", asked="7@1.5")])
    assert refit.labels(("noul", "2")) == 1 and refit.fit() == []
    refit.observe([_judged(True, asked=f"{i}@2.0", confidence=0.95) for i in range(40)])
    (fitted,) = refit.fit()
    assert fitted.n == 41 and fitted.kept == 40  # the relabelled one counts once, as wrong
    refit.observe([_judged(False) for _ in range(3)])  # no asked question: each one counts
    assert refit.labels(("noul", "2")) == 44


def test_no_tenant_makes_up_more_than_its_share_of_a_cells_evidence() -> None:
    mallory = [_judged(True, tenant="mallory", asked=f"m{i}") for i in range(100)]
    honest = [
        _judged(i % 4 != 0, tenant="honest", asked=f"h{i}", confidence=0.95) for i in range(20)
    ]
    assert capped(mallory, 0.5) == [] and capped(mallory, 1.0) == mallory
    kept = capped(honest + mallory, 0.5)
    assert kept == honest + mallory[-20:]  # mallory's most recent, as many as the others'
    assert capped(honest + mallory, 0.25) == []  # two tenants cannot each be a quarter
    keyless = [_judged(True, asked=f"k{i}") for i in range(10)]
    assert capped(keyless + mallory, 0.5) == keyless + mallory[-10:]
    refit = Refit(Control(target_accuracy=TARGET, min_labels=30))
    refit.observe(mallory)
    assert refit.fit() == []  # a cell of one tenant's labels alone has no evidence at 0.5
    refit.observe(honest)
    (fitted,) = refit.fit()
    assert fitted.n == 40


def _conflict(prefer: str) -> tuple[LiveControl, list[tuple[float, bool]], Clock]:
    """A refit to ~0.83 on choice:2, then traffic the budget cannot afford at that threshold."""
    clock = Clock()
    control = LiveControl(
        policy(max_strong_share=0.1, target_accuracy=TARGET, prefer=prefer, refit_interval_s=30.0),
        clock=clock,
    )
    control.observe(labels(2000, random.Random(6)))
    events = replay(control, clock, [(400, 10, {"choice": (1.0, 0.5, 1.0)})])
    return control, events, clock


def test_the_budget_wins_a_conflict_unless_accuracy_is_preferred() -> None:
    winner = metrics.CONTROL_CONFLICTS.labels(winner="budget")
    before = winner._value.get()
    control, events, _ = _conflict("budget")
    fitted = control.gate().confidence.choice.two
    assert fitted is not None and fitted > 0.8
    assert control.gate().live("choice", "2") < fitted - 0.1  # type: ignore[operator]
    late = [s for t, s in events if t > 330]
    assert sum(late) / len(late) < 0.13  # the budget held
    assert winner._value.get() == before + 1  # counted once, when it started

    winner = metrics.CONTROL_CONFLICTS.labels(winner="accuracy")
    before = winner._value.get()
    control, events, _ = _conflict("accuracy")
    assert control.gate().live("choice", "2") == control.gate().confidence.choice.two
    late = [s for t, s in events if t > 330]
    assert sum(late) / len(late) > 0.25  # the target held: ~1/3 escalate
    assert winner._value.get() == before + 1


def test_a_frozen_gate_holds_its_thresholds_until_unfrozen() -> None:
    clock = Clock()
    control = LiveControl(policy(max_strong_share=0.1, frozen=True), clock=clock)
    replay(control, clock, [(100, 10, {"choice": (1.0, 0.5, 1.0)})])
    assert control.frozen and control.gate().live("choice", "2") == 0.8

    control = LiveControl(policy(max_strong_share=0.1), clock=clock)
    replay(control, clock, [(100, 10, {"choice": (1.0, 0.5, 1.0)})])
    held = control.gate().live("choice", "2")
    assert held is not None and held < 0.8
    control.freeze()
    control.observe(labels(2000, random.Random(7)))
    replay(control, clock, [(100, 2, {"choice": (1.0, 0.9, 1.0)})], seed=1)
    assert control.gate().live("choice", "2") == held  # neither the pacer nor a refit moved
    control.unfreeze()
    clock.now += 2
    decided(control, "choice", 0.99)
    assert control.gate().live("choice", "2") != held


def test_rebase_keeps_the_observations_and_takes_the_new_settings() -> None:
    clock = Clock()
    control = LiveControl(policy(max_strong_share=0.1), clock=clock)
    replay(control, clock, [(200, 10, {"choice": (1.0, 0.5, 1.0)})])
    assert control.gate().live("choice", "2") < 0.8  # type: ignore[operator]
    control.rebase(policy(max_strong_share=0.9))
    clock.now += 2
    assert control.gate().live("choice", "2") == 0.8  # the allowance covers it now
    control.rebase(policy(max_strong_share=0.1))
    clock.now += 2
    assert control.gate().live("choice", "2") < 0.8  # type: ignore[operator]
