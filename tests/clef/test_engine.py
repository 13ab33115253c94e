"""``ClefEngine`` on a tiny release: answers, usage, batching, overload, memory budget."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cascade.calls import EngineCall
from cascade.engines.base import Engine
from cascade.engines.clef import ClefEngine
from cascade.errors import EngineUnavailable, Overloaded, PayloadTooLarge, TokensExceeded
from tests.clef.clef_cases import CASES, LONG_STATE, QUESTIONS, questions
from tests.clef.test_parity import _png


def call(case: dict[str, Any], **kwargs: Any) -> EngineCall:
    return EngineCall(state=case["state"], questions=questions(case), model="clef-flash", **kwargs)


def with_engine(release: Path, body: Callable[[ClefEngine], Awaitable[Any]], **kwargs: Any) -> Any:
    async def main() -> Any:
        engine = ClefEngine("clef", release, device="cpu", **kwargs)
        await engine.start()
        try:
            return await body(engine)
        finally:
            await engine.aclose()

    return asyncio.run(main())


def test_answers_in_callers_order_with_exact_usage(tiny_release):
    async def body(engine: ClefEngine):
        request = call(CASES["object-state"])
        return engine.count_tokens(request), await engine.answer(request), engine.health()

    counted, answer, health = with_engine(tiny_release, body)
    assert isinstance(ClefEngine("clef", tiny_release), Engine)
    assert answer.model == "tiny"
    assert list(answer.results) == list(QUESTIONS)
    team, urgent, severity = answer.results.values()
    assert (team.type, urgent.type, severity.type) == ("choice", "noul", "score")
    assert [len(r.probabilities) for r in answer.results.values()] == [3, 2, 3]
    assert all(sum(r.probabilities) == pytest.approx(1.0) for r in answer.results.values())
    assert answer.usage.input_tokens == counted
    assert answer.usage.state_tokens_dropped == 0
    assert answer.usage.truncated_questions == []
    assert health["ready"] and health["device"] == "cpu" and health["queue_depth"] == 0


def test_concurrent_calls_are_batched_and_equal_single_answers(tiny_release):
    calls = [call(case) for case in CASES.values()]

    async def body(engine: ClefEngine):
        alone = [await engine.answer(c) for c in calls]
        batches_before = engine._batcher.batches
        together = await asyncio.gather(*(engine.answer(c) for c in calls))
        return alone, together, engine._batcher.batches - batches_before

    alone, together, batches = with_engine(tiny_release, body, max_wait_s=0.2)
    assert batches < len(calls)
    for a, b in zip(alone, together, strict=True):
        for qa, qb in zip(a.results.values(), b.results.values(), strict=True):
            assert qb.probabilities == pytest.approx(qa.probabilities, abs=1e-4)
        assert a.usage == b.usage


def test_full_queue_is_refused_with_retry_after(tiny_release):
    async def body(engine: ClefEngine):
        first = asyncio.ensure_future(engine.answer(call(CASES["string-state"])))
        await asyncio.sleep(0.05)  # the first call waits in the queue for max_wait_s
        with pytest.raises(Overloaded) as caught:
            await engine.answer(call(CASES["array-state"]))
        await first
        return caught.value

    refused = with_engine(tiny_release, body, max_queue=1, max_wait_s=0.5)
    assert refused.retry_after and refused.retry_after > 0


def test_over_the_memory_budget_is_a_clear_413(tiny_release):
    async def body(engine: ClefEngine):
        with pytest.raises(PayloadTooLarge, match="budget is 100000 bytes"):
            await engine.answer(call(CASES["string-state"]))

    with_engine(tiny_release, body, memory_budget_bytes=100_000)


def test_overlong_policies(tiny_release):
    long_call = call({"state": LONG_STATE * 3, "questions": QUESTIONS})

    async def reject(engine: ClefEngine):
        with pytest.raises(TokensExceeded, match="limit is 1000"):
            await engine.answer(long_call)
        return engine.count_tokens(long_call)

    async def truncate(engine: ClefEngine):
        return await engine.answer(long_call)

    full = with_engine(tiny_release, reject, max_length=1000)
    answer = with_engine(tiny_release, truncate, max_length=1000, overlong="truncate")
    assert answer.usage.input_tokens == 1000
    assert answer.usage.state_tokens_dropped == full - 1000 > 0
    assert answer.usage.truncated_questions == list(QUESTIONS)


def test_image_tokens_count_and_change_the_answer(tiny_release):
    _, image = _png(3, (64, 48))
    plain, pictured = call(CASES["string-state"]), call(CASES["string-state"], images=[image])

    async def body(engine: ClefEngine):
        return (
            engine.count_tokens(pictured),
            await engine.answer(pictured),
            await engine.answer(plain),
        )

    counted, with_image, without = with_engine(tiny_release, body)
    assert with_image.usage.input_tokens == counted > without.usage.input_tokens
    assert with_image.results["team"].probabilities != without.results["team"].probabilities


def test_not_started_and_demo(tiny_release):
    engine = ClefEngine("clef", tiny_release, device="cpu", demo=True)
    with pytest.raises(EngineUnavailable):
        engine.count_tokens(call(CASES["string-state"]))

    async def body(engine: ClefEngine):
        return engine.health()

    health = with_engine(tiny_release, body, demo=True)
    assert health["demo"] is True


def test_modules_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
        "import cascade.engines.clef, cascade.cli.bench, cascade.cli.make_tiny, "
        "cascade.clef.runner, cascade.bench.clef, cascade.clef.media"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_predicted_wait_is_the_capacity_signal_of_live_control(tiny_release):
    from cascade.engines.base import Waiting

    async def body(engine: ClefEngine):
        idle = engine.expected_wait()
        first = asyncio.ensure_future(engine.answer(call(CASES["string-state"])))
        await asyncio.sleep(0.05)  # waits in the queue for max_wait_s
        busy = engine.expected_wait()
        await first
        return idle, busy

    assert isinstance(ClefEngine("clef", tiny_release), Waiting)
    assert ClefEngine("clef", tiny_release).expected_wait() == 0.0  # not started
    idle, busy = with_engine(tiny_release, body, max_wait_s=0.5)
    assert idle == 0.0 and busy > 0.0
