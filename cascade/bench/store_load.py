"""``cascade bench store --load``: the decision store's cost to a whole gateway, as goodput.

Three ``cascade serve`` gateways on loopback, one per store: none (``off``), a SQLite file in a
temporary directory, and the PostgreSQL database ``--postgres`` names (each replica also gets a
spool of its own there). Their tiers (``tiers``): ``demo``, both tiny random checkpoints in
process (``serve --demo``: a request costs the gateway's CPU what a small model does), or
``fake``, one fake upstream process for all three (``serve --upstream``, as ``bench gateway``:
a request costs almost nothing but the gateway itself, so the store's share is the largest).
Each is driven by ``cascade bench load``'s generator (``cascade.bench.load``) with CLIENTS
concurrent clients for SECONDS, the three in turn, in ROUNDS rounds, so a burst of other load on
a shared machine moves one round of one gateway, not the result. Per client count and store:
the median over rounds of goodput (200s per second), of p50/p99 and of the gateway process's
CPU time per 200 (``/proc``), each store's as a share of the store-off gateway's. On a busy
machine goodput moves with the neighbours' load; CPU per request much less: it is what the
store costs a gateway that is CPU-bound.

On one machine the database's own CPU competes with the gateway's: loopback is the worst case
for PostgreSQL, not the best.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from cascade.bench import load
from cascade.bench.gateway import cpu_s
from cascade.settings import child_environment

READY_S = 600.0  # the first demo start builds and exports its tiny checkpoints


@contextlib.contextmanager
def gateway(
    name: str, tiers: list[str], decision_log: str | None, work: Path
) -> Iterator[tuple[str, int]]:
    """``cascade serve`` with ``tiers`` (its arguments) on a free loopback port logging to
    ``decision_log`` (None: no store), its spool under ``work``; yields its URL and pid, stops
    it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "cascade",
        "serve",
        *tiers,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if decision_log is not None:
        cmd += ["--decision-log", decision_log]
    env = child_environment(
        {"CASCADE_REPLICA": f"bench-{name}", "CASCADE_DECISION_SPOOL": str(work / f"spool-{name}")}
    )
    print(f"starting the {name} gateway: {' '.join(cmd[1:])}", file=sys.stderr)
    proc = subprocess.Popen(cmd, env=env, cwd=work)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"cascade serve exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"cascade serve was not ready at {url} within {READY_S:g} s")


@contextlib.contextmanager
def fake_upstream() -> Iterator[str]:
    """``bench gateway``'s fake ``/v1/systemone`` upstream in a process of its own."""
    import multiprocessing

    from cascade.bench.gateway import serve_fake, started

    proc, url = started(multiprocessing.get_context("spawn"), serve_fake)
    try:
        yield url
    finally:
        proc.terminate()
        proc.join(10)


def run_bench(
    *, postgres: str, clients: list[int], seconds: float, rounds: int, tiers: str = "demo"
) -> dict[str, Any]:
    """Every store at every client count, ``rounds`` times each, interleaved."""
    with (
        tempfile.TemporaryDirectory(prefix="cascade-bench-store-load-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work = Path(tmp)
        args = (
            ["--demo"] if tiers == "demo" else ["--upstream", stack.enter_context(fake_upstream())]
        )
        stores = {"off": None, "sqlite": str(work / "decisions.sqlite"), "postgresql": postgres}
        servers = {
            name: stack.enter_context(gateway(name, args, target, work))
            for name, target in stores.items()
        }
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {
            name: {n: [] for n in clients} for name in stores
        }
        for n in clients:
            for _ in range(rounds):
                for name, (url, pid) in servers.items():
                    cpu = cpu_s(pid)
                    done = load.run(url, concurrency=n, duration_s=seconds, pid=pid)
                    done["cpu_ms_per_ok"] = (
                        1000 * (cpu_s(pid) - cpu) / done["ok"] if done["ok"] else None
                    )
                    runs[name][n].append(done)
    return {
        "tiers": tiers,
        "seconds": seconds,
        "rounds": rounds,
        "clients": clients,
        "cpus": os.cpu_count(),
        "rows": _rows(runs, clients),
    }


def _rows(
    runs: dict[str, dict[int, list[dict[str, Any]]]], clients: list[int]
) -> list[dict[str, Any]]:
    rows = []
    for n in clients:
        base = cpu_base = None
        for name, by_clients in runs.items():
            done = by_clients[n]
            route: list[dict[str, Any]] = [next(iter(r["routes"].values()), {}) for r in done]
            goodput = statistics.median(r["goodput_per_s"] for r in done)
            cpu = _median(r["cpu_ms_per_ok"] for r in done)
            base = goodput if base is None else base
            cpu_base = cpu if cpu_base is None else cpu_base
            rows.append(
                {
                    "clients": n,
                    "store": name,
                    "ok": sum(r["ok"] for r in done),
                    "not_ok": sum(r["requests"] - r["ok"] for r in done),
                    "goodput_per_s": round(goodput, 2),
                    "goodput_rounds": [round(r["goodput_per_s"], 2) for r in done],
                    "vs_off": round(goodput / base, 3) if base else None,
                    "cpu_ms_per_ok": cpu,
                    "cpu_rounds": [
                        None if r["cpu_ms_per_ok"] is None else round(r["cpu_ms_per_ok"], 3)
                        for r in done
                    ],
                    "cpu_vs_off": round(cpu / cpu_base, 3) if cpu and cpu_base else None,
                    "p50_ms": _median(r.get("p50_ms") for r in route),
                    "p99_ms": _median(r.get("p99_ms") for r in route),
                }
            )
    return rows


def _median(values: Any) -> float | None:
    found = [v for v in values if v is not None]
    return round(statistics.median(found), 2) if found else None


def table(result: dict[str, Any]) -> str:
    lines = [
        f"tiers: {result['tiers']}; {result['rounds']} rounds of {result['seconds']:g} s per "
        "store and client count "
        f"(medians; {result['cpus']} CPUs shared by the gateways, the database and the "
        "clients)",
        f"{'clients':>7} {'store':<11} {'ok':>7} {'not 200':>8} {'goodput/s':>10} "
        f"{'vs off':>7} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/ok':>10} {'vs off':>7}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['clients']:>7} {r['store']:<11} {r['ok']:>7} {r['not_ok']:>8} "
            f"{r['goodput_per_s']:>10.2f} {r['vs_off']:>7.3f} {r['p50_ms']:>8} "
            f"{r['p99_ms']:>8} {r['cpu_ms_per_ok']:>10} {r['cpu_vs_off']:>7}"
        )
    return "\n".join(lines)
