"""The ``cascade`` command line.

Top-level commands are groups; each model package adds its targets to them through a
``register(groups)`` function in its own ``cli`` module, so this file never imports torch or
onnxruntime. Handlers are ``func(args) -> int`` set with ``set_defaults(func=...)``.
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

# Modules that add commands. Each must import without torch or onnxruntime.
PLUGINS = (
    "cascade.serve_cli",
    "cascade.laya.cli",
    "cascade.clef.cli",
    "cascade.policy_cli",
    "cascade.bench_cli",
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
    for module in PLUGINS:
        importlib.import_module(module).register(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
