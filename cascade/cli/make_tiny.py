"""``cascade make-tiny laya|clef DIR``: tiny RANDOM checkpoints in the real release formats
(tests and demos; not models). Handlers import torch only when they run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(groups: dict[str, Any]) -> None:
    tiny = groups["make-tiny"].add_parser(
        "laya",
        help="write a tiny RANDOM Laya checkpoint (tests and demos; not a model)",
        description="Write a tiny Laya checkpoint with RANDOM weights in the real release "
        "format into DIR: for tests and demos; its answers mean nothing. It reads rows as the "
        "English checkpoint does (512 tokens, 192 for the question).",
    )
    tiny.add_argument("dir", type=Path, help="directory to write (created if needed)")
    tiny.add_argument(
        "--config-format",
        choices=["v4", "v5"],
        default="v5",
        help="encoder/config.json form: transformers 5 (v5) or 4.x (v4)",
    )
    tiny.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    tiny.set_defaults(func=make_tiny_laya)

    tiny = groups["make-tiny"].add_parser(
        "clef",
        help="write a tiny random Clef release (real format) into DIR",
        description="Write a tiny Clef-flash release with RANDOM weights in the real format "
        "into DIR and print its path: for tests and demos; its answers mean nothing.",
    )
    tiny.add_argument("dir", type=Path, help="directory to write (created if needed)")
    tiny.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    tiny.set_defaults(func=make_tiny_clef)


def make_tiny_laya(args: argparse.Namespace) -> int:
    from cascade.laya.tiny import make_tiny

    out = make_tiny(args.dir, config_format=args.config_format, seed=args.seed)
    print(f"wrote a tiny RANDOM Laya checkpoint to {out} (a test fixture, not a model)")
    return 0


def make_tiny_clef(args: argparse.Namespace) -> int:
    from cascade.clef.tiny import make_tiny as write

    print(write(args.dir, seed=args.seed))
    return 0
