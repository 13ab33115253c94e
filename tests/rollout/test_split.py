"""The split (``cascade.rollout.split``): the candidate's share of request ids within sampling
error, the same arm for the same key every time, sticky per tenant, and a raised share keeping
every key that was on the candidate."""

from __future__ import annotations

import math

from cascade.rollout.split import arm_of


def test_the_share_holds_within_three_sigma_over_2000_request_ids() -> None:
    n, share = 2000, 0.2
    hits = sum(arm_of("acme", f"req-{i}", share=share) == "candidate" for i in range(n))
    assert abs(hits - n * share) <= 3 * math.sqrt(n * share * (1 - share)), hits


def test_a_request_id_gets_one_arm_every_time_and_tenants_split_apart() -> None:
    first = [arm_of("acme", f"r{i}", share=0.5) for i in range(200)]
    assert first == [arm_of("acme", f"r{i}", share=0.5) for i in range(200)]
    assert first != [arm_of("other", f"r{i}", share=0.5) for i in range(200)]


def test_sticky_per_tenant_ignores_the_request_id() -> None:
    arms = {
        t: {arm_of(t, f"r{i}", share=0.5, sticky="tenant") for i in range(50)} for t in "abcdefgh"
    }
    assert all(len(found) == 1 for found in arms.values())
    assert {next(iter(found)) for found in arms.values()} == {"current", "candidate"}


def test_a_larger_share_keeps_the_candidates_keys() -> None:
    small = {i for i in range(1000) if arm_of("", f"r{i}", share=0.1) == "candidate"}
    large = {i for i in range(1000) if arm_of("", f"r{i}", share=0.5) == "candidate"}
    assert small and small < large
    assert all(arm_of("", f"r{i}", share=1.0) == "candidate" for i in range(100))
