"""What the commands that measure print for machines: ``--json`` summaries, rounded."""

from __future__ import annotations

from typing import Any


def rounded(value: Any, digits: int = 4) -> Any:
    """``value`` with every float rounded to ``digits`` places (summaries, not files)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return value
