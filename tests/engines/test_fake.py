"""cascade.engines.fake: the deterministic handler's invariants and the FakeEngine wrapper."""

from __future__ import annotations

import asyncio
import math

import pytest

from cascade.calls import EngineAnswer, EngineCall, EngineUsage
from cascade.engines.base import Engine
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.errors import Overloaded
from cascade.schema import ChoiceQuestion, NoulQuestion, Question, ScoreQuestion

OPTIONS: dict[str, str | None] = {"billing": "Payments", "technical": None, "sales": "Deals"}
CHOICE = ChoiceQuestion(instructions="Which team?", criteria=OPTIONS)
SCORE = ScoreQuestion(instructions="How angry?", criteria=["calm", "upset", "furious", "livid"])
NOUL = NoulQuestion(instructions="Is it urgent?")


def _call(questions: dict[str, Question], state: object = "I was charged twice") -> EngineCall:
    return EngineCall(state=state, questions=questions, model="jev-latest")  # type: ignore[arg-type]


def _probs(questions: dict[str, Question], qid: str, **kw: object) -> list[float]:
    return deterministic_answer(_call(questions, **kw)).results[qid].probabilities


def test_answers_are_distributions_of_the_right_shape_and_not_uniform() -> None:
    answer = deterministic_answer(_call({"c": CHOICE, "s": SCORE, "n": NOUL}))
    shapes = {qid: (r.type, len(r.probabilities)) for qid, r in answer.results.items()}
    assert shapes == {"c": ("choice", 3), "s": ("score", 4), "n": ("noul", 2)}
    for result in answer.results.values():
        assert math.isclose(sum(result.probabilities), 1.0)
        assert max(result.probabilities) - min(result.probabilities) > 1e-3
    assert answer.usage.input_tokens > 0


def test_repeated_calls_agree_exactly() -> None:
    call = _call({"c": CHOICE, "s": SCORE, "n": NOUL}, state={"turns": ["a", "b"]})
    assert deterministic_answer(call) == deterministic_answer(call)


def test_ids_other_questions_and_order_never_change_an_answer() -> None:
    alone = _probs({"team": CHOICE}, "team")
    assert _probs({"renamed id": CHOICE}, "renamed id") == alone
    assert _probs({"n": NOUL, "team": CHOICE, "s": SCORE}, "team") == alone


def test_state_instructions_and_options_do_change_answers() -> None:
    base = _probs({"q": CHOICE}, "q")
    assert _probs({"q": CHOICE}, "q", state="something else") != base
    other_ins = ChoiceQuestion(instructions="Which desk?", criteria=OPTIONS)
    assert _probs({"q": other_ins}, "q") != base
    other_option = ChoiceQuestion(instructions="Which team?", criteria={**OPTIONS, "sales": "Deal"})
    changed = _probs({"q": other_option}, "q")
    # Only the changed option's logit moves: the others keep their ratio.
    assert changed[2] != base[2]
    assert math.isclose(changed[0] / changed[1], base[0] / base[1])


def test_list_criteria_answer_in_label_order() -> None:
    question = ChoiceQuestion(instructions="Pick", criteria=["a", 2, True])
    assert len(_probs({"q": question}, "q")) == 3


def _run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_fake_engine_wraps_sync_and_async_handlers() -> None:
    canned = EngineAnswer(model="m", results={}, usage=EngineUsage(input_tokens=1))

    async def async_handler(call: EngineCall) -> EngineAnswer:
        await asyncio.sleep(0)
        return canned

    for handler in (lambda call: canned, async_handler):
        engine = FakeEngine("fake", handler)
        assert _run(engine.answer(_call({}))) is canned
        assert engine.calls == 1


def test_fake_engine_defaults_to_the_deterministic_handler() -> None:
    call = _call({"q": NOUL})
    assert _run(FakeEngine("fake").answer(call)) == deterministic_answer(call)


def test_handler_errors_escape_unchanged() -> None:
    def busy(call: EngineCall) -> EngineAnswer:
        raise Overloaded("busy", retry_after=2.0)

    engine = FakeEngine("fake", busy)
    with pytest.raises(Overloaded, match="busy"):
        _run(engine.answer(_call({})))
    assert engine.calls == 1


def test_lifecycle_and_protocol() -> None:
    engine = FakeEngine("laya")
    assert isinstance(engine, Engine)
    assert not engine.ready()
    _run(engine.start())
    assert engine.ready()
    assert engine.health() == {"engine": "fake", "ready": True, "calls": 0}
    _run(engine.aclose())
    assert not engine.ready()
