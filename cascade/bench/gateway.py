"""``cascade bench gateway``: what the gateway adds on top of an upstream, side by side.

Starts, on loopback, an upstream ``/v1/systemone`` server (cascade's fake engine, so the upstream
itself costs little) and a gateway in front of it (``--upstream``), each in its own process,
then drives both with the same requests from this process, in ``--repeat`` rounds: one at a
time, alternating between the two paths (latency p50/p99), then ``--concurrency`` clients at once
on each (requests/s), and the CPU time each server process spent per request. Each figure is
its median over the rounds, so a burst of other load on a shared machine moves one round, not
the result. Prints a table and JSON; the figures to watch are the added p50 and the throughput
ratio, and on a busy machine the gateway's CPU per request next to its upstream's.

``tracing=True`` runs three gateways side by side instead of one: tracing off, on at 0 %
sampling (the ``always_off`` sampler) and on at 100 % (``always_on``) exporting every span over
OTLP/HTTP to a sink on loopback (a process that answers each export at once); each gateway's
CPU per request includes its exporter thread.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import multiprocessing.process
import os
import socket
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import httpx

BODY = {
    "model": "jev-latest",
    "state": {"ticket": "I was charged twice for my March invoice", "customer": {"tier": "pro"}},
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {
                "billing": "Payments and refunds",
                "technical": "Bugs",
                "sales": "Upgrades",
            },
        },
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "anger": {
            "type": "score",
            "instructions": "How angry?",
            "criteria": ["calm", "annoyed", "furious"],
        },
    },
}


def _listening() -> socket.socket:
    """A socket listening on a port of the kernel's choosing on loopback: each server binds
    its own, so no other process can take the port between choosing it and binding it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    return sock


def serve_fake(ports: Connection) -> None:
    import uvicorn

    from cascade.engines.fake import FakeEngine
    from cascade.gateway import Gateway
    from cascade.http.app import create_app
    from cascade.http.drain import Drain
    from cascade.http.server import DrainingServer
    from cascade.policy.model import Policy, UpstreamTier
    from cascade.settings import Settings

    policy = Policy.single_tier("fake", UpstreamTier(urls=["http://127.0.0.1:9"]))
    gateway = Gateway(policy, {"fake": FakeEngine("fake")})
    config = uvicorn.Config(create_app(Settings(), gateway), log_level="error")
    sock = _listening()
    ports.send(sock.getsockname()[1])
    DrainingServer(config, Drain(), 0.0).run(sockets=[sock])  # start-up frozen, as served


def _serve_gateway(
    ports: Connection, upstream: str, collector: str = "", sampled: bool = False
) -> None:
    """The gateway as ``cascade serve`` runs it (its HTTP protocol and limits), no drain;
    with a ``collector``, traced to it (every trace ``sampled``, or none)."""
    from cascade.http.app import create_app
    from cascade.http.drain import Drain
    from cascade.http.server import serve
    from cascade.settings import Settings

    if collector:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

        from cascade.tracing.active import install
        from cascade.tracing.config import build

        install(
            build(
                OTLPSpanExporter(endpoint=collector + "/v1/traces"),
                sampler=ALWAYS_ON if sampled else ALWAYS_OFF,
            )
        )
    settings = Settings(upstream=upstream, host="127.0.0.1", drain_s=0)
    drain = Drain()
    app = create_app(settings, drain=drain)
    sock = _listening()
    ports.send(sock.getsockname()[1])
    serve(app, settings, "error", drain, sockets=[sock])


def _serve_sink(ports: Connection) -> None:
    """An OTLP/HTTP sink: answers every POST 200 with an empty (valid) export response."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                    b"Content-Length: 0\r\n\r\n"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        sock = _listening()
        ports.send(sock.getsockname()[1])
        server = await asyncio.start_server(answer, sock=sock)
        await server.serve_forever()

    asyncio.run(main())


def started(
    ctx: Any, target: Callable[..., None], *args: Any
) -> tuple[multiprocessing.process.BaseProcess, str]:
    """``target(ports, *args)`` in a process of its own, and the URL it serves."""
    here, there = ctx.Pipe()
    proc = ctx.Process(target=target, args=(there, *args), daemon=True)
    proc.start()
    for _ in range(1200):  # 2 minutes
        if here.poll(0.1):
            return proc, f"http://127.0.0.1:{here.recv()}"
        if not proc.is_alive():
            break
    proc.terminate()
    raise RuntimeError(f"{target.__name__} did not start (exit code {proc.exitcode})")


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


async def _post(client: httpx.AsyncClient) -> None:
    (await client.post("/v1/systemone", json=BODY)).raise_for_status()


async def _burst(client: httpx.AsyncClient, per_worker: int, concurrency: int) -> float:
    """Requests/s of ``concurrency`` clients sending ``per_worker`` requests each."""

    async def worker() -> None:
        for _ in range(per_worker):
            await _post(client)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - started)


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used (Linux's ``/proc``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _round(
    clients: dict[str, httpx.AsyncClient], requests: int, concurrency: int, pids: dict[str, int]
) -> dict[str, dict[str, float]]:
    """One round: ``requests`` one at a time on each path, alternating between the paths (so a
    change in the machine's load falls on both), then a burst on each, one after the other.
    The server processes' CPU time over the one-at-a-time requests is the figure a busy machine
    moves least: the gateway's serves the cascade path only, the upstream's both."""
    latencies: dict[str, list[float]] = {name: [] for name in clients}
    cpu = {name: cpu_s(pid) for name, pid in pids.items()}
    for _ in range(requests):
        for name, client in clients.items():
            started = time.perf_counter()
            await _post(client)
            latencies[name].append(time.perf_counter() - started)
    cpu_ms = {name: (cpu_s(pid) - cpu[name]) * 1000 / requests for name, pid in pids.items()}
    per_worker = max(1, requests // concurrency)
    return {
        name: {
            "p50_ms": statistics.median(latencies[name]) * 1000,
            "p99_ms": _percentile(latencies[name], 0.99) * 1000,
            "rps": await _burst(client, per_worker, concurrency),
            # CPU ms per request: the upstream's split over the paths it served
            "cpu_ms": cpu_ms[name] if name != "direct" else cpu_ms["direct"] / len(clients),
        }
        for name, client in clients.items()
    }


async def _measure(
    urls: dict[str, str], requests: int, concurrency: int, repeat: int, pids: dict[str, int]
) -> list[dict[str, dict[str, float]]]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    clients = {
        name: httpx.AsyncClient(base_url=url, limits=limits, timeout=30)
        for name, url in urls.items()
    }
    try:
        for client in clients.values():
            for _ in range(20):  # warm up connections and code paths
                await _post(client)
        return [await _round(clients, requests, concurrency, pids) for _ in range(repeat)]
    finally:
        for client in clients.values():
            await client.aclose()


def _figures(paths: dict[str, dict[str, float]]) -> dict[str, float]:
    direct, via = paths["direct"], paths["cascade"]
    return {
        "added_p50_ms": via["p50_ms"] - direct["p50_ms"],
        "added_p99_ms": via["p99_ms"] - direct["p99_ms"],
        "rps_ratio": via["rps"] / direct["rps"],
        "cpu_ratio": via["cpu_ms"] / direct["cpu_ms"],
    }


TRACED = ("tracing off", "sampled 0%", "sampled 100%")


def run(
    requests: int = 500, concurrency: int = 8, repeat: int = 3, tracing: bool = False
) -> dict[str, Any]:
    """``repeat`` rounds side by side; the figures are each one's median over the rounds."""
    ctx = multiprocessing.get_context("spawn")
    procs = []
    try:
        fake, upstream = started(ctx, serve_fake)
        procs.append(fake)
        gateways: dict[str, tuple[str, bool]] = {"cascade": ("", False)}
        if tracing:
            sink, collector = started(ctx, _serve_sink)
            procs.append(sink)
            gateways = {
                TRACED[0]: ("", False),
                TRACED[1]: (collector, False),
                TRACED[2]: (collector, True),
            }
        urls, pids = {"direct": upstream}, {"direct": fake.pid}
        for name, (traced_to, sampled) in gateways.items():
            proc, urls[name] = started(ctx, _serve_gateway, upstream, traced_to, sampled)
            procs.append(proc)
            pids[name] = proc.pid
        for url in urls.values():
            asyncio.run(_wait(url))
        rounds = asyncio.run(
            _measure(
                urls,
                requests,
                concurrency,
                repeat,
                {name: pid for name, pid in pids.items() if pid is not None},
            )
        )  # started: never None
    finally:
        for proc in reversed(procs):  # the gateways first: they flush to the sink as they stop
            proc.terminate()
            proc.join(10)
    paths = {
        name: {
            key: statistics.median(r[name][key] for r in rounds)
            for key in ("p50_ms", "p99_ms", "rps", "cpu_ms")
        }
        for name in urls
    }
    if tracing:
        return {
            "requests": requests,
            "concurrency": concurrency,
            "repeat": repeat,
            "tracing": True,
            **paths,
            "rounds": rounds,
        }
    figures = [_figures(r) for r in rounds]
    return {
        "requests": requests,
        "concurrency": concurrency,
        "repeat": repeat,
        **paths,
        **{key: statistics.median(f[key] for f in figures) for key in figures[0]},
        "rounds": [r | f for r, f in zip(rounds, figures, strict=True)],
    }


def table(result: dict[str, Any]) -> str:
    rows = [f"{'path':<18}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}{'server CPU ms':>15}"]
    if result.get("tracing"):
        return "\n".join([*rows, *_rows(result, ("direct", *TRACED)), _price(result)])
    rows += _rows(result, ("direct", "cascade"))
    rows.append(
        f"added p50 {result['added_p50_ms']:.2f} ms, p99 {result['added_p99_ms']:.2f} ms; "
        f"throughput ratio {result['rps_ratio']:.2f}; gateway CPU {result['cpu_ratio']:.2f}x "
        f"the upstream's (medians of {result['repeat']} rounds: "
        + ", ".join(f"{r['added_p50_ms']:.2f} ms/{r['rps_ratio']:.2f}" for r in result["rounds"])
        + ")"
    )
    return "\n".join(rows)


def _price(result: dict[str, Any]) -> str:
    """Each traced gateway's CPU per request against the untraced one's, per round."""
    off = TRACED[0]
    each = {
        name: [r[name]["cpu_ms"] - r[off]["cpu_ms"] for r in result["rounds"]]
        for name in TRACED[1:]
    }
    return (
        "; ".join(
            f"{name}: {result[name]['cpu_ms'] - result[off]['cpu_ms']:+.3f} CPU ms/request "
            f"({(result[name]['cpu_ms'] / result[off]['cpu_ms'] - 1) * 100:+.1f} %; rounds "
            + ", ".join(f"{d:+.3f}" for d in deltas)
            + ")"
            for name, deltas in each.items()
        )
        + f" (medians of {result['repeat']} rounds)"
    )


def _rows(result: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    rows = []
    for name in names:
        r = result[name]
        rows.append(
            f"{name:<18}{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}{r['rps']:>10.0f}"
            f"{r['cpu_ms']:>15.2f}"
        )
    return rows


def main(requests: int, concurrency: int, repeat: int = 3, tracing: bool = False) -> int:
    result = run(requests, concurrency, repeat, tracing)
    print(table(result))
    print(json.dumps(result, indent=2))
    return 0
