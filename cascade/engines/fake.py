"""A fake tier for tests and the dry docker-compose profile: a handler function, no model.

``deterministic_answer`` is the default handler. Like jevcompat's mock, it derives each
question's logits from a stable hash of (state, instructions, option) only, never of the question
id, the other questions or their order, so renaming an id or adding a question leaves every
other answer unchanged, and repeated calls agree exactly.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.schema import ChoiceQuestion, NoulQuestion, Question

Handler = Callable[[EngineCall], EngineAnswer | Awaitable[EngineAnswer]]

FAKE_MODEL = "cascade-fake"
_LOGIT_SCALE = 3.0  # logits in [-3, 3]: clearly non-uniform, never degenerate


def _logit(*parts: Any) -> float:
    canonical = msgspec.json.encode(parts, order="sorted")
    word = int.from_bytes(hashlib.sha256(canonical).digest()[:8], "big")
    return (word / 2**64 * 2 - 1) * _LOGIT_SCALE


def _softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


def _result(state: Any, question: Question) -> QuestionResult:
    ins = question.instructions
    if isinstance(question, NoulQuestion):
        p = 1 / (1 + math.exp(-_logit(state, ins, question.criteria)))
        return QuestionResult(type="noul", probabilities=[1 - p, p])
    if isinstance(question, ChoiceQuestion):
        options = question.criteria
        if isinstance(options, dict):
            logits = [_logit(state, ins, name, text) for name, text in options.items()]
        else:
            logits = [_logit(state, ins, str(label), None) for label in options]
        return QuestionResult(type="choice", probabilities=_softmax(logits))
    levels = question.criteria
    logits = [_logit(state, ins, i, level) for i, level in enumerate(levels)]
    return QuestionResult(type="score", probabilities=_softmax(logits))


def deterministic_answer(call: EngineCall) -> EngineAnswer:
    """Stable, non-uniform answers for ``call`` (see the module docstring).

    ``input_tokens`` is a rough count (4 bytes a token) of the state and the questions.
    """
    state_bytes = len(msgspec.json.encode(call.state))
    question_bytes = sum(len(msgspec.json.encode(q)) for q in call.questions.values())
    return EngineAnswer(
        model=FAKE_MODEL,
        results={qid: _result(call.state, q) for qid, q in call.questions.items()},
        usage=EngineUsage(
            input_tokens=(state_bytes + question_bytes) // 4, state_tokens=state_bytes // 4
        ),
    )


class FakeEngine:
    """An ``Engine`` whose answers come from ``handler``, sync or async.

    Exceptions from ``handler`` escape unchanged, so tests can raise ``cascade.errors`` types to
    exercise the gateway's error paths. ``calls`` counts answered and failed calls alike.
    """

    def __init__(self, name: str, handler: Handler = deterministic_answer) -> None:
        self.name = name
        self.calls = 0
        self._handler = handler
        self._ready = False

    async def start(self) -> None:
        self._ready = True

    async def answer(self, call: EngineCall) -> EngineAnswer:
        self.calls += 1
        result = self._handler(call)
        if inspect.isawaitable(result):
            return await result
        return result

    def ready(self) -> bool:
        return self._ready

    def health(self) -> dict[str, Any]:
        return {"engine": "fake", "ready": self._ready, "calls": self.calls}

    async def aclose(self) -> None:
        self._ready = False
