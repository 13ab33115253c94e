"""``cascade serve``: the gateway. ``run_server`` is shared with ``cascade engine clef``."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from cascade.settings import Settings, from_env, parse_map

if TYPE_CHECKING:
    from cascade.eval.decision_log import DecisionLog
    from cascade.policy.model import Policy


def common_flags(parser: argparse.ArgumentParser, port: int) -> None:
    parser.add_argument("--host", help="bind address (default 127.0.0.1; CASCADE_HOST)")
    parser.add_argument("--port", type=int, help=f"port (default {port}; CASCADE_PORT)")
    parser.add_argument(
        "--profile", choices=["laya", "jev"],
        help="confidence profile: laya (default; Laya extras) or jev (exact Jev shape)",
    )
    parser.add_argument("--log-level", default=None, help="debug, info (default), warning")
    parser.add_argument(
        "--admission-deadline", type=float, metavar="SECONDS", dest="admission_deadline_s",
        help="refuse at once (503 + Retry-After) a request the measured work ahead would keep "
        "waiting longer than this (default 8; CASCADE_ADMISSION_DEADLINE_S)",
    )


def register(groups: dict[str, Any]) -> None:
    serve = groups["<top>"].add_parser(
        "serve", help="run the gateway", description=(
            "Run the gateway on /v1/systemone. Tiers come from --policy, or --upstream, or "
            "--laya/--clef, or --demo (tiny random weights, labelled as a demo everywhere)."
        ),
    )
    common_flags(serve, 8000)
    serve.add_argument("--policy", help="policy file (policies/*.toml)")
    serve.add_argument("--upstream", metavar="URL", help="forward to a /v1/systemone server")
    serve.add_argument("--upstream-model", metavar="NAME", help="model name sent upstream")
    serve.add_argument(
        "--laya", action="append", metavar="[NAME=]DIR",
        help="Laya checkpoint dir or hub id (repeat for english=, multilingual=, typed-decisions=)",
    )
    serve.add_argument("--clef", metavar="DIR", help="Clef release dir or hub id (in process)")
    clef_flags(serve)
    serve.add_argument("--demo", action="store_true", default=None,
                       help="serve tiny random checkpoints of both tiers (a demo, not a model)")
    serve.add_argument("--calibration", metavar="FILE",
                       help="thresholds and temperatures from `cascade calibrate` (refused at "
                       "boot when fitted for other weights)")
    serve.add_argument("--decision-log", metavar="FILE",
                       help="log every answered question to this SQLite file (off by default)")
    serve.set_defaults(func=run_serve)


def clef_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overlong", choices=["reject", "truncate"],
                        help="a state over --max-length: reject with 413 (default) or truncate "
                        "its tail and report the dropped tokens in usage")
    parser.add_argument("--max-length", type=int, metavar="N",
                        help="Clef token limit, media included (default 16384)")


def run_server(settings_overrides: dict[str, Any], log_level: str | None) -> int:
    from cascade.build import build_gateway, policy_from_settings
    from cascade.http.app import create_app
    from cascade.http.drain import Drain
    from cascade.http.server import serve

    settings = from_env(**settings_overrides)
    level = configure_logging(settings, log_level)
    policy = policy_from_settings(settings)
    decisions = open_decision_log(settings, policy)
    drain = Drain()
    try:
        gateway = build_gateway(settings, policy=policy, decisions=decisions)
        serve(create_app(settings, gateway, drain), settings, level.lower(), drain)
    finally:
        if decisions is not None:
            decisions.close()
    return 0


def configure_logging(settings: Settings, log_level: str | None) -> str:
    """The process's logging: one format, and repeated lines rate-limited. Returns the level."""
    from cascade.http.logs import RepeatFilter

    level = (log_level or settings.log_level).upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise
    repeats = RepeatFilter(settings.log_repeat_burst, settings.log_repeat_interval_s)
    for handler in logging.getLogger().handlers:
        handler.addFilter(repeats)
    return level


def open_decision_log(settings: Settings, policy: Policy) -> DecisionLog | None:
    """The decision log ``--decision-log`` or the policy's ``[decision_log]`` asks for."""
    from cascade.build import fingerprints
    from cascade.eval.decision_log import DecisionLog, policy_hash

    config = policy.decision_log
    path = settings.decision_log or config.file
    if not path:
        return None
    logging.getLogger("cascade").info("decision log: %s (state stored as %s)", path, config.state)
    return DecisionLog(
        path, cheap=policy.route.cheap, strong=policy.route.strong,
        policy_hash=policy_hash(policy), checkpoints=fingerprints(policy),
        state_mode=config.state, max_bytes=config.max_bytes, keep=config.keep,
        queue_size=config.queue_size,
    )


def run_serve(args: argparse.Namespace) -> int:
    laya = None
    if args.laya:
        laya = {}
        for item in args.laya:
            laya.update(parse_map(item))
    return run_server(
        {
            "host": args.host, "port": args.port, "profile": args.profile,
            "policy": args.policy, "upstream": args.upstream,
            "upstream_model": args.upstream_model, "laya": laya, "clef": args.clef,
            "clef_overlong": args.overlong, "clef_max_length": args.max_length,
            "demo": args.demo, "calibration": args.calibration,
            "decision_log": args.decision_log, "admission_deadline_s": args.admission_deadline_s,
        },
        args.log_level,
    )
