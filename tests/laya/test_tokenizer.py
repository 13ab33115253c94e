"""Long texts are encoded in pieces (bounded memory) with exactly the ids of the whole text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer

from cascade.laya.tokenizer import LayaTokenizer, cuts_safely, pieces

ALPHABET = [
    *"abcdefghij",
    *"ABC",
    *"0123456789",
    *"éüßçñ",
    "e\u0301",
    "日本語",
    "한국",
    "🙂",
    "👍🏽",
    *".,;:!?'\"-()[]{}<>/\\@#$%&*_+=|~",
    "'s",
    "'ll",
    "[SEP]",
    "[MASK]",
    "[CLS]x",
    "\u00b2",
    "\u0663",
    " ",
    " ",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\t",
    " \n ",
    "\u00a0",
    "\u3000",
    "\u200b",
]


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def _tokenizer(tiny_dirs: dict[str, Path]) -> LayaTokenizer:
    return LayaTokenizer(next(iter(tiny_dirs.values())) / "tokenizer")


def test_pieces_cover_the_text_and_cut_only_between_words() -> None:
    rng = random.Random(1)
    for _ in range(200):
        text = _text(rng, rng.randrange(1, 400))
        cut = list(pieces(text, size=8))
        assert "".join(cut) == text
        for piece in cut[1:]:
            assert piece[0] == " " and piece[1].isalnum()
        for before in cut[:-1]:
            assert before[-1].isalnum()


@pytest.mark.parametrize("space_runs", [False, True])
def test_pieces_encode_to_the_whole_texts_ids(tiny_dirs: dict[str, Path], space_runs: bool) -> None:
    tok = _tokenizer(tiny_dirs)
    raw = Tokenizer.from_str(tok._tok.to_str())  # the whole text in one call
    if space_runs:  # as ModernBERT's tokenizer has: runs of 2 to 24 spaces as added tokens
        raw.add_tokens([AddedToken(" " * n, normalized=True) for n in range(2, 25)])
        assert cuts_safely(raw)
    rng = random.Random(2)
    for _ in range(300):
        text = tok.strip_mask(_text(rng, rng.randrange(1, 600)))
        whole = raw.encode(text, add_special_tokens=False).ids
        cut = [
            i
            for p in pieces(text, size=rng.choice((2, 5, 16, 64)))
            for i in raw.encode(p, add_special_tokens=False).ids
        ]
        assert cut == whole, text


def test_a_long_state_is_encoded_in_pieces_with_the_same_ids(tiny_dirs: dict[str, Path]) -> None:
    tok = _tokenizer(tiny_dirs)
    assert tok._in_pieces
    text = tok.strip_mask(_text(random.Random(3), 160_000))  # about 200,000 characters
    assert len(text) > 2 * 65536 and len(list(pieces(text))) >= 3
    assert tok.encode(text) == tok._tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(
    ("change", "safe"),
    [
        ({}, True),
        ({"added": AddedToken("[X]", rstrip=True)}, True),  # strips towards a bracket only
        ({"added": AddedToken("x]", lstrip=True)}, False),  # could eat the space before it
        ({"added": AddedToken("[X", rstrip=True)}, False),  # could eat the cut space
        ({"added": AddedToken("[Y]y", rstrip=True)}, False),
        ({"added": AddedToken("a b")}, False),  # could match across the cut
        ({"added": AddedToken("   ", normalized=True)}, True),  # ModernBERT's space runs
        ({"added": AddedToken("  ", lstrip=True)}, False),
        (
            {
                "pre": {
                    "type": "Metaspace",
                    "replacement": "▁",
                    "prepend_scheme": "always",
                    "split": True,
                }
            },
            False,
        ),
        (
            {
                "pre": {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": False,
                }
            },
            False,
        ),
        ({"norm": {"type": "NFKC"}}, False),
    ],
)
def test_only_tokenizers_whose_cuts_are_safe_are_cut(
    tiny_dirs: dict[str, Path], change: dict, safe: bool
) -> None:
    raw = Tokenizer.from_file(str(next(iter(tiny_dirs.values())) / "tokenizer" / "tokenizer.json"))
    if "added" in change:
        raw.add_tokens([change["added"]])
    spec = json.loads(raw.to_str())
    if "pre" in change:
        spec["pre_tokenizer"] = change["pre"]
    if "norm" in change:
        spec["normalizer"] = change["norm"]
    assert cuts_safely(Tokenizer.from_str(json.dumps(spec))) is safe
