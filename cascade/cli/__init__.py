"""The ``cascade`` command line: every subcommand is one module of this package, listed once in
``COMMANDS``.

Top-level commands with targets (``export laya``, ``bench clef``) are groups made here; each
module adds its parsers through ``register(groups)`` and sets ``func(args) -> int`` as the
handler. Modules import nothing heavy (torch, onnxruntime, litestar) at module level: handlers
import what they run. A mistake the user can fix is reported by ``main`` in a few lines
(``cascade.cli.errors``), never as a traceback unless the log level is debug.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from cascade.cli.errors import CONFIGURATION, describe, status, user_errors
from cascade.errors import missing_extra
from cascade.settings import env_value

GROUPS = {
    "export": "export a checkpoint to the format cascade serves",
    "make-tiny": "write a tiny random checkpoint in a real release format (tests, demos)",
    "bench": "benchmarks: print a table and JSON",
    "engine": "run one engine standalone behind /v1/systemone",
    "keys": "the tenants of an API keys file: add a key, list them",
    "store": "the PostgreSQL decision store: create or upgrade its schema",
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
    "cascade.cli.replay",
    "cascade.cli.audit",
    "cascade.cli.calibrate",
    "cascade.cli.distill",
    "cascade.cli.keys",
    "cascade.cli.usage",
    "cascade.cli.store",
    "cascade.cli.completion",
)


def version() -> str:
    """The installed distribution's version, else the package's (a plain checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("cascade-router")
    except PackageNotFoundError:
        from cascade import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cascade",
        description="A Laya-first cascading router for typed decisions.",
        epilog="`cascade COMMAND --help` describes each command and names the CASCADE_* "
        "environment variable of each flag that has one (docs/configuration.md).",
    )
    parser.add_argument("--version", action="version", version=f"cascade {version()}")
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
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the handler ``args`` chose; a mistake the user can fix is a few lines, not a
    traceback."""
    try:
        return int(args.func(args) or 0)
    except user_errors() as exc:
        if _debug(args):
            raise
        print(describe(_name(args), exc), file=sys.stderr)
        return status(exc)
    except ModuleNotFoundError as exc:  # an optional package: name the extra that brings it
        message = missing_extra(exc)
        if message is None or _debug(args):
            raise
        print(f"cascade {_name(args)}: error: {message}", file=sys.stderr)
        return CONFIGURATION


def _name(args: argparse.Namespace) -> str:
    return " ".join(filter(None, (args.command, getattr(args, "target", None))))


def _debug(args: argparse.Namespace) -> bool:
    """``--log-level debug`` or ``CASCADE_LOG_LEVEL=debug``: errors keep their traceback."""
    level = getattr(args, "log_level", None) or env_value("log_level") or ""
    return level.lower() == "debug"


if __name__ == "__main__":
    sys.exit(main())
