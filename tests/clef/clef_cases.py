"""Request bodies shared by the Clef parity tests (reference dict form)."""

from __future__ import annotations

from typing import Any

import msgspec

from cascade.schema import Question

LONG_STATE = " ".join(f"ticket {i}: the customer says the invoice is wrong" for i in range(60))

QUESTIONS: dict[str, dict[str, Any]] = {
    "team": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {
            "technical": "Bugs and outages",
            "billing": "Payments and refunds",
            "account": None,
        },
    },
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "severity": {
        "type": "score",
        "instructions": {"ask": "how bad", "scale": [0, 1, 2]},
        "criteria": ["minor", "major", {"level": "critical", "pages": True}],
    },
}

CASES: dict[str, dict[str, Any]] = {
    "string-state": {"state": "I was charged twice for my subscription.", "questions": QUESTIONS},
    "object-state": {
        "state": {"z": 2, "a": "café & <x>", "n": [1.0, 1e16, 1e-05, None]},
        "questions": QUESTIONS,
    },
    "array-state": {
        "state": [{"from": "user", "text": "refund please"}, 3, True],
        "questions": QUESTIONS,
    },
    "no-descriptions": {
        "state": "The app crashes on start.",
        "questions": {
            "kind": {"type": "choice", "criteria": {"bug": None, "question": None, "praise": None}},
            "spam": {"type": "noul", "criteria": {"true": None, "false": None}},
            "stars": {"type": "score", "instructions": "", "criteria": ["one", "two", "three"]},
        },
    },
    "many-options": {
        "state": LONG_STATE,
        "questions": {
            "label": {
                "type": "choice",
                "instructions": "Pick the closest label.",
                "criteria": {f"label_{i:02d}": f"description number {i}" for i in range(40)},
            },
            "refund": {"type": "noul", "criteria": {"true": "A refund is requested."}},
        },
    },
}


def request(case: dict[str, Any]) -> dict[str, Any]:
    return {"model": "clef-flash", **case}


def questions(case: dict[str, Any]) -> dict[str, Question]:
    """The same questions as cascade's wire structs."""
    return msgspec.convert(case["questions"], dict[str, Question])
