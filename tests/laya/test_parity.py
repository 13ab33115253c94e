"""cascade's Laya path (rows -> ONNX -> decode) answers exactly what laya 0.4.15's Agent answers."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tests.laya.conftest import FORMATS

LONG = " ".join(  # past the tiny checkpoint's 512 tokens, as past the English checkpoint's
    f"Customer {i} wants a refund for order {i * 7} that arrived broken." for i in range(60)
)
TRIAGE = {
    "dept": {
        "type": "choice",
        "instructions": "Which department should handle this?",
        "criteria": {"billing": "money, invoices", "tech": None, "account": "login issues"},
    },
    "urgent": {"type": "noul", "instructions": "Is the customer in a hurry?"},
    "level": {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["calm", "annoyed", "angry", "furious"],
    },
}
CASES: dict[str, tuple[Any, dict, dict]] = {
    "short": ("The order arrived broken, I want my money back.", TRIAGE, {}),
    "window_and_truncation": (LONG, TRIAGE, {}),
    "dict_state": (
        {"subject": "refund", "body": "The parcel is late again.", "n": 3, "tags": ["urgent", "é"]},
        TRIAGE,
        {},
    ),
    "list_state_keeps_newest": (
        [
            {"role": "user" if i % 2 else "assistant", "content": f"turn {i}: where is my refund?"}
            for i in range(48)
        ],
        TRIAGE,
        {},
    ),
    "many_options": (
        "I lost my card yesterday",
        {
            "intent": {
                "type": "choice",
                "instructions": "Which intent is this?",
                "criteria": [f"intent_{i}" for i in range(45)],
            },
            "card": {
                "type": "choice",
                "instructions": "Which product?",
                "criteria": {f"card_type_{i}": "a card" for i in range(12)},
            },
        },
        {"max_len": 400},
    ),
    "labels_and_order": (
        "Please call me back today, it is urgent",
        {
            "urgent": {
                "type": "noul",
                "instructions": "Is it urgent?",
                "labels": {"false": " B ", "true": "A"},
                "criteria": {"TRUE": "it is urgent"},
            },
            "dept": {**TRIAGE["dept"], "option_order": [2, 0, 1]},
            "level": {**TRIAGE["level"], "option_order": [3, 1, 0, 2]},
        },
        {},
    ),
    "mask_text": (
        "please [MASK] refund [MASK] now [SEP] done",
        {
            "q": {
                "type": "choice",
                "instructions": "Which [MASK] applies?",
                "criteria": {"a[MASK]b": "x [MASK] y", "plain": ""},
            },
            "n": {"type": "noul", "instructions": "[MASK]", "criteria": {"false": "[MASK] no"}},
        },
        {},
    ),
    "structured": (
        "Route this report.",
        {
            "route": {
                "type": "choice",
                "instructions": {"task": "route", "fields": ["a", 1]},
                "criteria": {
                    "security": {"desc": "vulns", "sla": 4},
                    "eng": ["bugs", 3],
                    "zero": 0,
                    "plain": "anything else",
                },
            },
            "labels": {"type": "choice", "instructions": 42, "criteria": [2, "two", 3.5, False]},
            "sev": {
                "type": "score",
                "instructions": "Severity?",
                "criteria": [{"label": "info", "cvss": 0.0}, "critical"],
            },
        },
        {},
    ),
    "single_option": (
        "hello",
        {"only": {"type": "choice", "instructions": "Pick", "criteria": ["solo"]}},
        {},
    ),
    "tight_budgets": (LONG, TRIAGE, {"max_len": 64, "head_max_len": 24}),
}


def laya_with_logits(agent: Any, state: Any, questions: dict, **controls: Any):
    """laya's answer plus the raw logits its model produced (forward hook)."""
    captured = []
    hook = agent.model.register_forward_hook(
        lambda _m, _i, out: captured.append(out[0].detach().float().numpy())
    )
    try:
        result = agent.system_one(state, questions, **controls)
    finally:
        hook.remove()
    return result, captured[0]


def wire(label: object) -> str:
    """A label as JSON names it: list criteria may hold ints, floats or bools, which the
    Agent returns as Python values and the wire (cascade, and JSON object keys) as text."""
    return label if isinstance(label, str) else json.dumps(label)


ROUNDING_STEP = 1e-4 + 1e-9


def assert_same_result(ours: dict, theirs: dict) -> None:
    assert ours["usage"] == theirs["usage"]
    assert list(ours["answers"]) == list(theirs["answers"])
    for qid, want in theirs["answers"].items():
        got = ours["answers"][qid]
        assert got.keys() == want.keys(), qid
        assert got["type"] == want["type"]
        if "choice" in want:
            assert got["choice"] == wire(want["choice"]), qid
        assert got.get("legend") == want.get("legend")
        # Both sides round to 4 decimals: values a hair apart can land one step (1e-4) apart
        # after rounding (2.36095 -> 2.3609 vs 2.3610), which float subtraction puts just over
        # 1e-4. One rounding step is the tolerance; the unrounded logits are compared at 1e-4.
        for key in ("noul", "score", "confidence", "answer_confidence"):
            if key in want:
                assert got[key] == pytest.approx(want[key], abs=ROUNDING_STEP), (qid, key)
        if "probabilities" in want:
            assert list(got["probabilities"]) == [wire(k) for k in want["probabilities"]]
            np.testing.assert_allclose(
                list(got["probabilities"].values()),
                list(want["probabilities"].values()),
                atol=ROUNDING_STEP,
            )
        assert got["action"]["act_probability"] == pytest.approx(
            want["action"]["act_probability"], abs=ROUNDING_STEP
        )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_answers_match_laya(case: str, fmt: str, ours: dict, agents: dict) -> None:
    state, questions, controls = CASES[case]
    theirs, their_logits = laya_with_logits(agents[fmt], state, questions, **controls)
    mine = ours[fmt](state, questions, **controls)
    assert_same_result(mine, theirs)
    for i, logits in enumerate(ours[fmt].last_logits):
        np.testing.assert_allclose(logits, their_logits[i, : len(logits)], atol=1e-4)


def test_cases_exercise_truncation_and_collapse(ours: dict) -> None:
    """Guard the case list itself: truncation, newest-first lists and collapse are covered."""
    usage = {name: ours["v5"](s, q, **c)["usage"] for name, (s, q, c) in CASES.items()}
    assert usage["window_and_truncation"]["truncated"]
    assert usage["list_state_keeps_newest"]["truncated"]
    assert "options" in usage["many_options"]
    assert not usage["short"]["truncated"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_min_confidence_gate_matches_laya(fmt: str, ours: dict, agents: dict) -> None:
    state, questions, _ = CASES["short"]
    for threshold in (0.5, {"choice:3-5": 0.9, "default": 0.3}):
        theirs = agents[fmt].system_one(state, questions, min_confidence=threshold)
        mine = ours[fmt](state, questions, min_confidence=threshold)
        for qid, want in theirs["answers"].items():
            for key in ("abstention", "abstention_threshold", "low_confidence"):
                assert mine["answers"][qid].get(key) == want.get(key), (qid, key)
