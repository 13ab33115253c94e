"""The ``cascade`` command line: every subcommand is one module of this package, listed once in
``COMMANDS``.

Top-level commands with targets (``export laya``, ``bench clef``) are groups made here; each
module adds its parsers through ``register(groups)`` and sets ``func(args) -> int`` as the
handler. Modules import nothing heavy (torch, onnxruntime, litestar) at module level: handlers
import what they run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

GROUPS = {
    "export": "export a checkpoint to the format cascade serves",
    "make-tiny": "write a tiny random checkpoint in a real release format (tests, demos)",
    "bench": "benchmarks: print a table and JSON",
    "engine": "run one engine standalone behind /v1/systemone",
}

COMMANDS = (
    "cascade.cli.serve",
    "cascade.cli.engine",
    "cascade.cli.export",
    "cascade.cli.make_tiny",
    "cascade.cli.bench",
    "cascade.cli.policy",
    "cascade.cli.route",
    "cascade.cli.eval",
    "cascade.cli.calibrate",
    "cascade.cli.distill",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cascade", description="A Laya-first cascading router for typed decisions."
    )
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups = {}
    for name, help_text in GROUPS.items():
        group = top.add_parser(name, help=help_text, description=help_text)
        groups[name] = group.add_subparsers(dest="target", metavar="TARGET", required=True)
    groups["<top>"] = top
    for module in COMMANDS:
        importlib.import_module(module).register(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
