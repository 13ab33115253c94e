"""``cascade bench gateway``: what the gateway adds on top of an upstream, side by side.

Starts, on loopback, an upstream ``/v1/systemone`` server (cascade's fake engine, so the upstream
itself costs microseconds) and a gateway in front of it (``--upstream``), each in its own
process, then drives both with the same requests from this process: first one at a time (latency
p50/p99), then ``--concurrency`` clients at once (requests/s). Prints a table and JSON; the
figure to watch is the added p50.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import time
from typing import Any

import httpx

BODY = {
    "model": "jev-latest",
    "state": {"ticket": "I was charged twice for my March invoice", "customer": {"tier": "pro"}},
    "questions": {
        "team": {"type": "choice", "instructions": "Which team should handle this?",
                 "criteria": {"billing": "Payments and refunds", "technical": "Bugs",
                              "sales": "Upgrades"}},
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "anger": {"type": "score", "instructions": "How angry?",
                  "criteria": ["calm", "annoyed", "furious"]},
    },
}


def _serve_fake(port: int) -> None:
    import uvicorn

    from cascade.engines.fake import FakeEngine
    from cascade.gateway import Gateway
    from cascade.http.app import create_app
    from cascade.policy.model import Policy, UpstreamTier
    from cascade.settings import Settings

    policy = Policy.single_tier("fake", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(policy, {"fake": FakeEngine("fake")})
    uvicorn.run(create_app(Settings(), gateway), host="127.0.0.1", port=port, log_level="error")


def _serve_gateway(port: int, upstream: str) -> None:
    """The gateway as ``cascade serve`` runs it (its HTTP protocol and limits), no drain."""
    from cascade.http.app import create_app
    from cascade.http.drain import Drain
    from cascade.http.server import serve
    from cascade.settings import Settings

    settings = Settings(upstream=upstream, host="127.0.0.1", port=port, drain_s=0)
    drain = Drain()
    serve(create_app(settings, drain=drain), settings, "error", drain)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait(url: str) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(600):
            try:
                if (await client.get(url + "/ready")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not become ready")


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(url: str, requests: int, concurrency: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        for _ in range(20):  # warm up connections and code paths
            (await client.post("/v1/systemone", json=BODY)).raise_for_status()
        latencies = []
        for _ in range(requests):
            started = time.perf_counter()
            (await client.post("/v1/systemone", json=BODY)).raise_for_status()
            latencies.append(time.perf_counter() - started)

        async def worker(n: int) -> None:
            for _ in range(n):
                (await client.post("/v1/systemone", json=BODY)).raise_for_status()

        per_worker = max(1, requests // concurrency)
        started = time.perf_counter()
        await asyncio.gather(*(worker(per_worker) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "rps": per_worker * concurrency / elapsed,
    }


def run(requests: int = 500, concurrency: int = 8) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    up_port, gw_port = _free_port(), _free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    gateway = f"http://127.0.0.1:{gw_port}"
    procs = [
        ctx.Process(target=_serve_fake, args=(up_port,), daemon=True),
        ctx.Process(target=_serve_gateway, args=(gw_port, upstream), daemon=True),
    ]
    for proc in procs:
        proc.start()
    try:
        asyncio.run(_wait(upstream))
        asyncio.run(_wait(gateway))
        direct = asyncio.run(_measure(upstream, requests, concurrency))
        via = asyncio.run(_measure(gateway, requests, concurrency))
    finally:
        for proc in procs:
            proc.terminate()
            proc.join(10)
    return {
        "requests": requests,
        "concurrency": concurrency,
        "direct": direct,
        "cascade": via,
        "added_p50_ms": via["p50_ms"] - direct["p50_ms"],
        "added_p99_ms": via["p99_ms"] - direct["p99_ms"],
        "rps_ratio": via["rps"] / direct["rps"],
    }


def table(result: dict[str, Any]) -> str:
    rows = [f"{'path':<18}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}"]
    for name in ("direct", "cascade"):
        r = result[name]
        rows.append(f"{name:<18}{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}{r['rps']:>10.0f}")
    rows.append(
        f"added p50 {result['added_p50_ms']:.2f} ms, p99 {result['added_p99_ms']:.2f} ms; "
        f"throughput ratio {result['rps_ratio']:.2f}"
    )
    return "\n".join(rows)


def main(requests: int, concurrency: int) -> int:
    result = run(requests, concurrency)
    print(table(result))
    print(json.dumps(result, indent=2))
    return 0
