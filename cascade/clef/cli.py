"""Clef's commands: ``cascade make-tiny clef DIR`` and ``cascade bench clef``.

Imports nothing heavy at module level (the CLI parser loads every plugin); handlers import
torch and transformers when they run. ``cascade engine clef`` is wired by the gateway's
serve command around ``cascade.engines.clef.ClefEngine``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(groups: dict[str, Any]) -> None:
    tiny = groups["make-tiny"].add_parser(
        "clef", help="write a tiny random Clef release (real format) into DIR")
    tiny.add_argument("dir", type=Path, help="directory to write (created if needed)")
    tiny.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    tiny.set_defaults(func=make_tiny)

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


def make_tiny(args: argparse.Namespace) -> int:
    from cascade.clef.tiny import make_tiny as write

    print(write(args.dir, seed=args.seed))
    return 0


def bench_clef(args: argparse.Namespace) -> int:
    if args.shape == "9b" and not _cuda(args.device):
        print("cascade bench clef: the 9b shape needs a CUDA device (about 20 GB of bf16 "
              "weights); use --shape tiny to run on the CPU", file=sys.stderr)
        return 2
    from cascade.clef import bench

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
    """``python -m cascade.clef.cli make-tiny|bench clef ...``: Clef's commands alone, for a GPU
    host that has torch but not the gateway's dependencies (litestar, uvicorn)."""
    parser = argparse.ArgumentParser(prog="python -m cascade.clef.cli")
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register({name: top.add_parser(name).add_subparsers(dest="target", required=True)
              for name in ("make-tiny", "bench")})
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
