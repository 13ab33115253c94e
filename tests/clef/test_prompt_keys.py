"""Clef's prompt reads noul criteria keyed in any case, as Laya does."""

from __future__ import annotations

from cascade.clef.prompt import NOUL_DEFAULTS, question_options
from cascade.schema import NoulQuestion


def test_noul_criteria_keys_in_any_case() -> None:
    for true, false in (("true", "false"), ("True", "False"), ("TRUE", "FALSE")):
        question = NoulQuestion(
            instructions="Urgent?", criteria={true: "needs action today", false: "can wait"}
        )
        options, order = question_options(question)
        assert options == [("true", "needs action today"), ("false", "can wait")], true
        assert order == [1, 0]
    only_true = NoulQuestion(instructions="Urgent?", criteria={"True": "today"})
    assert question_options(only_true)[0] == [("true", "today"), ("false", NOUL_DEFAULTS["false"])]
