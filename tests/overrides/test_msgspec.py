"""cascade.overrides.msgspec against the installed msgspec's own messages: each reading is pinned
to the words msgspec writes today, so a change in its format fails here, not on a request."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from cascade.overrides import msgspec as messages


class _Question(msgspec.Struct):
    id: str
    text: Annotated[str, msgspec.Meta(max_length=3)] = ""


class _Request(msgspec.Struct):
    questions: list[_Question]
    extra: dict[str, int] = {}


def _message(data: object) -> str:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert(data, _Request)
    return str(caught.value)


def test_a_validation_error_splits_into_its_reason_and_where() -> None:
    message = _message({"questions": [{"id": "a"}, {"id": 1}]})
    assert message == "Expected `str`, got `int` - at `$.questions[1].id`"
    assert messages.split(message) == ("Expected `str`, got `int`", ["questions", 1, "id"])


def test_an_elided_index_is_left_out_and_the_top_has_no_path() -> None:
    assert messages.split(_message({"questions": [], "extra": {"k": "v"}})) == (
        "Expected `int`, got `str`",
        ["extra"],
    )
    assert messages.split(_message([])) == ("Expected `object`, got `array`", [])


def test_a_missing_field_is_named() -> None:
    reason, loc = messages.split(_message({"questions": [{}]}))
    assert (reason, loc) == ("Object missing required field `id`", ["questions", 0])
    assert messages.missing_field(reason) == "id"
    assert messages.missing_field("Expected `str`, got `int`") is None


def test_a_string_over_its_max_length_is_told_apart() -> None:
    reason, loc = messages.split(_message({"questions": [{"id": "a", "text": "abcd"}]}))
    assert messages.too_long(reason) and loc == ["questions", 0, "text"]
    assert not messages.too_long(messages.split(_message({"questions": 3}))[0])


@pytest.mark.parametrize(("data", "at"), [(b'{"a": 1,]', 8), (b'{"a": ', 6), (b"", 0)])
def test_a_decode_error_points_at_its_byte(data: bytes, at: int) -> None:
    with pytest.raises(msgspec.DecodeError) as caught:
        msgspec.json.decode(data)
    assert messages.error_byte(caught.value, len(data)) == at


def test_a_number_outside_its_declared_bounds_is_told_apart() -> None:
    for tp, value in (
        (Annotated[int, msgspec.Meta(ge=1)], 0),
        (Annotated[float, msgspec.Meta(gt=0.0, lt=1.0)], 1.0),
        (Annotated[float, msgspec.Meta(ge=-0.5)], -1e9),
    ):
        with pytest.raises(msgspec.ValidationError) as caught:
            msgspec.convert(value, tp)
        assert messages.out_of_bounds(str(caught.value)), str(caught.value)
    assert not messages.out_of_bounds("Expected `int`, got `str`")
    assert not messages.out_of_bounds(
        messages.split(_message({"questions": [{"id": "a", "text": "abcd"}]}))[0]
    )  # a string's length is not a number's bounds
