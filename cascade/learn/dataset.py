"""Training examples: the rows Laya's engine would serve, paired with the teacher's answers.

Each (item, question) the teacher answered becomes one ``Example`` when the student checkpoint
can read it: the row comes from ``Previewer.plan`` (the engine's own rows, truncation,
templates and ``option_order``), the teacher's probabilities are put in the row's slot order,
and the temperature is the one the engine applies to that row (type x option bucket), so the
loss compares exactly the distribution cascade would serve. Rows Laya cannot build (option
markers that do not fit) and states in a script the checkpoint does not read are skipped and
counted.

The held-back split is by item (all questions of a state fall on one side), decided by the
item's content hash alone: the same data always gives the same split, whatever the seed.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable

import msgspec

from cascade.errors import ValidationFailed
from cascade.eval.data import Item
from cascade.laya.preview import Previewer
from cascade.laya.rows import Row


class Example(msgspec.Struct, frozen=True, kw_only=True):
    key: str  # the item's content key
    qid: str
    row: Row
    state_tokens: int  # the whole state's tokens (the row keeps ``row.state_used``)
    temperature: float
    teacher: list[float]  # the teacher's probabilities in the row's slot order
    weight: float


class Dataset(msgspec.Struct, kw_only=True):
    train: list[Example]
    held_back: list[Example]
    skipped: dict[str, int]  # reason -> questions left out

    def describe(self) -> dict[str, object]:
        return {
            "train_rows": len(self.train),
            "held_back_rows": len(self.held_back),
            "skipped": dict(self.skipped),
        }


def is_held_back(key: str, fraction: float) -> bool:
    """The item's side of the split: a fixed function of its content hash."""
    draw = int(hashlib.sha256(b"held-back:" + key.encode()).hexdigest()[:12], 16)
    return draw < fraction * 16**12


def slot_order(probabilities: list[float], order: list[int] | None) -> list[float]:
    """Caller-order probabilities in the row's slot order (slot s shows option order[s])."""
    return probabilities if order is None else [probabilities[i] for i in order]


def build(
    previewer: Previewer, checkpoint: str, items: Iterable[Item], held_back: float
) -> Dataset:
    """Examples of every teacher-answered question ``checkpoint`` can read, split by item."""
    cfg = previewer.checkpoints[checkpoint].cfg
    train: list[Example] = []
    back: list[Example] = []
    skipped: Counter[str] = Counter()
    for item in items:
        side = is_held_back(item.key, held_back)
        for qid, probabilities in (item.teacher or {}).items():
            if qid not in item.call.questions:
                skipped["no_question"] += 1
                continue
            try:
                plan = previewer.plan(item.only(qid), checkpoint=checkpoint)
            except ValidationFailed:
                skipped["does_not_fit"] += 1
                continue
            (question,), (row,) = plan.questions, plan.rows
            if not plan.readable:
                skipped["script"] += 1
                continue
            if len(probabilities) != len(row.markers):
                skipped["option_mismatch"] += 1
                continue
            example = Example(
                key=item.key,
                qid=qid,
                row=row,
                state_tokens=plan.state_tokens,
                temperature=cfg.temperature_for(row.qtype, len(row.markers)),
                teacher=slot_order(probabilities, question.order),
                weight=item.weight,
            )
            (back if side else train).append(example)
    return Dataset(train=train, held_back=back, skipped=dict(skipped))
