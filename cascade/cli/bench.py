"""``cascade bench gateway|laya|clef``: every benchmark prints a table and JSON.

Imports nothing heavy at module level; each handler imports its benchmark from ``cascade.bench``.
``python -m cascade.cli.bench clef ...`` runs the Clef benchmark alone, for a GPU host that has
torch but not the gateway's dependencies (litestar, uvicorn).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
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

    bench = groups["bench"].add_parser(
        "laya", help="cascade's Laya engine vs laya's torch Agent on a random checkpoint"
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
        help="requests from the sample mix in the concurrent run",
    )
    bench.add_argument("--clients", type=int, default=8,
                       help="concurrent clients in the sample-mix run (default 8)")
    bench.add_argument("--repeat", type=int, default=5, help="single-request repetitions")
    bench.add_argument("--sample", type=Path, help="requests JSONL (default: shared sample)")
    bench.add_argument("--json", type=Path, help="also write the figures as JSON here")
    bench.set_defaults(func=bench_laya)

    bench = groups["bench"].add_parser(
        "clef", help="time cascade's Clef engine against the reference systemone loop")
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


def bench_laya(args: argparse.Namespace) -> int:
    from cascade.bench.laya import main

    return main(args)


def bench_clef(args: argparse.Namespace) -> int:
    if args.shape == "9b" and not _cuda(args.device):
        print("cascade bench clef: the 9b shape needs a CUDA device (about 20 GB of bf16 "
              "weights); use --shape tiny to run on the CPU", file=sys.stderr)
        return 2
    from cascade.bench import clef as bench

    tokens = tuple(int(t) for t in args.tokens.split(","))
    result = bench.run(args.shape, release=args.release, device=args.device, tokens=tokens,
                       repeats=args.repeats, concurrency=args.concurrency,
                       requests=args.requests)
    print(bench.table(result))
    line = json.dumps(result)
    print(line)
    if args.json is not None:
        args.json.write_text(line + "\n")
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
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
