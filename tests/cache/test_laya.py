"""Laya (the tiny ONNX checkpoints) answers each question alone, as it declares: a call's answer
splits into per-question parts that join back into it, and a question's part is the same
whichever other questions it was asked with."""

from __future__ import annotations

import msgspec
import pytest

from cascade.cache import parts
from cascade.engines.base import answers_each_question
from cascade.engines.laya import LayaEngine
from tests.engines import test_laya_engine as laya_tests
from tests.engines.test_laya_engine import QUESTIONS, STATES, call

# The tiny checkpoints and their engine, as the engine's own tests build them.
checkpoints, cache, engine = laya_tests.checkpoints, laya_tests.cache, laya_tests.engine

pytestmark = pytest.mark.anyio
MANY = {
    "intent": {
        "type": "choice",
        "instructions": "Which?",
        "criteria": [f"intent_{i}" for i in range(45)],
    }
}


@pytest.mark.parametrize("state", [*STATES[:4], "Need help " * 40])
async def test_laya_answers_split_and_join_exactly(engine: LayaEngine, state: object) -> None:
    assert answers_each_question(engine)
    both = {**QUESTIONS, **MANY}
    whole = await engine.answer(call(state, both, max_len=300))
    split = parts.split(whole)
    assert split is not None
    assert parts.join(call(state, both, max_len=300), split) == whole
    for qid in both:
        alone = await engine.answer(call(state, {qid: both[qid]}, max_len=300))
        part = (parts.split(alone) or {})[qid]
        expected = split[qid]
        assert msgspec.structs.replace(part, result=expected.result) == expected
        assert part.result.probabilities == pytest.approx(expected.result.probabilities, abs=1e-5)
