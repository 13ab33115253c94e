"""The cache in the gateway, with fake tiers: hits, partial hits, single flight, failures,
tenants, bypass, policy changes, joint tiers."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from cascade import metrics
from cascade.cache import parts
from cascade.cache.decision import cache_control, combined
from cascade.errors import EngineUnavailable
from tests.cache.helpers import (
    QUESTIONS,
    Counting,
    call,
    cheap_policy,
    gateway,
    joint_policy,
    per_question,
)


def body(outcome) -> dict:  # noqa: ANN001
    """The response without the timings, which measure each request, and the cached tokens,
    which say where its tokens came from."""
    data = msgspec.to_builtins(outcome.response)
    data["x_cascade"].pop("timings_s")
    data["usage"].pop("cached_tokens", None)
    return data


def test_a_repeat_is_answered_from_the_cache_with_the_same_answer() -> None:
    laya = Counting("laya", per_question, independent=True)
    gw = gateway(cheap_policy(), laya)

    async def run() -> None:
        first = await gw.systemone(call())
        second = await gw.systemone(call())
        assert laya.asked == [list(QUESTIONS)]
        assert first.headers["x-cascade-cache"] == "miss"
        assert second.headers["x-cascade-cache"] == "hit"
        assert body(first) == body(second)
        assert first.cached_tokens == 0 and "cached_tokens" not in msgspec.to_builtins(
            first.response.usage
        )
        tokens = first.response.usage.input_tokens
        assert second.cached_tokens == second.response.usage.cached_tokens == tokens
        assert second.response.x_cascade is not None
        assert set(second.response.x_cascade["timings_s"]) == set(
            first.response.x_cascade["timings_s"]
        )

    asyncio.run(run())


def test_a_partly_cached_request_runs_only_its_new_questions() -> None:
    laya = Counting("laya", per_question, independent=True)
    gw = gateway(cheap_policy(), laya)
    partial = metrics.CACHE_PARTIAL.labels(tier="laya")._value.get()

    async def run() -> None:
        await gw.systemone(call(team=QUESTIONS["team"], long=QUESTIONS["urgent"]))
        outcome = await gw.systemone(call(**QUESTIONS, long=QUESTIONS["urgent"]))
        assert laya.asked[1] == ["urgent", "anger"]  # team and long were cached
        assert outcome.headers["x-cascade-cache"] == "partial"
        fresh = await gateway(
            cheap_policy(), Counting("laya", per_question, independent=True)
        ).systemone(call(**QUESTIONS, long=QUESTIONS["urgent"]))
        assert body(outcome) == body(fresh)  # usage (tokens, truncation) included
        rows = per_question(call(team=QUESTIONS["team"], long=QUESTIONS["urgent"])).usage
        assert outcome.cached_tokens == outcome.response.usage.cached_tokens == rows.input_tokens

    asyncio.run(run())
    assert metrics.CACHE_PARTIAL.labels(tier="laya")._value.get() == partial + 1


def test_join_of_split_is_the_answer() -> None:
    answer = per_question(call(**QUESTIONS, long=QUESTIONS["urgent"]))
    split = parts.split(answer)
    assert split is not None
    assert parts.join(call(**QUESTIONS, long=QUESTIONS["urgent"]), split) == answer
    no_rows = msgspec.structs.replace(
        answer, usage=msgspec.structs.replace(answer.usage, row_tokens={})
    )
    assert parts.split(no_rows) is None


def test_concurrent_identical_requests_call_the_tier_once() -> None:
    gate = asyncio.Event()
    laya = Counting("laya", per_question, independent=True, gate=gate)
    gw = gateway(cheap_policy(), laya)

    async def run() -> list:
        tasks = [asyncio.create_task(gw.systemone(call())) for _ in range(8)]
        while not laya.asked:
            await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*tasks)

    outcomes = asyncio.run(run())
    assert len(laya.asked) == 1
    assert len({msgspec.json.encode(body(o)) for o in outcomes}) == 1


def test_a_failure_wakes_the_waiters_with_it_and_is_not_cached() -> None:
    gate = asyncio.Event()
    failing = {"on": True}

    def handler(c):  # noqa: ANN001, ANN202
        if failing["on"]:
            raise EngineUnavailable("down")
        return per_question(c)

    laya = Counting("laya", handler, independent=True, gate=gate)
    gw = gateway(cheap_policy(), laya)

    async def run() -> None:
        tasks = [asyncio.create_task(gw.systemone(call())) for _ in range(4)]
        while not laya.asked:
            await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, EngineUnavailable) for r in results)
        assert len(laya.asked) == 1 and len(gw.cache.flights) == 0
        failing["on"] = False
        outcome = await gw.systemone(call())
        assert outcome.headers["x-cascade-cache"] == "miss" and len(laya.asked) == 2

    asyncio.run(run())


def test_a_cancelled_leader_lets_a_waiter_compute() -> None:
    gate = asyncio.Event()
    laya = Counting("laya", per_question, independent=True, gate=gate)
    gw = gateway(cheap_policy(), laya)

    async def run() -> None:
        leader = asyncio.create_task(gw.systemone(call()))
        while not laya.asked:
            await asyncio.sleep(0)
        waiter = asyncio.create_task(gw.systemone(call()))
        for _ in range(20):
            await asyncio.sleep(0)
        leader.cancel()
        for _ in range(20):
            await asyncio.sleep(0)
        gate.set()
        outcome = await waiter
        assert len(laya.asked) == 2 and outcome.response.answers

    asyncio.run(run())


def test_tenants_are_isolated_unless_the_cache_is_shared() -> None:
    async def run(shared: bool) -> list[str]:
        laya = Counting("laya", per_question, independent=True)
        gw = gateway(cheap_policy(shared=shared), laya)
        seen = []
        for tenant in ("acme", "globex", "acme"):
            outcome = await gw.decide(call(), tenant=tenant)
            seen.append(outcome.headers["x-cascade-cache"])
        return seen

    assert asyncio.run(run(False)) == ["miss", "miss", "hit"]
    assert asyncio.run(run(True)) == ["miss", "hit", "hit"]


def test_no_cache_computes_and_stores_no_store_neither_reads_nor_writes() -> None:
    laya = Counting("laya", per_question, independent=True)
    gw = gateway(cheap_policy(), laya)

    async def run() -> None:
        first = await gw.systemone(call(), cache="no-store")
        assert first.headers["x-cascade-cache"] == "bypass"
        assert (await gw.systemone(call())).headers["x-cascade-cache"] == "miss"
        assert (await gw.systemone(call(), cache="no-cache")).headers["x-cascade-cache"] == (
            "bypass"
        )
        assert (await gw.systemone(call())).headers["x-cascade-cache"] == "hit"
        assert len(laya.asked) == 3
        other = call("another state")
        await gw.systemone(other, cache="no-cache")
        assert (await gw.systemone(other)).headers["x-cascade-cache"] == "hit"

    asyncio.run(run())


def test_a_changed_policy_misses() -> None:
    """A reload swapping the policy (any change: a new policy hash) never serves old answers."""
    laya = Counting("laya", per_question, independent=True)
    gw = gateway(cheap_policy(), laya)

    async def run() -> None:
        await gw.systemone(call())
        gw.policy = msgspec.structs.replace(gw.policy, description="reloaded")
        assert (await gw.systemone(call())).headers["x-cascade-cache"] == "miss"
        assert (await gw.systemone(call())).headers["x-cascade-cache"] == "hit"

    asyncio.run(run())
    assert len(laya.asked) == 2


def test_a_joint_tier_is_keyed_by_the_whole_question_set() -> None:
    upstream = Counting("upstream", per_question, independent=False)
    gw = gateway(joint_policy(), upstream)

    async def run() -> None:
        await gw.systemone(call())
        fewer = {k: v for k, v in QUESTIONS.items() if k != "anger"}
        assert (await gw.systemone(call(**fewer))).headers["x-cascade-cache"] == "miss"
        assert (await gw.systemone(call())).headers["x-cascade-cache"] == "hit"
        assert upstream.asked == [list(QUESTIONS), list(fewer)]

    asyncio.run(run())


def test_without_a_cache_there_is_no_header() -> None:
    from cascade.gateway import Gateway

    laya = Counting("laya", per_question, independent=True)
    outcome = asyncio.run(Gateway(cheap_policy(enabled=False), {"laya": laya}).systemone(call()))
    assert "x-cascade-cache" not in outcome.headers


@pytest.mark.parametrize(
    ("header", "control"),
    [
        ("", "use"),
        ("max-age=0", "no-cache"),
        ('Max-Age = "0"', "no-cache"),
        ("max-age=00, private", "no-cache"),
        ("max-age=60", "use"),
        ("max-age=x", "use"),
        ("no-cache", "no-cache"),
        ("No-Cache, max-age=0", "no-cache"),
        ("no-store", "no-store"),
        ("no-cache, no-store", "no-store"),
        ("max-age=0, no-store", "no-store"),
    ],
)
def test_cache_control_header(header: str, control: str) -> None:
    assert cache_control(header) == control


def test_combined_outcomes_of_a_batch() -> None:
    assert combined(["hit", "hit"]) == "hit"
    assert combined(["miss", "miss"]) == "miss"
    assert combined(["hit", "miss"]) == "partial"
