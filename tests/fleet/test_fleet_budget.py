"""The strong tier's budget held across three real gateway processes on one real Redis.

One replica takes 60 % of the traffic, 40 % of it pre-routed strong (questions of 60 options:
no threshold can keep them cheap), so it alone is over the budget whatever it cuts. Paced per
replica, the others each stop at the budget and the fleet misses it; paced on the fleet's
counts, the others cut deeper and the fleet holds it. Both on the same three processes (a
reload switches the scope), each measured from the answers over the last window."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.fleet.replicas import drive, policy_file, replicas, share
from tests.servers import run_redis

BUDGET = 0.3
WINDOW_S = 20.0
ADMIN = {"authorization": "Bearer admin-key"}


def control(scope: str, url: str) -> str:
    return (
        f"max_strong_share = {BUDGET}\nwindow_s = {WINDOW_S}\ncapacity = false\n"
        f'scope = "{scope}"\nurl = "{url}"\nsync_s = 0.5\n'
    )


def test_the_fleet_holds_the_budget_that_replicas_paced_alone_miss(tmp_path: Path) -> None:
    with run_redis() as (url, _):
        policy = policy_file(tmp_path / "policy.toml", control("replica", url))
        with replicas(policy, 3, env={"CASCADE_ADMIN_KEYS": "admin-key"}) as fleet:
            urls = [r.url for r in fleet]

            def measured() -> float:
                start = time.monotonic()
                answers = asyncio.run(
                    drive(
                        urls,
                        seconds=2 * WINDOW_S,
                        weights=[0.6, 0.2, 0.2],
                        wide=[0.4, 0.0, 0.0],
                        clients=3,
                    )
                )
                return share(answers, start + WINDOW_S)

            alone = measured()
            policy_file(policy, control("fleet", url))
            for u in urls:
                assert httpx.post(u + "/admin/reload", headers=ADMIN, timeout=60).status_code == 200
            together = measured()
            seen = [httpx.get(u + "/admin/control", headers=ADMIN).json() for u in urls]
    assert alone > BUDGET + 0.02, alone
    assert together <= BUDGET + 0.02, together
    assert all(s["scope"] == "fleet" and s["pacing"] == "fleet" for s in seen)
    assert all(s["fleet"]["connected"] for s in seen)
