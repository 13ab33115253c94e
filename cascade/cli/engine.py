"""``cascade engine clef``: the Clef engine alone behind /v1/systemone, for a GPU host."""

from __future__ import annotations

import argparse
from typing import Any

from cascade.cli.serve import clef_flags, common_flags, run_server
from cascade.settings import env_value


def register(groups: dict[str, Any]) -> None:
    clef = groups["engine"].add_parser(
        "clef",
        help="run the Clef engine alone behind /v1/systemone",
        description="Clef-flash in process behind /v1/systemone, /health, /ready and /metrics, "
        "for a gateway that reaches it with --upstream or an upstream tier.",
    )
    common_flags(clef, 8100)
    clef.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="Clef release directory or hub id"
    )
    clef_flags(clef)
    clef.set_defaults(func=run_engine_clef)


def run_engine_clef(args: argparse.Namespace) -> int:
    # Port: the flag, else CASCADE_PORT, else 8100 (the gateway's 8000 stays free beside it).
    port = args.port or (None if env_value("port") is not None else 8100)
    return run_server(
        {
            "host": args.host,
            "port": port,
            "profile": args.profile,
            "clef": args.checkpoint,
            "clef_overlong": args.clef_overlong,
            "clef_max_length": args.clef_max_length,
            "admission_deadline_s": args.admission_deadline_s,
            "log_format": args.log_format,
        },
        args.log_level,
    )
