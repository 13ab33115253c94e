"""A reject-mode Clef prompt refuses a state far over its limit without tokenizing all of it."""

from __future__ import annotations

import pytest

from cascade.clef.prompt import PromptEncoder
from cascade.errors import TokensExceeded
from cascade.schema import NoulQuestion


def test_a_million_character_state_is_refused_from_its_prefix() -> None:
    seen: list[int] = []

    def tokenize_batch(texts: list[str]) -> list[list[int]]:
        seen.extend(len(t) for t in texts)
        return [[0] * ((len(t) + 3) // 4) for t in texts]  # four characters a token

    encoder = PromptEncoder(tokenize_batch, max_length=16384, overlong="reject")
    seen.clear()
    with pytest.raises(TokensExceeded, match="already hold 32768 tokens; limit is 16384"):
        encoder.encode("word " * 200_000, {"q": NoulQuestion(instructions="?")})
    assert max(seen) <= 8 * 16384  # never the whole 1,000,000 characters
    # A state that fits is still encoded exactly, and truncate mode still counts every token.
    assert encoder.encode("word " * 10_000, {"q": NoulQuestion()}).state_tokens == 12_500
    truncating = PromptEncoder(tokenize_batch, max_length=16384, overlong="truncate")
    assert truncating.encode("word " * 200_000, {"q": NoulQuestion()}).state_dropped > 0
