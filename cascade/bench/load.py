"""``cascade bench load``: a bounded load generator for any ``/v1/systemone`` server on loopback.

``concurrency`` clients each send one request at a time, for ``duration`` seconds, cycling
through the request file (the shared sample's format: one JSON object per line with ``state``
and ``questions``, or ``states`` for the batch route; other keys are dropped). A client that gets
``Retry-After`` waits that long (at most until the end) before its next request, as the official
SDKs do. Reports requests/s, goodput (200s per second), p50/p99 latency per route, status
classes, answers marked degraded (cascade's ``x_cascade.degraded``), and the server's resident
memory sampled over the run (``--pid``, else the process listening on the URL's port, found in
``/proc``). A benchmark, not a test: compare servers side by side in one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

ROUTES = {False: "/v1/systemone", True: "/v1/systemone/batch"}
DEFAULT_BODY = {
    "state": "I was charged twice for my March invoice and nobody answers my emails.",
    "questions": {
        "team": {"type": "choice", "instructions": "Which team should handle this?",
                 "criteria": {"billing": "Payments", "technical": "Bugs", "sales": "Upgrades"}},
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "anger": {"type": "score", "instructions": "How angry?",
                  "criteria": ["calm", "annoyed", "furious"]},
    },
}
RSS_INTERVAL_S = 0.5


def read_requests(path: Path | None, *, model: str, max_state_chars: int) -> list[dict[str, Any]]:
    """Request bodies from a JSONL file (or one built-in body). Lines whose serialized state is
    longer than ``max_state_chars`` (0: no limit) or that carry images are skipped."""
    if path is None:
        return [{"model": model, **DEFAULT_BODY}]
    bodies = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        states = item["states"] if "states" in item else [item.get("state")]
        if item.get("images") or item.get("assets"):
            continue
        if max_state_chars and any(len(json.dumps(s)) > max_state_chars for s in states):
            continue
        body = {k: item[k] for k in ("state", "states", "questions") if k in item}
        bodies.append({"model": item.get("model", model), **body})
    if not bodies:
        raise SystemExit(f"no request in {path} passes the filters")
    return bodies


# ---------------------------------------------------------------- the server's memory


def listening_pid(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` (IPv4 or IPv6), from ``/proc``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{inode}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(proc.name)
    return None


def rss_mib(pid: int) -> float | None:
    """Resident memory of ``pid`` in MiB (None once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


class RssSampler:
    """Samples a process's RSS every ``RSS_INTERVAL_S`` in a thread: ``[(seconds, MiB)]``."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        assert self.pid is not None
        started = time.monotonic()
        while True:
            value = rss_mib(self.pid)
            if value is not None:
                self.samples.append((round(time.monotonic() - started, 2), round(value, 1)))
            if self._stop.wait(RSS_INTERVAL_S):
                return


# ---------------------------------------------------------------- the load


@dataclass
class Result:
    route: str
    status: int | str  # an HTTP status, or "timeout" / "connect_error" / "error"
    seconds: float
    degraded: bool = False


@dataclass
class Load:
    url: str
    bodies: list[dict[str, Any]]
    concurrency: int
    duration_s: float
    timeout_s: float = 30.0
    honour_retry_after: bool = True
    results: list[Result] = field(default_factory=list)
    _next: int = 0

    def take(self) -> dict[str, Any]:
        body = self.bodies[self._next % len(self.bodies)]
        self._next += 1
        return body

    async def run(self) -> float:
        """Drive the server; returns the wall time until the last answer came back."""
        limits = httpx.Limits(max_connections=self.concurrency,
                              max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(base_url=self.url, limits=limits,
                                     timeout=self.timeout_s) as client:
            started = time.monotonic()
            end = started + self.duration_s
            await asyncio.gather(*(self._client(client, end) for _ in range(self.concurrency)))
            return time.monotonic() - started

    async def _client(self, client: httpx.AsyncClient, end: float) -> None:
        while time.monotonic() < end:
            body = self.take()
            route = ROUTES["states" in body]
            started = time.monotonic()
            wait = 0.0
            try:
                response = await client.post(route, json=body)
            except httpx.TimeoutException:
                self.results.append(Result(route, "timeout", time.monotonic() - started))
                continue
            except httpx.ConnectError:
                self.results.append(Result(route, "connect_error", time.monotonic() - started))
                await asyncio.sleep(0.1)
                continue
            except httpx.HTTPError:
                self.results.append(Result(route, "error", time.monotonic() - started))
                continue
            seconds = time.monotonic() - started
            status = response.status_code
            self.results.append(Result(route, status, seconds, status == 200 and _degraded(
                response)))
            if self.honour_retry_after and "retry-after" in response.headers:
                with contextlib.suppress(ValueError):
                    wait = float(response.headers["retry-after"])
            if wait > 0:
                await asyncio.sleep(min(wait, max(0.0, end - time.monotonic())))


def _degraded(response: httpx.Response) -> bool:
    """Whether any answer in a 200 body is marked degraded (cascade's ``x_cascade``)."""
    try:
        body = response.json()
    except ValueError:
        return False
    parts = body.get("results", [body]) if isinstance(body, dict) else []
    return any(isinstance(p, dict) and (p.get("x_cascade") or {}).get("degraded") for p in parts)


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _class(status: int | str) -> str:
    return f"{status // 100}xx" if isinstance(status, int) else status


def summarize(load: Load, wall_s: float, rss: list[tuple[float, float]],
              pid: int | None) -> dict[str, Any]:
    results = load.results
    ok = [r for r in results if r.status == 200]
    routes: dict[str, Any] = {}
    by_route: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_route[r.route].append(r)
    for route, items in by_route.items():
        good = sorted(r.seconds for r in items if r.status == 200)
        routes[route] = {
            "requests": len(items),
            "ok": len(good),
            "p50_ms": 1000 * statistics.median(good) if good else None,
            "p99_ms": 1000 * _percentile(good, 0.99) if good else None,
            "max_ms": 1000 * good[-1] if good else None,
        }
    return {
        "url": load.url,
        "concurrency": load.concurrency,
        "duration_s": load.duration_s,
        "wall_s": round(wall_s, 2),
        "distinct_requests": len(load.bodies),
        "requests": len(results),
        "req_per_s": len(results) / wall_s,
        "ok": len(ok),
        "goodput_per_s": len(ok) / wall_s,
        "degraded": sum(r.degraded for r in results),
        "status_classes": dict(sorted(Counter(_class(r.status) for r in results).items())),
        "statuses": {str(k): v for k, v in sorted(Counter(str(r.status) for r in results).items())},
        "routes": routes,
        "load_average": os.getloadavg()[0],
        "server_pid": pid,
        "rss_mib": {
            "start": rss[0][1] if rss else None,
            "max": max(v for _, v in rss) if rss else None,
            "end": rss[-1][1] if rss else None,
            "samples": rss,
        },
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['url']}: {result['concurrency']} clients for {result['duration_s']} s "
        f"({result['distinct_requests']} distinct requests); load average "
        f"{result['load_average']:.1f}",
        f"requests {result['requests']}  req/s {result['req_per_s']:.2f}  "
        f"goodput (200/s) {result['goodput_per_s']:.2f}  degraded {result['degraded']}",
        "status classes: " + ", ".join(f"{k} {v}" for k, v in result["status_classes"].items()),
        f"{'route':<22}{'requests':>9}{'ok':>7}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}",
    ]
    for route, r in result["routes"].items():
        def ms(v: float | None) -> str:
            return f"{v:>10.1f}" if v is not None else f"{'-':>10}"

        lines.append(f"{route:<22}{r['requests']:>9}{r['ok']:>7}{ms(r['p50_ms'])}"
                     f"{ms(r['p99_ms'])}{ms(r['max_ms'])}")
    rss = result["rss_mib"]
    if rss["samples"]:
        lines.append(f"server RSS (pid {result['server_pid']}): start {rss['start']:.0f} MiB, "
                     f"max {rss['max']:.0f} MiB, end {rss['end']:.0f} MiB")
    else:
        lines.append("server RSS: not sampled (no --pid and no local listener found)")
    return "\n".join(lines)


def run(url: str, *, concurrency: int, duration_s: float, requests: Path | None = None,
        model: str = "jev-latest", max_state_chars: int = 0, pid: int | None = None,
        timeout_s: float = 30.0, honour_retry_after: bool = True) -> dict[str, Any]:
    """Drive ``url`` and return the summary (see the module docstring)."""
    bodies = read_requests(requests, model=model, max_state_chars=max_state_chars)
    port = urlsplit(url).port or (443 if url.startswith("https") else 80)
    pid = pid if pid is not None else listening_pid(port)
    load = Load(url.rstrip("/"), bodies, concurrency, duration_s, timeout_s, honour_retry_after)
    with RssSampler(pid) as sampler:
        wall = asyncio.run(load.run())
    return summarize(load, wall, sampler.samples, pid)
