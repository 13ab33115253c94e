"""``cascade serve``: the gateway. ``run_server`` is shared with ``cascade engine clef``."""

from __future__ import annotations

import argparse
import errno
import logging
import socket
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade.cli.errors import ConfigError
from cascade.settings import LogLevel, Settings, from_env, otel_environ, parse_map, under_make

if TYPE_CHECKING:
    from cascade.policy.model import Policy
    from cascade.store.base import DecisionStore


def common_flags(parser: argparse.ArgumentParser, port: int) -> None:
    parser.add_argument("--host", help="bind address (default 127.0.0.1; CASCADE_HOST)")
    parser.add_argument("--port", type=port_number, help=f"port (default {port}; CASCADE_PORT)")
    parser.add_argument(
        "--profile",
        choices=["laya", "jev"],
        help="confidence profile: laya (default; Laya extras) or jev (exact Jev shape; "
        "CASCADE_PROFILE)",
    )
    parser.add_argument(
        "--log-level",
        choices=typing.get_args(LogLevel),
        help="info (default), debug (errors keep their traceback), warning or "
        "error (CASCADE_LOG_LEVEL)",
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="text (default) or json, one object per line (CASCADE_LOG_FORMAT)",
    )
    parser.add_argument(
        "--admission-deadline",
        type=float,
        metavar="SECONDS",
        dest="admission_deadline_s",
        help="refuse at once (503 + Retry-After) a request the measured work ahead would keep "
        "waiting longer than this (default 8; CASCADE_ADMISSION_DEADLINE_S)",
    )


def port_number(text: str) -> int:
    """A TCP port, 0 to 65535 (argparse reports anything else as a usage error)."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return int(text)


def register(groups: dict[str, Any]) -> None:
    serve = groups["<top>"].add_parser(
        "serve",
        help="run the gateway",
        description=(
            "Run the gateway on /v1/systemone. Tiers come from --policy, or --upstream, or "
            "--laya/--clef, or --demo (tiny random weights, labelled as a demo everywhere). "
            "SIGHUP, or POST /admin/reload with an admin key (CASCADE_ADMIN_KEYS), reads the "
            "policy, calibration and key files again and swaps them in without a restart."
        ),
    )
    common_flags(serve, 8000)
    serve.add_argument(
        "--policy", metavar="FILE", help="policy file (policies/*.toml; CASCADE_POLICY)"
    )
    serve.add_argument(
        "--upstream", metavar="URL", help="forward to a /v1/systemone server (CASCADE_UPSTREAM)"
    )
    serve.add_argument(
        "--upstream-model", metavar="NAME", help="model name sent upstream (CASCADE_UPSTREAM_MODEL)"
    )
    serve.add_argument(
        "--laya",
        action="append",
        metavar="[NAME=]DIR",
        help="Laya checkpoint dir or hub id (repeat for english=, multilingual=, "
        "typed-decisions=; CASCADE_LAYA=english=DIR,multilingual=DIR)",
    )
    serve.add_argument(
        "--laya-precision",
        choices=["fp32", "int8"],
        help="precision of the --laya tier (default fp32); int8 needs a passing "
        "flip report from `cascade export laya DIR --precision int8 --check "
        "DATA.jsonl` (CASCADE_LAYA_PRECISION)",
    )
    serve.add_argument(
        "--clef", metavar="DIR", help="Clef release dir or hub id, in process (CASCADE_CLEF)"
    )
    clef_flags(serve)
    serve.add_argument(
        "--demo",
        action="store_true",
        default=None,
        help="serve tiny random checkpoints of both tiers (a demo, not a model; "
        "CASCADE_DEMO=1): the default policy, or --policy FILE's tables with its "
        "laya and clef tiers swapped for the tiny checkpoints",
    )
    serve.add_argument(
        "--calibration",
        metavar="FILE",
        help="thresholds and temperatures from `cascade calibrate` (refused at "
        "boot, and on reload, when fitted for other weights; CASCADE_CALIBRATION)",
    )
    serve.add_argument(
        "--decision-log",
        metavar="FILE|URL",
        help="log every answered question to this SQLite file, or to the "
        "postgresql://USER@HOST/DB every replica shares (off by default; "
        "CASCADE_DECISION_LOG)",
    )
    serve.set_defaults(func=run_serve)


def clef_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--overlong",
        choices=["reject", "truncate"],
        dest="clef_overlong",
        help="a state over --max-length: reject with 413 (default) or truncate "
        "its tail and report the dropped tokens in usage (CASCADE_CLEF_OVERLONG)",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        metavar="N",
        dest="clef_max_length",
        help="Clef token limit, media included (default 16384; CASCADE_CLEF_MAX_LENGTH)",
    )


def run_server(settings_overrides: dict[str, Any], log_level: str | None) -> int:
    """Serve until a signal. The keys file is read, the policy and calibration files found and
    the port bound before anything heavy is imported or any weights load, so those mistakes
    are reported in a second."""
    settings = from_env(**settings_overrides)
    level = configure_logging(settings, log_level)
    from cascade.tenants.admins import load_admins
    from cascade.tenants.files import load_tenants

    load_tenants(settings)  # the keys file, checked before anything loads
    load_admins(settings)
    for path in (settings.policy, settings.calibration):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
    with listen(settings) as listener:
        from cascade.build import build_gateway, policy_from_settings
        from cascade.http.app import create_app
        from cascade.http.drain import Drain
        from cascade.http.server import serve
        from cascade.tracing.active import install
        from cascade.tracing.config import from_env as tracing_from_env

        policy = policy_from_settings(settings)
        tenants = load_tenants(settings, policy)  # and each tenant's policy
        decisions = open_decision_log(settings, policy)
        drain = Drain()
        traces = tracing_from_env(otel_environ())  # off unless OTEL_* asks for traces
        install(traces)
        try:
            gateway = build_gateway(settings, policy=policy, decisions=decisions)
            serve(
                create_app(settings, gateway, drain, tenants),
                settings,
                level.lower(),
                drain,
                sockets=[listener],
            )
        finally:
            if decisions is not None:
                decisions.close()
            if traces is not None:
                install(None)
                traces.shutdown()  # what the batch processor still holds, within its timeout
    return 0


def listen(settings: Settings) -> socket.socket:
    """The listening socket uvicorn is handed (bound here, so no other process can take the
    port between this check and serving)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        return socket.create_server((settings.host, settings.port), family=family, backlog=2048)
    except OSError as exc:
        where = f"{settings.host}:{settings.port}"
        # Under make the port is make's PORT: `make serve` passes --port.
        other = "--port N (CASCADE_PORT" + ("; make serve PORT=N)" if under_make() else ")")
        if exc.errno == errno.EADDRINUSE:
            why = (
                f"port {settings.port} is already in use on {settings.host}; stop what "
                f"listens there or pick another port with {other}"
            )
        elif exc.errno == errno.EACCES:
            why = (
                f"no permission to listen on {where} (ports under 1024 need privileges); "
                f"pick another port with {other}"
            )
        else:
            why = (
                f"cannot listen on {where}: {exc.strerror or exc}; check --host "
                "(CASCADE_HOST) and --port (CASCADE_PORT)"
            )
        raise ConfigError(f"{why}. Nothing was loaded.") from None


def configure_logging(settings: Settings, log_level: str | None) -> str:
    """The process's logging (``cascade.http.logs.configure``). Returns the level."""
    from cascade.http.logs import configure

    level = (log_level or settings.log_level).upper()
    configure(
        level,
        settings.log_format,
        burst=settings.log_repeat_burst,
        interval_s=settings.log_repeat_interval_s,
    )
    return level


def open_decision_log(settings: Settings, policy: Policy) -> DecisionStore | None:
    """The decision store ``--decision-log`` or the policy's ``[decision_log]`` asks for: a
    SQLite file, or a PostgreSQL URL (migrated now). A bad URL or, unless ``required = false``,
    an unreachable database: one line naming the setting."""
    import tempfile

    from cascade.store import is_url, log_target, replica_name

    config = policy.decision_log
    target = log_target(settings, policy)
    if not target:
        return None
    replica = replica_name()
    if not is_url(target):
        from cascade.store.sqlite import SqliteStore

        logging.getLogger("cascade").info(
            "decision log: %s (state stored as %s)", target, config.state
        )
        return SqliteStore(
            target,
            state_mode=config.state,
            replica=replica,
            max_bytes=config.max_bytes,
            keep=config.keep,
            queue_size=config.queue_size,
        )
    from cascade.store.postgres import PostgresStore, safe_url

    spool = settings.decision_spool or str(Path(tempfile.gettempdir()) / f"cascade-spool-{replica}")
    where = safe_url(target)
    try:
        store = PostgresStore(
            target,
            spool=spool,
            spool_bytes=config.spool_bytes,
            state_mode=config.state,
            replica=replica,
            queue_size=config.queue_size,
            keep_days=config.keep_days,
            required=config.required,
        )
    except Exception as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(
            f"decision log (--decision-log / CASCADE_DECISION_LOG / [decision_log] "
            f"file): cannot use {where}: {why}"
        ) from None
    logging.getLogger("cascade").info(
        "decision log: %s (state stored as %s, spool %s)", where, config.state, spool
    )
    return store


def run_serve(args: argparse.Namespace) -> int:
    laya = None
    if args.laya:
        laya = {}
        for item in args.laya:
            laya.update(parse_map(item))
    return run_server(
        {
            "host": args.host,
            "port": args.port,
            "profile": args.profile,
            "policy": args.policy,
            "upstream": args.upstream,
            "upstream_model": args.upstream_model,
            "laya": laya,
            "clef": args.clef,
            "clef_overlong": args.clef_overlong,
            "clef_max_length": args.clef_max_length,
            "demo": args.demo,
            "calibration": args.calibration,
            "decision_log": args.decision_log,
            "admission_deadline_s": args.admission_deadline_s,
            "log_format": args.log_format,
            "laya_precision": args.laya_precision,
        },
        args.log_level,
    )
