"""``cascade bench load``: a bounded load generator for any ``/v1/systemone`` server on loopback.

``concurrency`` clients each send one request at a time, for ``duration`` seconds, cycling
through the request file (the shared sample's format: one JSON object per line with ``state``
and ``questions``, or ``states`` for the batch route; other keys are dropped). A client that gets
``Retry-After`` waits that long (at most until the end) before its next request, as the official
SDKs do. Reports requests/s, goodput (200s per second), p50/p99 latency per route, status
classes, answers marked degraded (cascade's ``x_cascade.degraded``), and the server's resident
memory sampled over the run (``--pid``, else the process listening on the URL's port, found in
``/proc``). A benchmark, not a test: compare servers side by side in one run.

``repeat_share`` R: each request repeats the state and questions of an earlier one with
probability R (seeded), and is otherwise new: the next item of the file with a reference number
appended to its state, so no two new requests are alike (R = 0: nothing repeats). Responses'
``x-cascade-cache`` headers are counted. ``run_matrix`` runs several servers and several R back
to back and ``matrix_table`` puts them side by side, each server's goodput and p50 as a ratio
of the first server's at the same R.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
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
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {"billing": "Payments", "technical": "Bugs", "sales": "Upgrades"},
        },
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "anger": {
            "type": "score",
            "instructions": "How angry?",
            "criteria": ["calm", "annoyed", "furious"],
        },
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
    cache: str | None = None  # the x-cascade-cache header, if any


@dataclass
class Load:
    url: str
    bodies: list[dict[str, Any]]
    concurrency: int
    duration_s: float
    timeout_s: float = 30.0
    honour_retry_after: bool = True
    repeat_share: float | None = None  # None: cycle through the bodies as they are
    seed: int = 0
    results: list[Result] = field(default_factory=list)
    _next: int = 0
    _sent: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def take(self) -> dict[str, Any]:
        if (
            self.repeat_share is not None
            and self._sent
            and (self._rng.random() < self.repeat_share)
        ):
            return self._rng.choice(self._sent)
        body = self.bodies[self._next % len(self.bodies)]
        self._next += 1
        if self.repeat_share is not None:
            body = fresh(body, self._next)
            self._sent.append(body)
        return body

    async def run(self) -> float:
        """Drive the server; returns the wall time until the last answer came back."""
        limits = httpx.Limits(
            max_connections=self.concurrency, max_keepalive_connections=self.concurrency
        )
        async with httpx.AsyncClient(
            base_url=self.url, limits=limits, timeout=self.timeout_s
        ) as client:
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
            self.results.append(
                Result(
                    route,
                    status,
                    seconds,
                    status == 200 and _degraded(response),
                    response.headers.get("x-cascade-cache"),
                )
            )
            if self.honour_retry_after and "retry-after" in response.headers:
                with contextlib.suppress(ValueError):
                    wait = float(response.headers["retry-after"])
            if wait > 0:
                await asyncio.sleep(min(wait, max(0.0, end - time.monotonic())))


def fresh(body: dict[str, Any], n: int) -> dict[str, Any]:
    """``body`` with reference number ``n`` added to its state(s): a request nothing repeats."""

    def mark(state: Any) -> Any:
        if isinstance(state, dict):
            return {**state, "ref": n}
        if isinstance(state, list):
            return [*state, f"ref {n}"]
        return f"{state} (ref {n})"

    if "states" in body:
        return {**body, "states": [mark(s) for s in body["states"]]}
    return {**body, "state": mark(body.get("state"))}


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


def summarize(
    load: Load, wall_s: float, rss: list[tuple[float, float]], pid: int | None
) -> dict[str, Any]:
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
        "repeat_share": load.repeat_share,
        "cache": dict(sorted(Counter(r.cache for r in ok if r.cache).items())),
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

        lines.append(
            f"{route:<22}{r['requests']:>9}{r['ok']:>7}{ms(r['p50_ms'])}"
            f"{ms(r['p99_ms'])}{ms(r['max_ms'])}"
        )
    rss = result["rss_mib"]
    if rss["samples"]:
        lines.append(
            f"server RSS (pid {result['server_pid']}): start {rss['start']:.0f} MiB, "
            f"max {rss['max']:.0f} MiB, end {rss['end']:.0f} MiB"
        )
    else:
        lines.append("server RSS: not sampled (no --pid and no local listener found)")
    return "\n".join(lines)


def run(
    url: str,
    *,
    concurrency: int,
    duration_s: float,
    requests: Path | None = None,
    model: str = "jev-latest",
    max_state_chars: int = 0,
    pid: int | None = None,
    timeout_s: float = 30.0,
    honour_retry_after: bool = True,
    repeat_share: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Drive ``url`` and return the summary (see the module docstring)."""
    bodies = read_requests(requests, model=model, max_state_chars=max_state_chars)
    port = urlsplit(url).port or (443 if url.startswith("https") else 80)
    pid = pid if pid is not None else listening_pid(port)
    load = Load(
        url.rstrip("/"),
        bodies,
        concurrency,
        duration_s,
        timeout_s,
        honour_retry_after,
        repeat_share,
        seed,
    )
    with RssSampler(pid) as sampler:
        wall = asyncio.run(load.run())
    result = summarize(load, wall, sampler.samples, pid)
    result["cache_metrics"] = cache_metrics(load.url)
    return result


def cache_metrics(url: str) -> dict[str, float]:
    """The server's ``cascade_cache_bytes`` and ``cascade_cache_entries`` (empty when it has no
    such metrics or /metrics needs a key)."""
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("cascade_cache_bytes", "cascade_cache_entries"):
            found[name.removeprefix("cascade_cache_")] = float(value)
    return found


def run_matrix(
    urls: list[str], repeat_shares: list[float | None], **options: Any
) -> dict[str, Any]:
    """``run`` for every R of ``repeat_shares`` on every server of ``urls``, back to back (R
    outer, so each server sees the same machine load at the same R)."""
    runs = [run(url, repeat_share=share, **options) for share in repeat_shares for url in urls]
    return {"urls": urls, "repeat_shares": repeat_shares, "runs": runs}


def matrix_table(matrix: dict[str, Any]) -> str:
    """One line per server and R: goodput and p50, and their ratios to the first server's."""
    lines = [
        f"{'R':>5}  {'server':<28}{'ok':>6}{'goodput/s':>11}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'goodput x':>11}{'p50 x':>8}  cache (hit/partial/miss)  load"
    ]
    first: dict[float | None, dict[str, Any]] = {}
    for r in matrix["runs"]:
        share = r["repeat_share"]
        route: dict[str, Any] = next(iter(r["routes"].values()), {})
        p50, p99 = route.get("p50_ms"), route.get("p99_ms")
        base = first.setdefault(share, {"goodput": r["goodput_per_s"], "p50": p50})
        ratio = r["goodput_per_s"] / base["goodput"] if base["goodput"] else float("nan")
        p50_ratio = p50 / base["p50"] if p50 and base["p50"] else float("nan")
        cache = r["cache"]
        counts = "/".join(str(cache.get(k, 0)) for k in ("hit", "partial", "miss"))
        shown = "-" if share is None else f"{share:.2f}"
        lines.append(
            f"{shown:>5}  {r['url']:<28}{r['ok']:>6}{r['goodput_per_s']:>11.2f}"
            f"{p50 or float('nan'):>9.1f}{p99 or float('nan'):>9.1f}{ratio:>11.2f}"
            f"{p50_ratio:>8.2f}  {counts:<24}  {r['load_average']:.1f}"
        )
    for r in matrix["runs"]:
        if r["cache_metrics"]:
            rss = r["rss_mib"]
            lines.append(
                f"{r['url']} after R={r['repeat_share']}: cache "
                f"{r['cache_metrics'].get('bytes', 0) / 2**20:.2f} MiB accounted in "
                f"{r['cache_metrics'].get('entries', 0):.0f} entries; RSS "
                f"{rss['start']} -> {rss['end']} MiB"
            )
    return "\n".join(lines)
