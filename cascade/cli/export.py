"""``cascade export laya``: a Laya checkpoint to the fp32 ONNX the gateway serves."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(groups: dict[str, Any]) -> None:
    export = groups["export"].add_parser(
        "laya", help="export a Laya checkpoint to fp32 ONNX (self-checked against torch)",
        description="Export a Laya checkpoint to the fp32 ONNX model the gateway serves, check "
        "its outputs against torch, and print the output directory. The gateway exports on "
        "first use by itself; this command does it ahead of time (a build step).",
    )
    export.add_argument(
        "checkpoint",
        help="checkpoint directory, name (english, multilingual, typed-decisions) or alias",
    )
    export.add_argument(
        "--out",
        type=Path,
        help="output directory (default: $CASCADE_CACHE/laya-onnx/<content hash>, else "
        "~/.cache/cascade/laya-onnx/<content hash>)",
    )
    export.add_argument(
        "--int8",
        action="store_true",
        help="also write a dynamic int8 model "
        "and print how many answers it changes on a sample (opt-in)",
    )
    export.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from cascade.laya.export import export
    from cascade.laya.hub import resolve_checkpoint

    target = export(resolve_checkpoint(args.checkpoint), args.out)
    if args.int8:
        from cascade.laya.int8 import quantize_and_compare

        quantize_and_compare(target)
    print(target)
    return 0
