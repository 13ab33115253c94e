"""Evaluation rows from a decision log, the strong tier standing in for gold (``--teacher
strong``).

Labels come only from **shadow rows**: the strong tier's answer to a random sample of
cheap-final requests (``[shadow] fraction``). Escalated rows also carry both tiers, but they
were chosen *because* the cheap tier was unsure; labelling with them would fit temperatures and
accuracy thresholds to the hardest answers only. Importance weighting cannot repair that: the
gate selected them deterministically (probability 1 below the threshold, 0 above), and in
``escalate = "questions"`` mode a request with one escalated question is never shadowed, so some
cheap answers have no chance of a label at all. Escalated rows therefore get no label (they are
excluded from every accuracy, Brier, ECE and temperature figure); their cheap confidences still
count for ``--target-escalation``, which needs no labels and must see every gated question.

Rows are grouped back into requests by request id; the cascade is recomputed with the given
policy (``cascade.eval.decide``: the same routing functions), with no state (so no pre-routing
on token counts) and no token counts (costs are 0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult
from cascade.eval.data import Item
from cascade.eval.decide import ItemRow, rows_of
from cascade.eval.runner import Outputs, TierRun
from cascade.policy.model import Policy
from cascade.questions import answer_label
from cascade.schema import Question
from cascade.store import LogRow, read_rows


def log_rows(
    paths: Sequence[str | Path],
    policy: Policy,
    *,
    labelled_only: bool,
    since: float | None = None,
    tenant: str | None = None,
) -> list[ItemRow]:
    """``items.jsonl`` rows from decision logs: every row the cheap tier answered (escalated
    ones unlabelled), or with ``labelled_only`` the shadow rows alone."""
    # Rows stream past; each kept one is cut to what its request's item needs (the fit needs
    # every confidence at once, so these stay until the end: docs/evaluation.md has the size).
    requests: dict[str, list[KeptRow]] = defaultdict(list)
    for path in paths:
        for row in read_rows(path, since=since, tenant=tenant):
            if row.cheap is None or (labelled_only and not _labelled(row)):
                continue
            requests[f"{path}#{row.request_id}"].append(
                KeptRow(
                    row.question_id,
                    msgspec.convert(row.question, Question),
                    row.cheap.probabilities,
                    None if row.strong is None else row.strong.probabilities,
                    _labelled(row),
                )
            )
    out: list[ItemRow] = []
    model = policy.models.cascade[0] if policy.models.cascade else "jev-latest"
    for key, rows in requests.items():
        out += rows_of(policy, *_item(key, rows, model, policy))
    return out


class KeptRow(NamedTuple):
    """What a kept row gives its request's item."""

    question_id: str
    question: Question
    cheap: list[float]
    strong: list[float] | None
    labelled: bool


def _labelled(row: LogRow) -> bool:
    return row.shadow and row.strong is not None


def _item(key: str, rows: Iterable[KeptRow], model: str, policy: Policy) -> tuple[Item, Outputs]:
    questions: dict[str, Question] = {}
    cheap: dict[str, QuestionResult] = {}
    strong: dict[str, QuestionResult] = {}
    gold = {}
    for row in rows:  # the latest row wins if a request id repeats a question id
        question = row.question
        questions[row.question_id] = question
        cheap[row.question_id] = QuestionResult(type=question.type, probabilities=row.cheap)
        if row.strong is not None:
            strong[row.question_id] = QuestionResult(type=question.type, probabilities=row.strong)
            if row.labelled:
                gold[row.question_id] = answer_label(question, row.strong)
    call = EngineCall(state="", questions=questions, model=model, request_id=key)
    strong_run = _run("strong", strong) if policy.route.strong is not None else None
    return Item(id=key, call=call, gold=gold), Outputs(
        preview=None, cheap=_run("cheap", cheap), strong=strong_run
    )


def _run(slot: str, results: dict[str, QuestionResult]) -> TierRun | None:
    """A logged tier's answers as a tier run (None: it answered none of them)."""
    if not results:
        return None
    return TierRun(
        answer=EngineAnswer(model=slot, results=results, usage=EngineUsage(input_tokens=0))
    )
