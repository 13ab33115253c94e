"""``cascade bench gateway`` (the model benchmarks register themselves from their packages)."""

from __future__ import annotations

import argparse
from typing import Any


def register(groups: dict[str, Any]) -> None:
    gateway = groups["bench"].add_parser(
        "gateway", help="requests/s and p50/p99: upstream directly vs through cascade",
        description="Start a fake /v1/systemone upstream and a gateway in front of it on "
        "loopback, drive both with the same requests, print a table and JSON.",
    )
    gateway.add_argument("--requests", type=int, default=500, help="requests per path (500)")
    gateway.add_argument("--concurrency", type=int, default=8, help="concurrent clients (8)")
    gateway.set_defaults(func=_run_gateway)


def _run_gateway(args: argparse.Namespace) -> int:
    from cascade.bench_gateway import main

    return main(args.requests, args.concurrency)
