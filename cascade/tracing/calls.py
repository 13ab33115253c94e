"""A tier call inside its span: ``decide TIER``, a client span when the tier is another
process (its ``traceparent`` makes that process's server span a child of this one)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from cascade.tracing import active, attributes

if TYPE_CHECKING:
    from cascade.calls import EngineAnswer, EngineCall


async def traced(
    tier: str, slot: str, provider: str, call: EngineCall, answering: Awaitable[EngineAnswer]
) -> EngineAnswer:
    """``answering`` awaited in a span of ``tier`` (``slot``: cheap, strong or shadow;
    ``provider``: laya, clef or upstream), or bare while tracing is off."""
    if active.current() is None:
        return await answering
    with active.span(f"{attributes.OPERATION} {tier}", remote=provider == "upstream"):
        active.annotate(lambda: attributes.tier_call(tier, slot, call, provider))
        answer = await answering
        active.annotate(lambda: attributes.tier_answer(answer))
        return answer
