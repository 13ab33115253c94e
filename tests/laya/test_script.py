"""``state_text``: the first ``MAX_CHARS`` characters of a state's text, without walking it all."""

from __future__ import annotations

from typing import Any

import pytest

from cascade.laya.script import MAX_CHARS, state_text


def whole_text(state: Any) -> str:
    """The whole state's text, joined the way Laya does it: the reference to cut."""
    if isinstance(state, str):
        return state
    if isinstance(state, dict):
        return " ".join(whole_text(v) for v in state.values())
    if isinstance(state, list):
        return " ".join(whole_text(v) for v in state)
    return "" if state is None or isinstance(state, bool) else str(state)


STATES = [
    "plain",
    "",
    None,
    True,
    12,
    1.5,
    [],
    {},
    [None, "a", False, [], {"k": "b"}, 3],
    {"a": ["x", ["y", None]], "b": {"c": 7, "d": ""}},
    "é" * (MAX_CHARS + 5),
    ["a" * (MAX_CHARS - 1), "bc", "d"],  # the cut falls on a separator, then inside a piece
    ["a" * MAX_CHARS, "b"],
    [{"n": i, "t": "word"} for i in range(2000)],
]


@pytest.mark.parametrize("state", STATES)
def test_state_text_is_the_start_of_the_whole_text(state: Any) -> None:
    assert state_text(state) == whole_text(state)[:MAX_CHARS]


class Unreadable:
    def __str__(self) -> str:
        raise AssertionError("read past the first MAX_CHARS characters")


def test_state_text_stops_once_it_has_enough() -> None:
    assert state_text(["a" * MAX_CHARS, Unreadable()]) == "a" * MAX_CHARS
