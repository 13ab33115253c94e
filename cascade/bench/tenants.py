"""``cascade bench tenants``: does one tenant's flood delay another? Against a running gateway
on loopback: the QUIET tenant's sequential requests alone (p50/p99), then again while the FLOOD
tenant sends RATE requests/s open loop (whatever it is answered: a client far over its quota),
then alone once more (the noise of the machine). Bounded: QUIET requests per phase, a flood that
lasts as long as the quiet phase does, a client timeout on every request.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from typing import Any

import httpx

BODY = {
    "model": "jev-latest",
    "state": "I was charged twice and nobody answers my emails",
    "questions": {
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": None, "technical": None},
        },
    },
}


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _quiet(client: httpx.AsyncClient, key: str, n: int) -> tuple[list[float], Counter[int]]:
    latencies, codes = [], Counter[int]()
    for _ in range(n):
        started = time.perf_counter()
        response = await client.post(
            "/v1/systemone", json=BODY, headers={"authorization": f"Bearer {key}"}
        )
        latencies.append((time.perf_counter() - started) * 1000)
        codes[response.status_code] += 1
    return latencies, codes


async def _flood(
    client: httpx.AsyncClient, key: str, rate: float, stop: asyncio.Event
) -> Counter[int]:
    codes = Counter[int]()
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        try:
            response = await client.post(
                "/v1/systemone", json=BODY, headers={"authorization": f"Bearer {key}"}
            )
            codes[response.status_code] += 1
        except httpx.HTTPError:
            codes[0] += 1  # no answer within the timeout

    while not stop.is_set():
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        await asyncio.sleep(1 / rate)
    await asyncio.gather(*tasks)
    return codes


async def _phase(
    url: str, quiet: str, flood: str | None, n: int, rate: float, timeout_s: float
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        stop = asyncio.Event()
        flooding = asyncio.create_task(_flood(client, flood, rate, stop)) if flood else None
        if flooding is not None:
            await asyncio.sleep(1.0)  # the flood is under way before the quiet tenant starts
        latencies, codes = await _quiet(client, quiet, n)
        stop.set()
        flooded = await flooding if flooding is not None else Counter[int]()
    return {
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(_p(latencies, 0.99), 2),
        "quiet_statuses": dict(codes),
        "flood_statuses": dict(flooded),
    }


def run(
    url: str, *, quiet_key: str, flood_key: str, requests: int, rate: float, timeout_s: float = 30.0
) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        await _phase(url, quiet_key, None, min(requests, 30), rate, timeout_s)  # warm up
        phases = {}
        for name, flood in (("alone", None), ("flood", flood_key), ("alone_again", None)):
            phases[name] = await _phase(url, quiet_key, flood, requests, rate, timeout_s)
        return phases

    return {"url": url, "requests": requests, "flood_rate": rate, "phases": asyncio.run(main())}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['url']}: the quiet tenant's {result['requests']} sequential requests, "
        f"alone and beside a flood of {result['flood_rate']:g} requests/s",
        f"{'phase':<13}{'p50 ms':>9}{'p99 ms':>9}  quiet statuses / flood statuses",
    ]
    for name, phase in result["phases"].items():
        statuses = " ".join(f"{k}:{v}" for k, v in sorted(phase["quiet_statuses"].items()))
        flood = " ".join(f"{k}:{v}" for k, v in sorted(phase["flood_statuses"].items()))
        lines.append(
            f"{name:<13}{phase['p50_ms']:>9.1f}{phase['p99_ms']:>9.1f}  {statuses}"
            + (f" / {flood}" if flood else "")
        )
    return "\n".join(lines)
