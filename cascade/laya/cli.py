"""``cascade export laya``, ``cascade make-tiny laya`` and ``cascade bench laya``.

Imports nothing heavy at module level: each handler imports what it needs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(groups: dict[str, Any]) -> None:
    export = groups["export"].add_parser(
        "laya", help="export a Laya checkpoint to fp32 ONNX (self-checked against torch)"
    )
    export.add_argument(
        "checkpoint",
        help="checkpoint directory, name (english, multilingual, typed-decisions) or alias",
    )
    export.add_argument(
        "--out",
        type=Path,
        help="output directory (default: the cache, keyed by the checkpoint's content hash)",
    )
    export.add_argument(
        "--int8",
        action="store_true",
        help="also write a dynamic int8 model "
        "and print how many answers it changes on a sample (opt-in)",
    )
    export.set_defaults(func=run_export)

    tiny = groups["make-tiny"].add_parser(
        "laya", help="write a tiny RANDOM Laya checkpoint (tests and demos; not a model)"
    )
    tiny.add_argument("dir", type=Path, help="directory to write (created if needed)")
    tiny.add_argument(
        "--config-format",
        choices=["v4", "v5"],
        default="v5",
        help="encoder/config.json form: transformers 5 (v5) or 4.x (v4)",
    )
    tiny.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    tiny.set_defaults(func=run_make_tiny)

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
    bench.set_defaults(func=run_bench)


def run_export(args: argparse.Namespace) -> int:
    from cascade.laya.export import export
    from cascade.laya.hub import resolve_checkpoint

    target = export(resolve_checkpoint(args.checkpoint), args.out)
    if args.int8:
        from cascade.laya.int8 import quantize_and_compare

        quantize_and_compare(target)
    print(target)
    return 0


def run_make_tiny(args: argparse.Namespace) -> int:
    from cascade.laya.tiny import make_tiny

    out = make_tiny(args.dir, config_format=args.config_format, seed=args.seed)
    print(f"wrote a tiny RANDOM Laya checkpoint to {out} (a test fixture, not a model)")
    return 0


def run_bench(args: argparse.Namespace) -> int:
    from cascade.laya.bench import main

    return main(args)
