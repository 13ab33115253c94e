"""Validate and render questions exactly as Laya does (spec §2.1, §2.2).

``prepare(questions)`` turns the wire Structs into ``Prepared`` questions: the head instruction
text, the rendered option texts in option-index (caller) order, the answer keys and the optional
``option_order``. Laya-specific mistakes raise ``ValidationFailed`` at
``["questions", qid, field]`` (422).

One deliberate difference from Laya: a missing or blank ``instructions`` (Laya: 422) uses the
question id as the instruction text, as Clef does; jevcompat's SHOULD accepts a noul without one.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from cascade.errors import ValidationFailed
from cascade.laya.config import QTYPES
from cascade.questions import render_text
from cascade.schema import ChoiceQuestion, NoulQuestion, OptionKey, Question, QuestionType

NOUL_FALSE = "no, the statement does not hold"
NOUL_TRUE = "yes, the statement holds"


class Prepared(msgspec.Struct, frozen=True, kw_only=True):
    """One question ready for row assembly and decoding."""

    qid: str
    type: QuestionType
    instructions: str  # rendered (non-string instructions become JSON text)
    options: list[str]  # option texts in the caller's option order
    keys: list[OptionKey]  # choice: labels; score: level indices as str; noul: ["false", "true"]
    legend: list[str] | None = None  # score: each level rendered
    order: list[int] | None = None  # option_order: slot s shows option order[s]

    @property
    def qtype(self) -> int:
        return QTYPES[self.type]


def _blank(value: Any) -> bool:
    return value is None or value == ""


def _instructions(qid: str, ins: Any) -> str:
    if ins is None or (isinstance(ins, str) and not ins.strip()) or ins in ({}, []):
        return qid  # deliberate: Laya answers 422 here, cascade uses the id as Clef does
    return ins if isinstance(ins, str) else json.dumps(ins, ensure_ascii=False)


def _choice(qid: str, q: ChoiceQuestion) -> tuple[list[str], list[OptionKey]]:
    crit = q.criteria
    if not crit:
        raise ValidationFailed.at(
            ["questions", qid, "criteria"],
            f"question {qid!r}: a choice question needs at least one criterion",
        )
    if isinstance(crit, dict):
        pairs: list[tuple[OptionKey, Any]] = list(crit.items())
    else:
        seen: dict[OptionKey, int] = {}
        for i, label in enumerate(crit):
            if label in seen:  # 1, 1.0 and True are one key, as in a Python dict
                raise ValidationFailed.at(
                    ["questions", qid, "criteria", i],
                    f"question {qid!r}: choice label {i} ({label!r}) repeats label {seen[label]}",
                )
            seen[label] = i
        pairs = [(label, None) for label in crit]
    options = [str(k) if _blank(v) else f"{k}: {render_text(v)}" for k, v in pairs]
    return options, [k for k, _ in pairs]


def _noul(qid: str, q: NoulQuestion) -> list[str]:
    crit: dict[str, Any] = {}
    for key, value in (q.criteria or {}).items():
        crit[str(key).lower()] = value
    if not set(crit) <= {"true", "false"}:
        raise ValidationFailed.at(
            ["questions", qid, "criteria"],
            f"question {qid!r}: a noul question takes 'criteria' keyed only 'true'/'false', "
            f"got {sorted(crit)}; set 'labels' to change the option words",
        )
    false_label, true_label = "false", "true"
    if q.labels is not None:
        false_label, true_label = q.labels.false.strip(), q.labels.true.strip()
        if not false_label or not true_label or false_label == true_label:
            raise ValidationFailed.at(
                ["questions", qid, "labels"],
                "noul labels must map exactly 'false' and 'true' to distinct non-empty strings",
            )
    f_text, t_text = crit.get("false"), crit.get("true")
    return [
        f"{false_label}: " + (NOUL_FALSE if _blank(f_text) else render_text(f_text)),
        f"{true_label}: " + (NOUL_TRUE if _blank(t_text) else render_text(t_text)),
    ]


def prepare_one(qid: str, q: Question) -> Prepared:
    """Validate one question and render its texts; raises ``ValidationFailed``."""
    if not qid.strip():
        raise ValidationFailed.at(["questions", qid], "question id must be a non-empty string")
    legend = None
    kind = q.type
    if isinstance(q, ChoiceQuestion):
        options, keys = _choice(qid, q)
    elif isinstance(q, NoulQuestion):
        options, keys = _noul(qid, q), ["false", "true"]
    else:
        if not q.criteria:
            raise ValidationFailed.at(
                ["questions", qid, "criteria"],
                f"question {qid!r}: a score question needs at least one level",
            )
        legend = [render_text(c) for c in q.criteria]
        options = [f"level {i}: {text}" for i, text in enumerate(legend)]
        keys = [str(i) for i in range(len(options))]
    order = q.option_order
    if order is not None and sorted(order) != list(range(len(options))):
        raise ValidationFailed.at(
            ["questions", qid, "option_order"],
            f"question {qid!r}: 'option_order' must be a permutation of range({len(options)}) "
            f"-- one slot per option, each option once -- got {order!r}",
        )
    return Prepared(
        qid=qid,
        type=kind,
        instructions=_instructions(qid, q.instructions),
        options=options,
        keys=keys,
        legend=legend,
        order=order,
    )


def prepare(questions: dict[str, Question]) -> list[Prepared]:
    """Every question of a request, in request order."""
    return [prepare_one(qid, q) for qid, q in questions.items()]
