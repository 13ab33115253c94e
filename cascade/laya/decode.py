"""Laya's decoding maths (spec §2.7, §2.8, §3.1-§3.3), in the same float32 steps as Laya.

Two layers: unrounded probabilities for the engine (``probabilities``, ``act_probability``), and
``laya_answer``/``laya_usage``/``apply_min_confidence``, which build Laya's exact rounded answer
dicts; parity tests and goldens use those, and the gateway may reuse the confidence helpers
(``entropy_confidence``, ``answer_confidence``, ``jev_confidence``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cascade.laya.questions import Prepared
from cascade.laya.rows import Row
from cascade.schema import QuestionType

DECIMALS = 4


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


def entropy_confidence(p: np.ndarray) -> float:
    """``1 - H(p)/ln k`` clamped to [0, 1]; 1.0 below two options (Laya's ``confidence``)."""
    k = len(p)
    if k < 2:
        return 1.0
    ent = -float((p * np.log(np.clip(p, 1e-12, 1.0))).sum())
    return min(1.0, max(0.0, 1.0 - ent / math.log(k)))


def answer_confidence(p: np.ndarray) -> float:
    """``max(p)`` clamped to [0, 1]: the calibrated number (Laya's ``answer_confidence``)."""
    return min(1.0, max(0.0, float(np.max(p)))) if len(p) else 1.0


def jev_confidence(qtype: QuestionType, p: list[float]) -> float | None:
    """Jev's ``confidence`` formula (Laya's ``x_jev_confidence``); None for noul."""
    n = len(p)
    if qtype == "noul" or n == 0:
        return None
    if n == 1:
        return 1.0
    total = sum(p)
    p = [v / total for v in p] if total else [1.0 / n] * n
    if qtype == "choice":
        return (max(p) - 1.0 / n) / (1.0 - 1.0 / n)
    mode = max(range(n), key=p.__getitem__)
    spread = sum(v * abs(i - mode) for i, v in enumerate(p))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return max(0.0, 1.0 - spread / uniform)


def laya_answer(q: Prepared, p: np.ndarray, act: float) -> dict[str, Any]:
    """Laya's answer dict for one question (all numbers rounded to 4 decimals)."""
    extras = {
        "answer_confidence": round(answer_confidence(p), DECIMALS),
        "action": {"act_probability": round(act, DECIMALS)},
    }
    if q.type == "noul":
        p_true = float(p[1])
        return {
            "type": "noul",
            "noul": round(p_true, DECIMALS),
            "confidence": round(max(p_true, 1.0 - p_true), DECIMALS),
            **extras,
        }
    probs = {k: round(float(v), DECIMALS) for k, v in zip(q.keys, p, strict=True)}
    confidence = round(entropy_confidence(p), DECIMALS)
    if q.type == "choice":
        return {
            "type": "choice",
            "choice": q.keys[int(p.argmax())],
            "probabilities": probs,
            "confidence": confidence,
            **extras,
        }
    return {
        "type": "score",
        "score": round(float((np.arange(len(p)) * p).sum()), DECIMALS),
        "legend": dict(zip(q.keys, q.legend or [], strict=True)),
        "probabilities": probs,
        "confidence": confidence,
        **extras,
    }


def laya_usage(questions: list[Prepared], rows: list[Row], state_tokens: int) -> dict[str, Any]:
    """Laya's ``usage`` block for one state."""
    dropped = [state_tokens - r.state_used for r in rows]
    usage: dict[str, Any] = {
        "input_tokens": sum(len(r.ids) for r in rows),
        "output_tokens": 0,
        "state_tokens": state_tokens,
        "state_tokens_dropped": max(dropped, default=0),
        "truncated": max(dropped, default=0) > 0,
        "truncated_questions": [q.qid for q, d in zip(questions, dropped, strict=True) if d > 0],
    }
    collapsed = option_spans(questions, rows)
    if collapsed:
        usage["options"] = collapsed
    return usage


def option_spans(questions: list[Prepared], rows: list[Row]) -> dict[str, dict[str, Any]]:
    """``usage.options``: only the questions whose capped option spans collapsed."""
    return {
        q.qid: {
            "total": len(r.markers),
            "distinct": r.distinct,
            "tokens_per_option": r.tokens_per_option,
        }
        for q, r in zip(questions, rows, strict=True)
        if r.collapsed
    }


def option_bucket(qtype: str, k: int) -> str:
    size = "2" if k <= 2 else "3-5" if k <= 5 else "6-10" if k <= 10 else "11+"
    return f"{qtype}:{size}"


def apply_min_confidence(
    answers: dict[str, dict[str, Any]], min_confidence: float | dict[str, float] | None
) -> None:
    """Laya's abstention gate on rounded ``answer_confidence``; writes nothing when unset."""
    if min_confidence is None:
        return
    for a in answers.values():
        if isinstance(min_confidence, dict):
            k = len(a["probabilities"]) if "probabilities" in a else 2
            bucket = option_bucket(a["type"], k)
            threshold = min_confidence.get(bucket, min_confidence.get("default", 0.0))
        else:
            threshold = min_confidence
        low = a["answer_confidence"] < threshold
        if low:
            a["low_confidence"] = True
        a["abstention"] = "abstained" if low else "passed"
        a["abstention_threshold"] = float(threshold)
