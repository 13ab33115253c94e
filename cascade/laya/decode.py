"""Laya's decoding maths (spec §2.7, §2.8, §3.2), in the same float32 steps as Laya.

The engine's output is unrounded: per-question probabilities in the caller's order, the act
head's probability, and ``usage``. Rounding, confidences and answer shapes are the gateway's
(``cascade.answers``), shared by every tier; the parity tests run Laya's answers through that
same code.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cascade.calls import EngineUsage, QuestionResult
from cascade.laya.config import LayaConfig
from cascade.laya.questions import Prepared
from cascade.laya.rows import Row
from cascade.schema import OptionSpans

# (logits of the row's real options, act logits, the row's pooled vector when the export has one)
RowOut = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def probabilities(logits: np.ndarray, temperature: float, order: list[int] | None) -> np.ndarray:
    """softmax(logits / T) over one row's real option slots, back in the caller's order."""
    z = np.asarray(logits, dtype=np.float32) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if order is None:
        return p
    caller = np.empty_like(p)
    caller[np.asarray(order, dtype=int)] = p  # slot s shows option order[s]
    return caller


def act_probability(act_logits: np.ndarray) -> float:
    """softmax(act_logits)[0], Laya's ``action.act_probability`` (about 1.0 in practice)."""
    a = np.asarray(act_logits, dtype=np.float32)
    e = np.exp(a - a.max())
    return float(e[0] / e.sum())


def results(
    questions: Sequence[Prepared],
    rows: Sequence[Row],
    outputs: Sequence[RowOut],
    cfg: LayaConfig,
) -> dict[str, QuestionResult]:
    """Each question's probabilities (temperature of its type x option bucket applied)."""
    out = {}
    for q, row, (logits, act, pooled) in zip(questions, rows, outputs, strict=True):
        p = probabilities(logits, cfg.temperature_for(row.qtype, len(row.markers)), q.order)
        out[q.qid] = QuestionResult(
            type=q.type,
            probabilities=p.tolist(),
            act_probability=act_probability(act),
            vector=None if pooled is None else pooled.astype("<f2").tobytes(),
        )
    return out


def usage(questions: Sequence[Prepared], rows: Sequence[Row], state_tokens: int) -> EngineUsage:
    """Laya's ``usage`` for one state: tokens over every row, the state's truncation per row,
    and ``options`` for questions whose capped option spans collapsed."""
    dropped = {q.qid: state_tokens - r.state_used for q, r in zip(questions, rows, strict=True)}
    return EngineUsage(
        input_tokens=sum(len(r.ids) for r in rows),
        state_tokens=state_tokens if rows else None,  # Laya: absent when there are no questions
        state_tokens_dropped=max(dropped.values(), default=0),
        truncated_questions=[qid for qid, d in dropped.items() if d > 0],
        dropped={qid: d for qid, d in dropped.items() if d > 0},
        row_tokens={q.qid: len(r.ids) for q, r in zip(questions, rows, strict=True)},
        options={
            q.qid: OptionSpans(
                total=len(r.markers), distinct=r.distinct, tokens_per_option=r.tokens_per_option
            )
            for q, r in zip(questions, rows, strict=True)
            if r.collapsed
        },
    )
