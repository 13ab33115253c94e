"""Canned tier replies for the offline tools that run the flow where a tier does not run."""

from __future__ import annotations

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.questions import n_options


def certain(call: EngineCall, model: str) -> EngineAnswer:
    """An answer to every question of ``call`` that is certain of its first option: no
    confidence gate escalates it, and it uses no tokens."""
    results = {
        qid: QuestionResult(type=q.type, probabilities=[1.0] + [0.0] * (n_options(q) - 1))
        for qid, q in call.questions.items()
    }
    return EngineAnswer(model=model, results=results, usage=EngineUsage(input_tokens=0))
