"""Shadow agreement maths and deterministic shadow sampling."""

from __future__ import annotations

import msgspec
import pytest

from cascade.calls import EngineAnswer, EngineUsage, QuestionResult
from cascade.policy.model import ClefTier, LayaTier, Policy, Route, Shadow
from cascade.policy.routing import PreRoute, QuestionRoute
from cascade.policy.shadow import agreement, compare, shadow_questions, shadow_sampled

LAYA = msgspec.convert({"kind": "laya", "checkpoints": {"english": "./en"}}, LayaTier)
POLICY = Policy(
    tiers={"laya": LAYA, "clef": ClefTier()},
    route=Route(cheap="laya", strong="clef"),
    shadow=Shadow(fraction=0.25, seed=3),
)


def result(qtype: str, probabilities: list[float]) -> QuestionResult:
    return QuestionResult(type=qtype, probabilities=probabilities)  # type: ignore[arg-type]


def test_choice_top1_agreement() -> None:
    same = agreement(result("choice", [0.6, 0.3, 0.1]), result("choice", [0.4, 0.35, 0.25]))
    assert (same.metric, same.value, same.band) == ("top1", 1.0, "3-5")
    assert same.tvd == pytest.approx(0.2)
    differ = agreement(result("choice", [0.6, 0.4]), result("choice", [0.3, 0.7]))
    assert (differ.value, differ.band) == (0.0, "2")
    # ties: the first maximum wins, as in Laya's decoding
    assert agreement(result("choice", [0.5, 0.5]), result("choice", [0.6, 0.4])).value == 1.0


def test_noul_abs_delta_p() -> None:
    got = agreement(result("noul", [0.2, 0.8]), result("noul", [0.65, 0.35]))
    assert got.metric == "abs_dp" and got.band == "2"
    assert got.value == pytest.approx(0.45)
    assert got.tvd == pytest.approx(0.45)


def test_score_abs_delta_of_expected_level() -> None:
    cheap = result("score", [0.0, 0.5, 0.5, 0.0])  # expected level 1.5
    strong = result("score", [0.0, 0.0, 0.2, 0.8])  # expected level 2.8
    got = agreement(cheap, strong)
    assert got.metric == "abs_dscore" and got.band == "3-5"
    assert got.value == pytest.approx(1.3)
    assert agreement(strong, strong).value == 0.0


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot compare"):
        agreement(result("choice", [0.5, 0.5]), result("choice", [0.2, 0.3, 0.5]))
    with pytest.raises(ValueError, match="cannot compare"):
        agreement(result("noul", [0.5, 0.5]), result("choice", [0.5, 0.5]))


def test_compare_covers_the_questions_both_answers_hold() -> None:
    usage = EngineUsage(input_tokens=1)
    cheap = EngineAnswer(
        model="laya",
        usage=usage,
        results={
            "a": result("noul", [0.9, 0.1]),
            "b": result("choice", [0.1, 0.9]),
        },
    )
    strong = EngineAnswer(model="clef", usage=usage, results={"b": result("choice", [0.2, 0.8])})
    got = compare(cheap, strong)
    assert list(got) == ["b"] and got["b"].value == 1.0


def test_sampling_is_deterministic_and_close_to_the_fraction() -> None:
    keys = [f"req-{i}" for i in range(4000)]
    picked = [k for k in keys if shadow_sampled(POLICY, k)]
    assert picked == [k for k in keys if shadow_sampled(POLICY, k)]
    assert 0.22 < len(picked) / len(keys) < 0.28
    reseeded = msgspec.structs.replace(POLICY, shadow=Shadow(fraction=0.25, seed=4))
    assert picked != [k for k in keys if shadow_sampled(reseeded, k)]


def test_sampling_edges() -> None:
    none = msgspec.structs.replace(POLICY, shadow=Shadow(fraction=0.0))
    every = msgspec.structs.replace(POLICY, shadow=Shadow(fraction=1.0))
    no_strong = msgspec.structs.replace(POLICY, route=Route(cheap="laya"))
    keys = [str(i) for i in range(200)]
    assert not any(shadow_sampled(none, k) for k in keys)
    assert all(shadow_sampled(every, k) for k in keys)
    assert not any(shadow_sampled(no_strong, k) for k in keys)


def test_only_cheap_final_requests_are_mirrored() -> None:
    every = msgspec.structs.replace(POLICY, shadow=Shadow(fraction=1.0))
    cheap = PreRoute("cascade", "english", {"a": QuestionRoute("laya"), "b": QuestionRoute("laya")})
    assert shadow_questions(every, cheap, {}, "k") == ["a", "b"]
    assert shadow_questions(every, cheap, {"b": "low_confidence"}, "k") == []
    mixed = PreRoute(
        "cascade", "english", {"a": QuestionRoute("laya"), "b": QuestionRoute("clef", "type_rule")}
    )
    assert shadow_questions(every, mixed, {}, "k") == []
    only = PreRoute("cheap_only", "english", {"a": QuestionRoute("laya")})
    assert shadow_questions(every, only, {}, "k") == []
    never = msgspec.structs.replace(POLICY, shadow=Shadow(fraction=0.0))
    assert shadow_questions(never, cheap, {}, "k") == []
