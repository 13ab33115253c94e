"""One engine call under its tier's timeout and breaker, with the tier's metrics.

The gateway makes every tier call through ``call_tier`` (the decision cache through the
gateway's). In-process tiers have no whole-call timeout: their admission refuses what would
wait past the request's deadline and accepted work runs to the end; remote tiers get
``timeout_s``. The breaker counts errors, timeouts and unavailability; client errors, overload
and cancellations only free a half-open probe slot; ``record=False`` (shadow calls) leaves it
alone: optional traffic says nothing real requests should act on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall, capped
from cascade.engines.base import Engine
from cascade.errors import (
    BreakerOpen,
    ClientError,
    EngineError,
    EngineFailed,
    EngineTimeout,
    Overloaded,
)
from cascade.policy.breaker import CircuitBreaker
from cascade.policy.model import Tier, UpstreamTier
from cascade.tracing import active as tracing

log = logging.getLogger("cascade")


async def call_tier(
    tier: str,
    engine: Engine,
    config: Tier,
    breaker: CircuitBreaker,
    call: EngineCall,
    timings: dict[str, float],
    *,
    clock: Callable[[], float],
    record: bool = True,
) -> EngineAnswer:
    """``engine``'s answer to ``call``; its time is added to ``timings[tier]``."""
    now = clock()
    if record and not breaker.allow(now):
        metrics.TIER_DURATION.labels(tier=tier, outcome="breaker_open").observe(0)
        raise BreakerOpen(f"{tier} circuit open", retry_after=breaker.retry_after(now))
    remote = isinstance(config, UpstreamTier)
    started = time.perf_counter()
    outcome = "error"
    try:
        call = capped(call, config.timeout_s, tier, remote)
        async with asyncio.timeout(config.timeout_s if remote else None):
            answer = await engine.answer(call)
        outcome = "ok"
    except asyncio.CancelledError:
        outcome = "cancelled"  # the caller went away: says nothing about the tier
        raise
    except TimeoutError as exc:
        outcome = "timeout"
        raise EngineTimeout(f"{tier} did not answer within {config.timeout_s} s") from exc
    except (ClientError, Overloaded) as exc:
        outcome = "client_error" if isinstance(exc, ClientError) else "overloaded"
        raise
    except EngineError:
        raise
    except Exception as exc:  # a bug in an engine is a tier failure, never a 500
        log.exception("tier %s raised an unexpected error", tier)
        raise EngineFailed(f"{tier} failed ({type(exc).__name__})") from exc
    finally:
        elapsed = time.perf_counter() - started
        timings[tier] = timings.get(tier, 0.0) + elapsed
        metrics.TIER_DURATION.labels(tier=tier, outcome=outcome).observe(
            elapsed, tracing.exemplar()
        )
        if record and outcome in ("client_error", "overloaded", "cancelled"):
            breaker.release(clock())  # no verdict on the tier's health
        elif record:
            breaker.record(clock(), outcome == "ok")
    metrics.TOKENS.labels(tier=tier).inc(answer.usage.input_tokens)
    return answer
