"""Pure routing decisions, driven with canned previews and answers (no event loop, no model)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from cascade.calls import (
    CallPreview,
    EngineAnswer,
    EngineCall,
    EngineUsage,
    Image,
    QuestionResult,
    RowPreview,
)
from cascade.errors import EngineFailed, EngineUnavailable, UnknownModel, ValidationFailed
from cascade.laya.preview import Previewer
from cascade.laya.tiny import make_tiny
from cascade.policy.flow import Fallback, Preview, fallback, preview_call, run, stand_in
from cascade.policy.model import (
    Bands,
    ClefTier,
    Degrade,
    LayaTier,
    Models,
    Policy,
    Route,
    Thresholds,
    TypeBands,
    UpstreamTier,
)
from cascade.policy.routing import (
    PreRoute,
    QuestionRoute,
    Reason,
    final_routes,
    merge,
    post_route,
    pre_route,
    resolve_model,
    split,
)
from cascade.questions import option_band
from cascade.schema import ChoiceQuestion, NoulQuestion, OptionSpans, Question, ScoreQuestion

LAYA = msgspec.convert(
    {"kind": "laya", "checkpoints": {"english": "./en", "multilingual": "./ml"}}, LayaTier
)
POLICY = Policy(
    tiers={"laya": LAYA, "clef": ClefTier()},
    route=Route(cheap="laya", strong="clef"),
    models=Models(cheap_only=["laya"], strong_only=["clef-flash"]),
    thresholds=Thresholds(
        confidence=TypeBands(choice=Bands(two=0.8, three_five=0.6), noul=Bands(two=0.7)),
        margin=TypeBands(choice=Bands(three_five=0.2)),
    ),
)
QUESTIONS: dict[str, Question] = {
    "intent": ChoiceQuestion(criteria=["billing", "tech", "account"]),
    "urgent": NoulQuestion(),
    "mood": ScoreQuestion(criteria=["calm", "annoyed", "angry"]),
}
IMAGE = Image(data=b"\x89PNG", mime="image/png", width=1, height=1)


def with_(policy: Policy = POLICY, **route: object) -> Policy:
    return msgspec.structs.replace(policy, route=msgspec.structs.replace(policy.route, **route))


def call(
    model: str = "jev-latest",
    questions: dict[str, Question] | None = None,
    images: list[Image] | None = None,
) -> EngineCall:
    return EngineCall(
        state="where is my refund?",
        questions=questions or dict(QUESTIONS),
        model=model,
        images=images or [],
    )


def preview(
    rows: dict[str, RowPreview] | None = None, *, checkpoint: str = "english", readable: bool = True
) -> CallPreview:
    if rows is None:
        rows = {q: row() for q in QUESTIONS}
    return CallPreview(checkpoint=checkpoint, script="latin", readable=readable, rows=rows)


def row(n: int = 3, dropped: int = 0, collapsed: bool = False) -> RowPreview:
    return RowPreview(
        n_options=n,
        row_tokens=40,
        state_tokens=12,
        state_tokens_dropped=dropped,
        collapsed=collapsed,
    )


def routes(pre: PreRoute) -> dict[str, tuple[str, str | None]]:
    return {q: (r.tier, r.reason) for q, r in pre.questions.items()}


def answer(model: str, **results: list[float]) -> EngineAnswer:
    types = {"intent": "choice", "urgent": "noul", "mood": "score"}
    return EngineAnswer(
        model=model,
        usage=EngineUsage(input_tokens=10),
        results={
            q: QuestionResult(type=types[q], probabilities=p)  # type: ignore[arg-type]
            for q, p in results.items()
        },
    )


CONFIDENT = {"intent": [0.9, 0.05, 0.05], "urgent": [0.1, 0.9], "mood": [0.2, 0.6, 0.2]}


def planned(
    policy: Policy, pre: PreRoute, routes: dict[str, QuestionRoute], **kw: float
) -> Fallback:
    """``fallback``'s plan; its refusal raised, as the gateway answers it."""
    plan = fallback(policy, pre, routes, **kw)
    if isinstance(plan, EngineUnavailable):
        raise plan
    return plan


def stood_in(
    policy: Policy, c: EngineCall, previewer: Previewer, checkpoint: str | None
) -> tuple[str | None, list[Reason]]:
    """``stand_in`` with its previews answered by ``previewer``."""

    def reply(ask: object) -> CallPreview:
        assert isinstance(ask, Preview)
        return previewer.preview(ask.call, checkpoint=ask.checkpoint)

    return run(stand_in(policy, c, checkpoint), reply)


# ---------------------------------------------------------------- small facts


def test_option_bands() -> None:
    assert [option_band(n) for n in (1, 2, 3, 5, 6, 10, 11, 255)] == [
        "2",
        "2",
        "3-5",
        "3-5",
        "6-10",
        "6-10",
        "11+",
        "11+",
    ]


def test_resolve_model() -> None:
    for name in ("jev-latest", "jev-preview", "jev-1.13.0"):
        assert resolve_model(POLICY, name) == "cascade"
    assert resolve_model(POLICY, "laya") == "cheap_only"
    assert resolve_model(POLICY, "clef-flash") == "strong_only"
    with pytest.raises(UnknownModel, match="unknown model `gpt-4`"):
        resolve_model(POLICY, "gpt-4")
    lenient = msgspec.structs.replace(POLICY, models=Models(unknown="cascade"))
    assert resolve_model(lenient, "gpt-4") == "cascade"


def test_model_names_match_in_any_case_and_by_pattern() -> None:
    models = Models(
        cascade=["jev-latest", "jev-*"], cheap_only=["laya", "jev-laya"], strong_only=["Clef-Flash"]
    )
    policy = msgspec.structs.replace(POLICY, models=models)
    assert resolve_model(policy, "JEV-LATEST") == "cascade"
    assert resolve_model(policy, "jev-1") == "cascade"  # the jev-* family
    assert resolve_model(policy, " Laya ") == "cheap_only"
    assert resolve_model(policy, "clef-flash") == "strong_only"
    assert resolve_model(policy, "Jev-Laya") == "cheap_only"  # an exact name beats a pattern
    with pytest.raises(UnknownModel):
        resolve_model(policy, "jev")  # a pattern is no prefix match


@pytest.mark.parametrize("name", ["default.toml", "latency-first.toml", "quality-first.toml"])
def test_shipped_policies_accept_what_laya_serve_accepts(name: str) -> None:
    from cascade.policy.files import load_policy

    policy = load_policy(Path(__file__).parents[2] / "policies" / name)
    for model in (
        "convaiinnovations/laya",
        "convaiinnovations/laya-multilingual",
        "ConvaiInnovations/Laya-Typed-Decisions",
        "English",
        "MULTILINGUAL",
        "Laya",
    ):
        assert resolve_model(policy, model) == "cheap_only", (name, model)
    for model in ("jev-1", "jev-latest", "JEV-Preview", "jev-1.13.0", "jev-2"):
        assert resolve_model(policy, model) == "cascade", (name, model)
    assert resolve_model(policy, "clef-flash") == "strong_only"
    with pytest.raises(UnknownModel):
        resolve_model(policy, "gpt-4")


# ---------------------------------------------------------------- pre-routing


def test_everything_cheap_when_nothing_fires() -> None:
    pre = pre_route(POLICY, call(), preview())
    assert pre.mode == "cascade" and pre.cheap_checkpoint == "english"
    assert routes(pre) == {q: ("laya", None) for q in QUESTIONS}
    assert list(pre.questions) == list(QUESTIONS)


def test_images_send_the_whole_request_strong() -> None:
    pre = pre_route(POLICY, call(images=[IMAGE]), None)
    assert routes(pre) == {q: ("clef", "images") for q in QUESTIONS}
    assert pre.cheap_checkpoint is None


def test_unreadable_script_goes_strong() -> None:
    pre = pre_route(POLICY, call(), preview(readable=False))
    assert routes(pre) == {q: ("clef", "script") for q in QUESTIONS}


def test_per_question_rules_in_precedence_order() -> None:
    many = ChoiceQuestion(criteria=[f"o{i}" for i in range(49)])
    questions: dict[str, Question] = {**QUESTIONS, "many": many, "ok": NoulQuestion()}
    rows = {
        "intent": row(dropped=5),
        "urgent": row(2, collapsed=True),
        "mood": row(),
        "many": row(49),
        "ok": row(2),
    }
    policy = with_(strong_types=["score"])
    pre = pre_route(policy, call(questions=questions), preview(rows))
    assert routes(pre) == {
        "intent": ("clef", "state_too_long"),
        "urgent": ("clef", "options_collapsed"),
        "mood": ("clef", "type_rule"),
        "many": ("clef", "too_many_options"),
        "ok": ("laya", None),
    }
    # 48 options is still within the default limit
    at_limit = {"c": ChoiceQuestion(criteria=[f"o{i}" for i in range(48)])}
    assert routes(pre_route(POLICY, call(questions=at_limit), preview({"c": row(48)}))) == {
        "c": ("laya", None)
    }


def test_signal_switches_turn_off_the_token_rules() -> None:
    policy = msgspec.structs.replace(
        POLICY, thresholds=Thresholds(truncated=False, collapsed=False)
    )
    rows = {"intent": row(dropped=5), "urgent": row(2, collapsed=True), "mood": row()}
    pre = pre_route(policy, call(), preview(rows))
    assert all(r.tier == "laya" for r in pre.questions.values())


def test_whole_request_escalation_takes_the_others_along() -> None:
    rows = {"intent": row(dropped=5), "urgent": row(2), "mood": row()}
    pre = pre_route(with_(escalate="request"), call(), preview(rows))
    assert routes(pre) == {
        "intent": ("clef", "state_too_long"),
        "urgent": ("clef", "whole_request"),
        "mood": ("clef", "whole_request"),
    }
    assert pre.cheap_checkpoint is None


def test_model_aliases() -> None:
    strong = pre_route(POLICY, call("clef-flash"), None)
    assert strong.mode == "strong_only"
    assert routes(strong) == {q: ("clef", "model_alias") for q in QUESTIONS}
    rows = {"intent": row(dropped=5), "urgent": row(2), "mood": row()}
    cheap = pre_route(POLICY, call("laya"), preview(rows, checkpoint="multilingual"))
    assert cheap.mode == "cheap_only" and cheap.cheap_checkpoint == "multilingual"
    assert routes(cheap) == {q: ("laya", None) for q in QUESTIONS}
    with pytest.raises(ValidationFailed, match="text-only"):
        pre_route(POLICY, call("laya", images=[IMAGE]), None)
    with pytest.raises(UnknownModel):
        pre_route(POLICY, call("nope"), None)


def test_one_tier_policies() -> None:
    up = Policy.single_tier("up", UpstreamTier(urls=["http://x"]))
    pre = pre_route(up, call("anything", images=[IMAGE]), None)
    assert routes(pre) == {q: ("up", None) for q in QUESTIONS}
    laya_only = Policy.single_tier("laya", LAYA)
    pre = pre_route(
        laya_only, call(), preview({"intent": row(dropped=9), "urgent": row(2), "mood": row()})
    )
    assert routes(pre) == {q: ("laya", None) for q in QUESTIONS}
    assert pre.cheap_checkpoint == "english"
    with pytest.raises(ValidationFailed):
        pre_route(laya_only, call(images=[IMAGE]), None)


# ---------------------------------------------------------------- previews


class FakePreviewer:
    """Answers with ``readable[checkpoint]``; ``None`` stands for its own choice, ``chosen``."""

    def __init__(self, readable: dict[str | None, bool], chosen: str = "english") -> None:
        self.readable, self.chosen = readable, chosen
        self.asked: list[str | None] = []

    def preview(self, call: EngineCall, *, checkpoint: str | None = None) -> CallPreview:
        self.asked.append(checkpoint)
        return preview(checkpoint=checkpoint or self.chosen, readable=self.readable[checkpoint])


def test_preview_call_switches_to_multilingual_for_unreadable_text() -> None:
    fake = FakePreviewer({None: False, "multilingual": True})
    got = preview_call(POLICY, call(), fake)
    assert got is not None and got.checkpoint == "multilingual"
    assert fake.asked == [None, "multilingual"]


def test_preview_call_keeps_readable_text_and_skips_when_pointless() -> None:
    fake = FakePreviewer({None: True})
    got = preview_call(POLICY, call(), fake)
    assert got is not None and got.checkpoint == "english" and fake.asked == [None]
    assert preview_call(POLICY, call("clef-flash"), fake) is None
    assert preview_call(POLICY, call(images=[IMAGE]), fake) is None
    upstream = Policy.single_tier("up", UpstreamTier(urls=["http://x"]))
    assert preview_call(upstream, call(), fake) is None
    assert fake.asked == [None]


def test_preview_call_with_unreadable_strong_checks_the_default_checkpoint() -> None:
    policy = with_(unreadable="strong")
    fake = FakePreviewer({None: True, "english": False}, chosen="multilingual")
    got = preview_call(policy, call(), fake)
    assert got is not None and not got.readable and fake.asked == [None, "english"]
    assert routes(pre_route(policy, call(), got)) == {q: ("clef", "script") for q in QUESTIONS}
    # cheap_only still switches: the client asked for the cheap tier
    got = preview_call(policy, call("laya"), FakePreviewer({None: False, "multilingual": True}))
    assert got is not None and got.checkpoint == "multilingual"


def test_real_previewer_on_a_tiny_checkpoint(tmp_path: Path) -> None:
    ckpt = make_tiny(tmp_path / "en")  # max_len 512, head_max_len 192
    previewer = Previewer({"english": ckpt}, default="english")
    english_only = msgspec.structs.replace(
        POLICY,
        tiers={
            "laya": msgspec.convert(
                {"kind": "laya", "checkpoints": {"english": str(ckpt)}}, LayaTier
            ),
            "clef": ClefTier(),
        },
    )
    short, long = call(), msgspec.structs.replace(call(), state="refund please " * 300)
    khmer = msgspec.structs.replace(call(), state="សួស្តី ខ្ញុំចង់បានប្រាក់វិញ")
    decided = {}
    for name, c in (("short", short), ("long", long), ("khmer", khmer)):
        pv = preview_call(english_only, c, previewer)
        decided[name] = {r.reason for r in pre_route(english_only, c, pv).questions.values()}
    assert decided == {"short": {None}, "long": {"state_too_long"}, "khmer": {"script"}}
    # 140 options (4 tokens each at least) overflow the 512-token row: Laya would refuse the
    # whole call, so questions the policy sends strong anyway are left out of the preview
    wide = {**QUESTIONS, "intent": ChoiceQuestion(criteria=[f"label {i}" for i in range(140)])}
    c = call(questions=wide)
    with pytest.raises(ValidationFailed, match="option markers fit"):
        previewer.preview(c)
    pv = preview_call(english_only, c, previewer)
    assert pv is not None and set(pv.rows) == {"urgent", "mood"}
    assert routes(pre_route(english_only, c, pv))["intent"] == ("clef", "too_many_options")
    whole = with_(english_only, escalate="request")
    assert preview_call(whole, c, previewer) is None


def test_stand_in_respects_the_strong_only_rules(tmp_path: Path) -> None:
    """The cheap tier standing in for a dead strong tier must still read the text and fit the
    state, whatever rule sent the questions strong."""
    en = make_tiny(tmp_path / "en")  # max_len 512: 603 tokens of state are cut
    english_only = msgspec.structs.replace(
        POLICY,
        tiers={
            "laya": msgspec.convert(
                {"kind": "laya", "checkpoints": {"english": str(en)}}, LayaTier
            ),
            "clef": ClefTier(),
        },
    )
    previewer = Previewer({"english": en}, default="english")
    chinese = msgspec.structs.replace(call(), state="我的退款还没有到账，请帮我查一下")
    assert stood_in(english_only, chinese, previewer, "english") == ("english", ["script"])
    long = msgspec.structs.replace(call(), state="refund please " * 300)
    assert stood_in(english_only, long, previewer, "english") == ("english", ["state_too_long"])
    lenient = msgspec.structs.replace(
        english_only, thresholds=msgspec.structs.replace(POLICY.thresholds, truncated=False)
    )
    assert stood_in(lenient, long, previewer, "english") == ("english", [])
    assert stood_in(english_only, call(), previewer, "english") == ("english", [])
    # with a multilingual checkpoint configured the stand-in moves there
    both = Previewer({"english": en, "multilingual": en}, default="english")
    assert stood_in(POLICY, chinese, both, "english")[0] == "multilingual"


# ---------------------------------------------------------------- post-rules


def test_post_route_thresholds_by_type_and_band() -> None:
    pre = pre_route(POLICY, call(), preview())
    assert post_route(POLICY, call(), pre, answer("laya", **CONFIDENT), None) == {}
    unsure = {**CONFIDENT, "intent": [0.5, 0.3, 0.2], "urgent": [0.35, 0.65]}
    assert post_route(POLICY, call(), pre, answer("laya", **unsure), None) == {
        "intent": "low_confidence",
        "urgent": "low_confidence",
    }
    # 0.62 clears the 3-5 confidence bar (0.6), but the top-two margin 0.62-0.45 < 0.2 does not
    narrow = {**CONFIDENT, "intent": [0.62, 0.45, 0.0]}
    assert post_route(POLICY, call(), pre, answer("laya", **narrow), None) == {
        "intent": "low_margin"
    }
    # a 2-option choice uses band "2" (0.8): 0.75 escalates there, though it clears 3-5's 0.6
    two = {"c": ChoiceQuestion(criteria=["a", "b"])}
    pre2 = pre_route(POLICY, call(questions=two), preview({"c": row(2)}))
    got = EngineAnswer(
        model="laya",
        usage=EngineUsage(input_tokens=1),
        results={"c": QuestionResult(type="choice", probabilities=[0.75, 0.25])},
    )
    assert post_route(POLICY, call(questions=two), pre2, got, None) == {"c": "low_confidence"}


def test_post_route_truncation_and_collapse_signals() -> None:
    pre = pre_route(POLICY, call(), preview())
    cheap = answer("laya", **CONFIDENT)
    cheap.usage = EngineUsage(
        input_tokens=10,
        truncated_questions=["mood"],
        options={"intent": OptionSpans(total=3, distinct=2, tokens_per_option=4)},
    )
    assert post_route(POLICY, call(), pre, cheap, None) == {
        "intent": "options_collapsed",
        "mood": "truncated",
    }
    # the preview's signals count too (a cheap tier that does not report usage)
    plain = answer("laya", **CONFIDENT)
    seen = preview({"intent": row(), "urgent": row(2), "mood": row(dropped=3)})
    assert post_route(POLICY, call(), pre, plain, seen) == {"mood": "truncated"}


def test_post_route_whole_request_and_modes() -> None:
    policy = with_(escalate="request")
    pre = pre_route(policy, call(), preview())
    unsure = {**CONFIDENT, "urgent": [0.4, 0.6]}
    assert post_route(policy, call(), pre, answer("laya", **unsure), None) == {
        "intent": "whole_request",
        "urgent": "low_confidence",
        "mood": "whole_request",
    }
    only = pre_route(POLICY, call("laya"), preview())
    assert post_route(POLICY, call("laya"), only, answer("laya", **unsure), None) == {}
    with pytest.raises(EngineFailed, match="no answer for question `mood`"):
        post_route(POLICY, call(), pre, answer("laya", intent=[1.0, 0, 0], urgent=[0, 1]), None)


# ---------------------------------------------------------------- merge planning


def test_one_strong_call_for_pre_routed_and_escalated_questions() -> None:
    questions: dict[str, Question] = {
        **QUESTIONS,
        "big": ChoiceQuestion(criteria=[f"o{i}" for i in range(60)]),
    }
    c = call(questions=questions)
    pre = pre_route(POLICY, c, preview({**{q: row() for q in QUESTIONS}, "big": row(60)}))
    cheap_call = split(c, pre.questions)["laya"]
    assert list(cheap_call.questions) == ["intent", "urgent", "mood"]
    assert cheap_call.state == c.state and cheap_call.model == c.model
    cheap = answer("laya", **{**CONFIDENT, "urgent": [0.45, 0.55]})
    escalated = post_route(POLICY, c, pre, cheap, None)
    final = final_routes(POLICY, pre, escalated)
    assert {q: (r.tier, r.reason) for q, r in final.items()} == {
        "intent": ("laya", None),
        "urgent": ("clef", "low_confidence"),
        "mood": ("laya", None),
        "big": ("clef", "too_many_options"),
    }
    calls = split(c, final)
    assert set(calls) == {"laya", "clef"} and list(calls["clef"].questions) == ["urgent", "big"]
    strong = EngineAnswer(
        model="clef",
        usage=EngineUsage(input_tokens=5),
        results={
            "urgent": QuestionResult(type="noul", probabilities=[0.2, 0.8]),
            "big": QuestionResult(type="choice", probabilities=[1 / 60] * 60),
        },
    )
    merged = merge(c, final, {"laya": cheap, "clef": strong})
    assert list(merged) == ["intent", "urgent", "mood", "big"]
    assert merged["urgent"].probabilities == [0.2, 0.8]
    assert merged["intent"] is cheap.results["intent"]
    with pytest.raises(EngineFailed, match="no noul answer for `urgent`"):
        merge(c, final, {"laya": cheap, "clef": answer("clef")})


# ---------------------------------------------------------------- degradation


def test_fallback_degrades_what_the_cheap_tier_can_answer() -> None:
    questions: dict[str, Question] = {
        **QUESTIONS,
        "big": ChoiceQuestion(criteria=[f"o{i}" for i in range(60)]),
    }
    c = call(questions=questions)
    pre = pre_route(POLICY, c, preview({**{q: row() for q in QUESTIONS}, "big": row(60)}))
    final = final_routes(POLICY, pre, {"urgent": "low_confidence"})
    plan = planned(POLICY, pre, final)
    assert plan.cheap_questions == ["big"]  # the cheap tier already answered "urgent"
    assert plan.degraded == {"urgent": "low_confidence", "big": "too_many_options"}
    assert plan.cheap_checkpoint == "english"
    nothing = planned(POLICY, pre, pre.questions | {"big": QuestionRoute("laya")})
    assert nothing.degraded == {} and nothing.cheap_questions == []


def test_fallback_refuses_what_only_the_strong_tier_can_serve() -> None:
    for c, pv in (
        (call(images=[IMAGE]), None),
        (call(), preview({"intent": row(dropped=4), "urgent": row(2), "mood": row()})),
        (call("clef-flash"), None),
    ):
        pre = pre_route(POLICY, c, pv)
        with pytest.raises(EngineUnavailable) as info:
            planned(POLICY, pre, pre.questions)
        assert info.value.retry_after == POLICY.degrade.retry_after_s
    pre = pre_route(POLICY, call(images=[IMAGE]), None)
    with pytest.raises(EngineUnavailable, match=r"needs it \(images\)") as info:
        planned(POLICY, pre, pre.questions, retry_after_s=2.5)
    assert info.value.retry_after == 2.5


def test_fallback_honours_degrade_off_and_multilingual_for_script() -> None:
    pre = pre_route(POLICY, call(), preview(readable=False))
    plan = planned(POLICY, pre, pre.questions)  # multilingual is configured: degrade onto it
    assert plan.cheap_checkpoint == "multilingual"
    assert plan.cheap_questions == list(QUESTIONS)
    assert set(plan.degraded.values()) == {"script"}
    english_only = msgspec.structs.replace(
        POLICY,
        tiers={
            "laya": msgspec.convert({"kind": "laya", "checkpoints": {"english": "./en"}}, LayaTier),
            "clef": ClefTier(),
        },
    )
    with pytest.raises(EngineUnavailable, match="script"):
        planned(english_only, pre, pre.questions)
    strict = msgspec.structs.replace(POLICY, degrade=Degrade(cheap_answers=False))
    typed = pre_route(with_(strict, strong_types=["score"]), call(), preview())
    with pytest.raises(EngineUnavailable):
        planned(strict, typed, typed.questions)
