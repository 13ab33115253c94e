"""A small generator of unlabelled requests in the evaluation format (varied states, choice,
score and noul questions), deterministic for a seed."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SUBJECTS = [
    "my order",
    "the invoice",
    "my account",
    "the app",
    "my card",
    "the delivery",
    "the subscription",
    "my password",
    "the refund",
    "the new printer",
]
PROBLEMS = [
    "arrived broken",
    "was charged twice",
    "does not load",
    "is late again",
    "was cancelled without notice",
    "shows the wrong amount",
    "keeps crashing",
    "never arrived",
    "was blocked",
    "cannot be reset",
]
MOODS = [
    "Please help.",
    "This is the third time I write!",
    "Thanks in advance.",
    "I am very frustrated.",
    "Call me back today.",
    "No rush.",
    "Fix it now or I leave.",
]
CHOICES: list[tuple[str, dict[str, str | None] | list[str]]] = [
    (
        "Which team should handle this?",
        {"billing": "payments, invoices", "technical": "bugs and outages", "sales": None},
    ),
    ("What does the customer want?", ["refund", "replacement", "information", "cancellation"]),
    (
        "Which product is concerned?",
        {
            "card": "debit or credit card",
            "app": "mobile app",
            "hardware": None,
            "plan": None,
            "other": "anything else",
        },
    ),
    ("Route this message.", {"urgent_queue": None, "normal_queue": None}),
]
SCORES = [
    ("How angry is the customer?", ["calm", "annoyed", "angry", "furious"]),
    ("How urgent is it?", ["low", "medium", "high"]),
]
NOULS = [
    ("Is the customer asking for money back?", None),
    ("Is it urgent?", {"true": "needs an answer today"}),
    ("Does the message mention a payment?", None),
]


def _state(rng: random.Random) -> str | dict[str, Any] | list[Any]:
    text = (
        " ".join(
            f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(PROBLEMS)}."
            for _ in range(rng.randint(1, 3))
        )
        + " "
        + rng.choice(MOODS)
    )
    kind = rng.random()
    if kind < 0.6:
        return text
    if kind < 0.8:
        return {"subject": rng.choice(SUBJECTS), "body": text, "priority": rng.randint(1, 5)}
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": part}
        for i, part in enumerate([text, "Could you tell me more?", rng.choice(MOODS)])
    ]


def _questions(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in range(rng.randint(1, 3)):
        kind = rng.choice(["choice", "choice", "score", "noul"])
        if kind == "choice":
            text, criteria = rng.choice(CHOICES)
            out[f"q{n}"] = {"type": "choice", "instructions": text, "criteria": criteria}
        elif kind == "score":
            text, levels = rng.choice(SCORES)
            out[f"q{n}"] = {"type": "score", "instructions": text, "criteria": levels}
        else:
            text, crit = rng.choice(NOULS)
            out[f"q{n}"] = {
                "type": "noul",
                "instructions": text,
                **({"criteria": crit} if crit else {}),
            }
    return out


def requests(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"id": f"gen-{seed}-{i}", "state": _state(rng), "questions": _questions(rng)}
        for i in range(n)
    ]


def write(path: Path, n: int, seed: int) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in requests(n, seed)), encoding="utf-8")
    return path
