"""Held-back figures: agreement with the teacher, mean KL, and the share kept on the cheap tier.

``agreement``: the weighted share of questions whose served argmax equals the teacher's.
``mean_kl``: the weighted mean of KL(teacher || student) over each question's options, in nats.
``kept_on_cheap``: the weighted share the policy's cascade (the gateway's own flow,
``cascade.policy.flow.decide``, its tiers answered with the row's preview, the student's
probabilities and a canned strong answer) would answer on the cheap tier.
Routing is judged one question at a time, which is exact for ``escalate = "questions"`` (the
default); with ``escalate = "request"`` it is an upper bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import numpy as np
import torch

from cascade.calls import CallPreview, EngineAnswer, EngineUsage, QuestionResult, RowPreview
from cascade.eval.data import Item
from cascade.learn.dataset import Example
from cascade.learn.student import Student
from cascade.policy.canned import certain
from cascade.policy.flow import Ask, Preview, Reply, decide, run
from cascade.policy.model import Policy


class Figures(msgspec.Struct, frozen=True, kw_only=True):
    questions: int
    agreement: float
    mean_kl: float
    kept_on_cheap: float


@torch.no_grad()
def predict(
    student: Student, examples: Sequence[Example], batch_size: int = 64
) -> list[np.ndarray]:
    """The student's served probabilities per example, in slot order."""
    out: list[np.ndarray] = []
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        logp, _ = student.log_probs(batch)
        probs = logp.exp().cpu().numpy()
        out += [probs[i, : len(e.row.markers)] for i, e in enumerate(batch)]
    return out


def kl(teacher: Sequence[float], student: np.ndarray) -> float:
    p = np.asarray(teacher, dtype=np.float64)
    q = np.clip(student.astype(np.float64), 1e-12, None)
    nz = p > 0
    return float(np.sum(p[nz] * (np.log(p[nz]) - np.log(q[nz]))))


def kept_on_cheap(
    policy: Policy, checkpoint: str, item: Item, example: Example, probs: np.ndarray, model: str
) -> bool:
    """Whether the policy answers this question on the cheap tier, given these probabilities."""
    call = msgspec.structs.replace(item.only(example.qid), model=model)
    row = example.row
    preview = CallPreview(
        checkpoint=checkpoint,
        script="latin",
        readable=True,
        rows={
            example.qid: RowPreview(
                n_options=len(row.markers),
                row_tokens=len(row.ids),
                state_tokens=example.state_tokens,
                state_tokens_dropped=example.state_tokens - row.state_used,
                collapsed=row.collapsed,
            )
        },
    )
    question = call.questions[example.qid]
    result = QuestionResult(
        type=question.type, probabilities=_unslot(probs, question.option_order).tolist()
    )
    truncated = [example.qid] if example.state_tokens > row.state_used else []
    answer = EngineAnswer(
        model=checkpoint,
        results={example.qid: result},
        usage=EngineUsage(input_tokens=len(row.ids), truncated_questions=truncated),
    )

    def reply(ask: Ask) -> Reply:
        if isinstance(ask, Preview):
            return preview
        return answer if ask.tier == policy.route.cheap else certain(ask.call, ask.tier)

    decision = run(decide(policy, call, previews=True), reply)
    return decision.tiers[example.qid] == policy.route.cheap


def _unslot(probs: np.ndarray, order: list[int] | None) -> np.ndarray:
    """Slot-order probabilities back in the caller's order (slot s shows option order[s])."""
    if order is None:
        return probs
    caller = np.empty_like(probs)
    caller[np.asarray(order, dtype=int)] = probs
    return caller


def figures(
    examples: Sequence[Example],
    probs: Sequence[np.ndarray],
    policy: Policy,
    checkpoint: str,
    items: Mapping[str, Item],
    model: str,
) -> Figures:
    weights = np.array([e.weight for e in examples], dtype=np.float64)
    total = float(weights.sum()) or 1.0
    agree = [
        int(np.argmax(p)) == int(np.argmax(e.teacher)) for e, p in zip(examples, probs, strict=True)
    ]
    kls = [kl(e.teacher, p) for e, p in zip(examples, probs, strict=True)]
    kept = [
        kept_on_cheap(policy, checkpoint, items[e.key], e, p, model)
        for e, p in zip(examples, probs, strict=True)
    ]
    return Figures(
        questions=len(examples),
        agreement=float(weights @ np.array(agree, dtype=np.float64)) / total,
        mean_kl=float(weights @ np.array(kls)) / total,
        kept_on_cheap=float(weights @ np.array(kept, dtype=np.float64)) / total,
    )
