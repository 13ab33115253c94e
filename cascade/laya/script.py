"""Dominant-script detection over a state, for sending non-Latin text to ``multilingual``.

A simplification of Laya's ``lang.analyse`` (spec §3.5): letters in the first 4,000 characters
of the state's text (dict keys ignored) are counted per Unicode script. The state needs the
multilingual checkpoint when its dominant script is not Latin, or when non-Latin letters make up
at least 20 % (10 % with at least 10 such letters). Laya's Latin-language stop-word rules
(French or German text to multilingual) are not reproduced: Latin text stays on the default.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from typing import Any

MAX_CHARS = 4000

_RANGES = sorted(
    [
        (0x0041, 0x024F, "latin"),
        (0x1E00, 0x1EFF, "latin"),
        (0x2C60, 0x2C7F, "latin"),
        (0xA720, 0xA7FF, "latin"),
        (0xFF21, 0xFF5A, "latin"),
        (0x0370, 0x03FF, "greek"),
        (0x1F00, 0x1FFF, "greek"),
        (0x0400, 0x052F, "cyrillic"),
        (0x2DE0, 0x2DFF, "cyrillic"),
        (0xA640, 0xA69F, "cyrillic"),
        (0x0530, 0x058F, "armenian"),
        (0x0590, 0x05FF, "hebrew"),
        (0x0600, 0x06FF, "arabic"),
        (0x0750, 0x077F, "arabic"),
        (0x08A0, 0x08FF, "arabic"),
        (0xFB50, 0xFDFF, "arabic"),
        (0xFE70, 0xFEFF, "arabic"),
        (0x0900, 0x097F, "devanagari"),
        (0x0980, 0x09FF, "bengali"),
        (0x0A00, 0x0A7F, "gurmukhi"),
        (0x0A80, 0x0AFF, "gujarati"),
        (0x0B00, 0x0B7F, "oriya"),
        (0x0B80, 0x0BFF, "tamil"),
        (0x0C00, 0x0C7F, "telugu"),
        (0x0C80, 0x0CFF, "kannada"),
        (0x0D00, 0x0D7F, "malayalam"),
        (0x0D80, 0x0DFF, "sinhala"),
        (0x0E00, 0x0E7F, "thai"),
        (0x0E80, 0x0EFF, "lao"),
        (0x0F00, 0x0FFF, "tibetan"),
        (0x1000, 0x109F, "myanmar"),
        (0x10A0, 0x10FF, "georgian"),
        (0x1100, 0x11FF, "hangul"),
        (0x3130, 0x318F, "hangul"),
        (0xAC00, 0xD7AF, "hangul"),
        (0x1200, 0x139F, "ethiopic"),
        (0x1780, 0x17FF, "khmer"),
        (0x3040, 0x30FF, "kana"),
        (0x3400, 0x4DBF, "han"),
        (0x4E00, 0x9FFF, "han"),
        (0xF900, 0xFAFF, "han"),
        (0x20000, 0x2FFFF, "han"),
    ]
)
_STARTS = [r[0] for r in _RANGES]


def script_of(ch: str) -> str:
    """The script of one letter; ``other`` for letters outside the listed ranges."""
    code = ord(ch)
    i = bisect.bisect_right(_STARTS, code) - 1
    if i >= 0 and code <= _RANGES[i][1]:
        return _RANGES[i][2]
    return "other"


def _pieces(state: Any) -> Iterator[str]:
    """The state's text in order: its values (strings and numbers), siblings joined by spaces."""
    if isinstance(state, dict | list):
        for i, value in enumerate(state.values() if isinstance(state, dict) else state):
            if i:
                yield " "
            yield from _pieces(value)
    elif isinstance(state, str):
        yield state
    elif state is not None and not isinstance(state, bool):
        yield str(state)


def state_text(state: Any) -> str:
    """The first ``MAX_CHARS`` characters of a state's text, dict keys left out.

    The walk stops once that many characters are collected, however large the state.
    """
    pieces, size = [], 0
    for piece in _pieces(state):
        pieces.append(piece)
        size += len(piece)
        if size >= MAX_CHARS:
            break
    return "".join(pieces)[:MAX_CHARS]


def letter_counts(text: str) -> Counter[str]:
    return Counter(script_of(ch) for ch in text[:MAX_CHARS] if ch.isalpha())


def dominant_script(state: Any) -> tuple[str, bool]:
    """``(script, needs_multilingual)``; the script is ``unknown`` when there are no letters."""
    counts = letter_counts(state_text(state))
    total = sum(counts.values())
    if not total:
        return "unknown", False
    script = counts.most_common(1)[0][0]
    non_latin = total - counts["latin"]
    share = non_latin / total
    return script, script != "latin" or share >= 0.2 or (share >= 0.1 and non_latin >= 10)
