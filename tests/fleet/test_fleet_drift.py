"""The fleet's confidence drift across three real gateway processes on one real Redis.

The calibration snapshot is fitted on the cheap tier's confidences of yes/no questions (probed
through the cheap-only model), then every replica reloads it. Two replicas then see yes/no
questions, the third questions with other options, whose confidences sit lower: each replica's
own PSI finds the bad pod, and the fleet's PSI, the same on every replica, is the PSI of the
counts all three added to Redis."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
import redis as redis_sync
from prometheus_client.parser import text_string_to_metric_families

from cascade.control.drift import histogram, psi
from cascade.fleet.histograms import PREFIX
from cascade.policy.calibration import CalibrationFile, CalibrationStamp, write_calibration
from cascade.policy.model import Bands, TypeBands
from tests.fleet.replicas import policy_file, replicas
from tests.servers import run_redis

ADMIN = {"authorization": "Bearer admin-key"}
YES_NO = ["yes", "no"]
SHIFTED = ["o1", "o2"]  # the tiny demo model is less sure of these
EACH = 150  # questions each replica answers after the reload


def control(url: str) -> str:
    return (
        f'capacity = false\nscope = "fleet"\nurl = "{url}"\nsync_s = 0.3\n\n'
        "[drift]\nwindow_s = 600.0\nmin_count = 50\nbins = 10\n"
    )


async def ask(url: str, criteria: Sequence[str], n: int, model: str, seed: int) -> list[float]:
    """``n`` one-question requests; the answer confidence of each answered one."""
    rng = random.Random(seed)
    out: list[float] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(n):
            body = {
                "model": model,
                "state": f"item {rng.random()}",
                "questions": {"q": {"type": "choice", "criteria": list(criteria)}},
            }
            r = await http.post(url + "/v1/systemone", json=body)
            if r.status_code == 200:
                out.append(r.json()["answers"]["q"]["answer_confidence"])
    return out


def gauges(url: str) -> tuple[float | None, float | None]:
    """This replica's own and the fleet's PSI of choice:2, from its /metrics."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", headers=ADMIN).text):
        for sample in family.samples:
            if sample.labels == {"type": "choice", "band": "2"}:
                found[sample.name] = sample.value
    return found.get("cascade_confidence_psi"), found.get("cascade_fleet_confidence_psi")


def added(url: str, bins: int) -> list[int]:
    """The counts of choice:2 every replica added to the fleet's histograms, read from Redis."""
    redis = redis_sync.Redis.from_url(url)
    merged = [0] * bins
    try:
        for key in redis.scan_iter(PREFIX + "*"):
            for name, value in redis.hgetall(key).items():
                cell, _, at = name.decode().rpartition("|")
                assert cell == "choice:2"
                merged[int(at)] += int(value)
    finally:
        redis.close()
    return merged


def test_the_fleet_psi_is_the_merged_counts_and_the_same_on_every_replica(tmp_path: Path) -> None:
    with run_redis() as (url, _):
        policy = policy_file(tmp_path / "policy.toml", control(url))
        with replicas(policy, 3, env={"CASCADE_ADMIN_KEYS": "admin-key"}) as fleet:
            urls = [r.url for r in fleet]
            probed = asyncio.run(ask(urls[0], YES_NO, 400, "laya", seed=1))
            reference = histogram(probed, 10)
            write_calibration(
                tmp_path / "cal.toml",
                CalibrationFile(
                    stamp=CalibrationStamp(
                        checkpoints={},
                        items=len(probed),
                        questions=len(probed),
                        target="escalation",
                        value=0.0,
                    ),
                    thresholds=TypeBands(choice=Bands(two=0.5)),
                    temperatures=TypeBands(choice=Bands(two=1.0)),
                    snapshot={"choice:2": reference},
                ),
            )
            policy.write_text(policy.read_text() + '\n[calibration]\nfile = "cal.toml"\n')
            for u in urls:  # a new snapshot: every replica's drift starts over
                assert httpx.post(u + "/admin/reload", headers=ADMIN, timeout=60).status_code == 200

            async def traffic() -> list[list[float]]:
                return await asyncio.gather(
                    *(
                        ask(u, SHIFTED if i == 2 else YES_NO, EACH, "jev-latest", seed=10 + i)
                        for i, u in enumerate(urls)
                    )
                )

            answered = sum(map(len, asyncio.run(traffic())))
            deadline = time.monotonic() + 60
            while True:  # until every replica read the window after every replica's last adds
                merged = added(url, len(reference.counts))
                expected = psi(reference.counts, merged)
                seen = [gauges(u) for u in urls]
                if sum(merged) == answered and all(
                    f is not None and f == pytest.approx(expected) for _, f in seen
                ):
                    break
                assert time.monotonic() < deadline, (merged, answered, expected, seen)
                time.sleep(0.3)
            status = httpx.get(urls[1] + "/admin/control", headers=ADMIN).json()
            health = httpx.get(urls[2] + "/health", headers=ADMIN).json()
    own = [o for o, _ in seen]
    fleet = seen[0][1]
    assert fleet is not None and None not in own, seen
    assert answered >= 0.9 * 3 * EACH  # a few shed on a loaded machine at most
    assert own[0] < 0.25 and own[1] < 0.25 < own[2]  # the bad pod, found by its own PSI
    assert all(fleet != pytest.approx(o, rel=0.05) for o in own)
    assert fleet < own[2]
    for shown in (status["fleet"], health["fleet"]):
        assert shown["drift"]["psi"] == {"choice:2": round(fleet, 4)}
