"""The ranges of numeric flags, as ``argparse`` types: a value outside one is a usage error
(exit status 2) naming the flag, before the command does anything."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _bounded(
    kind: type[int] | type[float], name: str, ok: Callable[[float], bool]
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}") from None
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}")
        return value

    parse.__name__ = name  # argparse names the type in its own messages
    return parse


count = _bounded(int, "an integer >= 1", lambda v: v >= 1)
natural = _bounded(int, "an integer >= 0", lambda v: v >= 0)
seconds = _bounded(float, "a finite number of seconds > 0", lambda v: v > 0)
positive = _bounded(float, "a finite number > 0", lambda v: v > 0)
share = _bounded(float, "a share in [0, 1]", lambda v: 0 <= v <= 1)
