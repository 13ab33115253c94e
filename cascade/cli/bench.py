"""``cascade bench gateway|laya|clef|load|soak|tenants``: every benchmark prints a table and JSON.

Imports nothing heavy at module level; each handler imports its benchmark from ``cascade.bench``.
``python -m cascade.cli.bench clef ...`` runs the Clef benchmark alone, for a GPU host that has
torch but not the gateway's dependencies (litestar, uvicorn).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cascade.cli.errors import ConfigError, UsageError


def register(groups: dict[str, Any]) -> None:
    gateway = groups["bench"].add_parser(
        "gateway", help="requests/s and p50/p99: upstream directly vs through cascade",
        description="Start a fake /v1/systemone upstream and a gateway in front of it on "
        "loopback, drive both with the same requests, print a table and JSON.",
    )
    gateway.add_argument("--requests", type=int, default=500, help="requests per path (500)")
    gateway.add_argument("--concurrency", type=int, default=8, help="concurrent clients (8)")
    gateway.set_defaults(func=_run_gateway)

    load = groups["bench"].add_parser(
        "load", help="drive a running /v1/systemone server: goodput, latency, statuses, RSS",
        description="A bounded load generator for a server on loopback (cascade, laya-serve, "
        "any /v1/systemone server): CONCURRENCY clients, one request at a time each, for "
        "DURATION seconds, honouring Retry-After. Prints req/s, goodput (200s per second), "
        "p50/p99 per route, status classes, degraded answers and the server's RSS over time.",
    )
    load.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    load.add_argument("--concurrency", type=int, default=8, help="concurrent clients (8)")
    load.add_argument("--duration", type=float, default=30.0, help="seconds of load (30)")
    load.add_argument("--requests", type=Path,
                      help="JSONL of requests (the format of the bundled sample, "
                      "cascade/bench/requests-sample.jsonl); default: one "
                      "built-in 3-question request")
    load.add_argument("--max-state-chars", type=int, default=2000,
                      help="skip items whose serialized state is longer (default 2000: the "
                      "short text items; 0 keeps all)")
    load.add_argument("--model", default="jev-latest",
                      help="model for items that name none (default jev-latest)")
    load.add_argument("--pid", type=int, help="server pid for RSS (default: the process "
                      "listening on the URL's port)")
    load.add_argument("--timeout", type=float, default=30.0, help="client timeout, s (30)")
    load.add_argument("--ignore-retry-after", action="store_true",
                      help="send the next request at once even after Retry-After")
    load.add_argument("--json", type=Path, help="also write the JSON here")
    load.set_defaults(func=bench_load)

    soak = groups["bench"].add_parser(
        "soak", help="honest clients beside hostile ones for minutes: answers and RSS floor",
        description="Drive a running gateway on loopback with HONEST clients beside bounded "
        "hostile actors (slow bodies, JPEG scan bombs, 15 MB instructions, h2c smuggling, "
        "unread batch answers, malformed heads). Prints, per window, the honest answers, their "
        "p50/p99 and the server's RSS floor and peak, then JSON.",
    )
    soak.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    soak.add_argument("--duration", type=float, default=600.0, help="seconds (600)")
    soak.add_argument("--window", type=float, default=120.0, help="report window, s (120)")
    soak.add_argument("--honest", type=int, default=4, help="honest clients (4)")
    soak.add_argument("--key", help="API key to send (default: none)")
    soak.add_argument("--pid", type=int, help="server pid for RSS (default: the listener's)")
    soak.add_argument("--json", type=Path, help="also write the JSON here")
    soak.set_defaults(func=bench_soak)

    tenants = groups["bench"].add_parser(
        "tenants", help="one tenant's flood beside another's requests: p50/p99 alone vs during",
        description="Drive a running gateway on loopback with two tenants' keys: the quiet "
        "tenant's sequential requests alone, then beside the flood tenant's RATE requests/s "
        "(open loop, whatever it is answered), then alone again. Prints p50/p99 and the "
        "statuses of each phase, then JSON.",
    )
    tenants.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    tenants.add_argument("--quiet-key", required=True, help="the quiet tenant's API key")
    tenants.add_argument("--flood-key", required=True, help="the flooding tenant's API key")
    tenants.add_argument("--requests", type=int, default=300,
                         help="quiet requests per phase (300)")
    tenants.add_argument("--rate", type=float, default=40.0,
                         help="flood requests per second (40)")
    tenants.add_argument("--json", type=Path, help="also write the JSON here")
    tenants.set_defaults(func=bench_tenants)

    bench = groups["bench"].add_parser(
        "laya", help="cascade's Laya engine vs laya's torch Agent on a random checkpoint",
        description="Time cascade's ONNX Laya engine against laya's torch Agent on a random "
        "checkpoint of the given shape: single requests, then the bundled sample mix from "
        "concurrent clients. Prints a table and JSON.",
    )
    bench.add_argument(
        "--shape",
        choices=["base", "large", "tiny"],
        default="base",
        help="ModernBERT shape of the random checkpoint (default base)",
    )
    bench.add_argument("--threads", type=int, help="threads for both runtimes (default: all)")
    bench.add_argument(
        "--requests",
        type=int,
        default=24,
        help="requests from the sample mix in the concurrent run (default 24)",
    )
    bench.add_argument("--clients", type=int, default=8,
                       help="concurrent clients in the sample-mix run (default 8)")
    bench.add_argument("--repeat", type=int, default=5,
                       help="single-request repetitions (default 5)")
    bench.add_argument("--sample", type=Path, help="requests JSONL (default: the bundled "
                       "sample, cascade/bench/requests-sample.jsonl)")
    bench.add_argument("--json", type=Path, help="also write the figures as JSON here")
    bench.set_defaults(func=bench_laya)

    bench = groups["bench"].add_parser(
        "clef", help="time cascade's Clef engine against the reference systemone loop",
        description="Time cascade's batched Clef engine against the reference one-at-a-time "
        "systemone loop on random weights: latency per state length, then throughput from "
        "concurrent clients. Prints a table and JSON.")
    bench.add_argument("--shape", choices=("9b", "tiny"), default="9b",
                       help="9b: Qwen3.5-9B-shaped random bf16 weights (CUDA only); "
                            "tiny: a tiny release, runs on the CPU")
    bench.add_argument("--release", type=Path, default=None,
                       help="tiny shape: an existing tiny release (default: make one)")
    bench.add_argument("--device", default="auto", help="auto (CUDA if present), cuda or cpu")
    bench.add_argument("--tokens", default="1024,4096,16384",
                       help="comma-separated target state lengths in tokens")
    bench.add_argument("--repeats", type=int, default=20, help="timed requests per length")
    bench.add_argument("--concurrency", type=int, default=8,
                       help="concurrent clients in the throughput run (default 8)")
    bench.add_argument("--requests", type=int, default=64, help="requests in the throughput run")
    bench.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    bench.set_defaults(func=bench_clef)


def _run_gateway(args: argparse.Namespace) -> int:
    from cascade.bench.gateway import main

    return main(args.requests, args.concurrency)


def reachable(url: str) -> None:
    """Raise ``ConfigError`` when nothing accepts a connection at ``url`` (so a benchmark of
    a server that is not running says so, instead of counting connect errors)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {url}: give a base URL such as http://127.0.0.1:8000")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=5).close()
    except OSError as exc:
        raise ConfigError(f"--url {url}: nothing answers there ({exc.strerror or exc}); start "
                          "the server first (e.g. `cascade serve --demo`)") from None


def readable(path: Path | None, flag: str) -> None:
    """Raise ``ConfigError`` naming ``flag`` when its file cannot be read (before any work)."""
    if path is not None and not path.is_file():
        raise ConfigError(f"{flag} {path}: no such file")


def bench_load(args: argparse.Namespace) -> int:
    from cascade.bench import load

    reachable(args.url)
    readable(args.requests, "--requests")

    result = load.run(args.url, concurrency=args.concurrency, duration_s=args.duration,
                      requests=args.requests, model=args.model,
                      max_state_chars=args.max_state_chars, pid=args.pid,
                      timeout_s=args.timeout, honour_retry_after=not args.ignore_retry_after)
    return _report(load.table(result), result, args.json)


def bench_soak(args: argparse.Namespace) -> int:
    from cascade.bench import soak

    reachable(args.url)

    result = soak.run(args.url, duration_s=args.duration, window_s=args.window,
                      honest_clients=args.honest, key=args.key, pid=args.pid)
    return _report(soak.table(result), result, args.json)


def bench_tenants(args: argparse.Namespace) -> int:
    from cascade.bench import tenants

    reachable(args.url)
    if args.requests < 1 or not args.rate > 0:
        raise UsageError("--requests must be >= 1 and --rate > 0")
    result = tenants.run(args.url, quiet_key=args.quiet_key, flood_key=args.flood_key,
                         requests=args.requests, rate=args.rate)
    return _report(tenants.table(result), result, args.json)


def bench_laya(args: argparse.Namespace) -> int:
    from cascade.bench.laya import main

    readable(args.sample, "--sample")
    return main(args)


def bench_clef(args: argparse.Namespace) -> int:
    if args.shape == "9b" and not _cuda(args.device):
        print("cascade bench clef: the 9b shape needs a CUDA device (about 20 GB of bf16 "
              "weights); use --shape tiny to run on the CPU", file=sys.stderr)
        return 2
    from cascade.bench import clef as bench

    try:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    except ValueError:
        raise UsageError(f"--tokens {args.tokens}: give comma-separated integers, e.g. "
                         "1024,4096") from None
    result = bench.run(args.shape, release=args.release, device=args.device, tokens=tokens,
                       repeats=args.repeats, concurrency=args.concurrency,
                       requests=args.requests)
    return _report(bench.table(result), result, args.json)


def _report(table: str, result: dict[str, Any], json_path: Path | None) -> int:
    """Print the table and the JSON line (and write it to ``json_path`` when given)."""
    print(table)
    line = json.dumps(result)
    print(line)
    if json_path is not None:
        json_path.write_text(line + "\n")
    return 0


def _cuda(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return bool(torch.cuda.is_available())


def main(argv: list[str] | None = None) -> int:
    """``python -m cascade.cli.bench clef ...``: the Clef benchmark without the gateway's CLI."""
    parser = argparse.ArgumentParser(prog="python -m cascade.cli.bench")
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register({"bench": top})
    from cascade.cli import run

    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
