"""``cascade bench gateway|laya|clef|load|cache-memory|soak|control|tenants|store|fleet``: each
prints a table and JSON.

Imports nothing heavy at module level; each handler imports its benchmark from ``cascade.bench``.
``python -m cascade.cli.bench clef ...`` runs the Clef benchmark alone, for a GPU host that has
torch but not the gateway's dependencies (litestar, uvicorn).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cascade.answers import demo_banner, demo_label
from cascade.cli.errors import ConfigError, UsageError
from cascade.cli.numbers import count, natural, positive, seconds, share


def register(groups: dict[str, Any]) -> None:
    gateway = groups["bench"].add_parser(
        "gateway",
        help="requests/s and p50/p99: upstream directly vs through cascade",
        description="Start a fake /v1/systemone upstream and a gateway in front of it on "
        "loopback, drive both with the same requests, print a table and JSON.",
    )
    gateway.add_argument("--requests", type=count, default=500, help="requests per path (500)")
    gateway.add_argument("--concurrency", type=count, default=8, help="concurrent clients (8)")
    gateway.add_argument(
        "--repeat", type=count, default=3, help="rounds; each figure is the median over them (3)"
    )
    gateway.add_argument(
        "--tracing",
        action="store_true",
        help="three gateways side by side instead: tracing off, on at 0%% "
        "sampling, on at 100%% to an OTLP/HTTP sink (needs the tracing extra)",
    )
    gateway.set_defaults(func=_run_gateway)

    load = groups["bench"].add_parser(
        "load",
        help="drive a running /v1/systemone server: goodput, latency, statuses, RSS",
        description="A bounded load generator for a server on loopback (cascade, laya-serve, "
        "any /v1/systemone server): CONCURRENCY clients, one request at a time each, for "
        "DURATION seconds, honouring Retry-After. Prints req/s, goodput (200s per second), "
        "p50/p99 per route, status classes, degraded answers and the server's RSS over time.",
    )
    load.add_argument(
        "--url",
        required=True,
        action="append",
        help="base URL, e.g. http://127.0.0.1:8000; repeat it to run several "
        "servers back to back, side by side",
    )
    load.add_argument("--concurrency", type=count, default=8, help="concurrent clients (8)")
    load.add_argument("--duration", type=seconds, default=30.0, help="seconds of load (30)")
    load.add_argument(
        "--requests",
        type=Path,
        help="JSONL of requests (the format of the bundled sample, "
        "cascade/bench/requests-sample.jsonl); default: one "
        "built-in 3-question request",
    )
    load.add_argument(
        "--max-state-chars",
        type=natural,
        default=2000,
        help="skip items whose serialized state is longer (default 2000: the "
        "short text items; 0 keeps all)",
    )
    load.add_argument(
        "--model", default="jev-latest", help="model for items that name none (default jev-latest)"
    )
    load.add_argument(
        "--pid",
        type=int,
        help="server pid for RSS (default: the process listening on the URL's port)",
    )
    load.add_argument("--timeout", type=seconds, default=30.0, help="client timeout, s (30)")
    load.add_argument(
        "--ignore-retry-after",
        action="store_true",
        help="send the next request at once even after Retry-After",
    )
    load.add_argument(
        "--repeat-share",
        type=share,
        action="append",
        metavar="R",
        help="share of requests (0-1) that repeat an earlier request's state and "
        "questions; the others are new (a reference number added to the state). "
        "Repeat the flag to run each R back to back (e.g. 0 and 0.5)",
    )
    load.add_argument("--seed", type=int, default=0, help="seed of the repeats (0)")
    load.add_argument("--json", type=Path, help="also write the JSON here")
    load.set_defaults(func=bench_load)

    memory = groups["bench"].add_parser(
        "cache-memory",
        help="the decision cache's memory at its bound: accounted vs RSS",
        description="Fill an in-memory decision cache past --max-bytes with Laya-shaped "
        "entries and compare the bytes it accounts with this process's RSS growth.",
    )
    memory.add_argument(
        "--max-bytes",
        type=count,
        default=64 << 20,
        help="the cache's bound, bytes (64 MiB, [cache] max_bytes' default)",
    )
    memory.add_argument("--json", type=Path, help="also write the JSON here")
    memory.set_defaults(func=bench_cache_memory)

    soak = groups["bench"].add_parser(
        "soak",
        help="honest clients beside hostile ones for minutes: answers and RSS floor",
        description="Drive a running gateway on loopback with HONEST clients beside bounded "
        "hostile actors (slow bodies, JPEG scan bombs, 15 MB instructions, h2c smuggling, "
        "unread batch answers, malformed heads). Prints, per window, the honest answers, their "
        "p50/p99 and the server's RSS floor and peak, then JSON.",
    )
    soak.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    soak.add_argument("--duration", type=seconds, default=600.0, help="seconds (600)")
    soak.add_argument("--window", type=seconds, default=120.0, help="report window, s (120)")
    soak.add_argument("--honest", type=count, default=4, help="honest clients (4)")
    soak.add_argument("--key", help="API key to send (default: none)")
    soak.add_argument("--pid", type=int, help="server pid for RSS (default: the listener's)")
    soak.add_argument("--json", type=Path, help="also write the JSON here")
    soak.set_defaults(func=bench_soak)

    control_flags(
        groups["bench"].add_parser(
            "control",
            help="two traffic mixes with a labeller's feedback: budget, accuracy, thresholds",
            description="Replay a labelled JSONL (the `cascade eval` format; default the bundled "
            "sample) against a gateway (--url, or a `cascade serve --demo` of its own on loopback) "
            "in two phases whose share of hard items differs (less confident ones with "
            "--synthetic-labels, else long or many-option ones), posting "
            "/v1/feedback for a share of the answers. Prints per phase the realised strong share "
            "(overall and the max over sliding windows), budget violations, the accuracy of the "
            "kept cheap answers against the target, and the live thresholds (scraped from "
            "/metrics, also drawn as a PNG); a table and JSON.",
        )
    )
    tenants = groups["bench"].add_parser(
        "tenants",
        help="one tenant's flood beside another's requests: p50/p99 alone vs during",
        description="Drive a running gateway on loopback with two tenants' keys: the quiet "
        "tenant's sequential requests alone, then beside the flood tenant's RATE requests/s "
        "(open loop, whatever it is answered), then alone again. Prints p50/p99 and the "
        "statuses of each phase, then JSON.",
    )
    tenants.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    tenants.add_argument("--quiet-key", required=True, help="the quiet tenant's API key")
    tenants.add_argument("--flood-key", required=True, help="the flooding tenant's API key")
    tenants.add_argument(
        "--requests", type=count, default=300, help="quiet requests per phase (300)"
    )
    tenants.add_argument(
        "--rate", type=positive, default=40.0, help="flood requests per second (40)"
    )
    tenants.add_argument("--json", type=Path, help="also write the JSON here")
    tenants.set_defaults(func=bench_tenants)

    store = groups["bench"].add_parser(
        "store",
        help="the decision store's rows/s and response wait: SQLite vs PostgreSQL",
        description="In process, no tiers: CLIENTS concurrent clients record answered requests "
        "(two questions each) for SECONDS through the decision store, which returns once the "
        "rows are durable. Prints rows/s and the p50/p99 of that wait per backend and client "
        "count (SQLite in a temporary file; PostgreSQL at --postgres URL), then JSON. With "
        "--load: the gateway's goodput instead, three `cascade serve --demo` gateways (store "
        "off, SQLite, PostgreSQL at --postgres) driven in turn by `bench load`'s clients.",
    )
    store.add_argument(
        "--postgres",
        metavar="URL",
        help="a postgresql:// database to write bench rows to (else SQLite only; --load needs it)",
    )
    store.add_argument("--clients", help="comma-separated client counts (1,8,32; --load: 8)")
    store.add_argument(
        "--seconds",
        type=float,
        default=5.0,
        help="per backend and client count (5; --load: per round)",
    )
    store.add_argument(
        "--load",
        action="store_true",
        help="goodput of whole gateways with the store off, SQLite and PostgreSQL, side by side",
    )
    store.add_argument(
        "--rounds",
        type=count,
        default=3,
        help="--load: rounds per store and client count, medians shown (3)",
    )
    store.add_argument(
        "--tiers",
        choices=("demo", "fake"),
        default="demo",
        help="--load: the gateways' tiers, tiny random checkpoints in process "
        "(demo) or a fake upstream that costs almost nothing (fake) (demo)",
    )
    store.add_argument("--json", type=Path, help="also write the JSON here")
    store.set_defaults(func=bench_store)

    fleet = groups["bench"].add_parser(
        "fleet",
        help="N demo replicas on one Redis and PostgreSQL: budget, accuracy, "
        "thresholds, labels and reloads, per-replica vs fleet scope",
        description="Start N `cascade serve --demo` replicas on loopback, all on one Redis and "
        "one PostgreSQL store, and drive them unevenly in three phases (a: one replica gets "
        "70%% of the requests and most hard items; b: the mix changes; c: that replica is "
        "killed and a new one joins), posting feedback labels to random replicas. Twice: with "
        '[control] scope = "replica", then "fleet", on fresh replicas. Prints per phase '
        "and scope the fleet's strong share and worst window against the budget, the kept "
        "answers' accuracy against the target, the threshold spread across replicas, the label "
        "propagation delay and a fleet reload's round trip; a table and JSON.",
    )
    fleet.add_argument(
        "--store",
        metavar="URL",
        help="the postgresql:// database the replicas "
        "log to (required; bench rows and labels are written there)",
    )
    fleet.add_argument(
        "--redis",
        metavar="URL",
        help="the Redis the replicas share (default: "
        "a redis-server of its own on loopback, when one is on PATH)",
    )
    fleet.add_argument("--replicas", type=count, default=3, help="replicas per scope (3)")
    fleet.add_argument(
        "--budget", type=share, default=0.25, help="[control] max_strong_share (0.25)"
    )
    fleet.add_argument(
        "--target",
        dest="target_accuracy",
        type=share,
        default=0.7,
        help="[control] target_accuracy (0.7)",
    )
    fleet.add_argument(
        "--phase-duration",
        type=seconds,
        default=60.0,
        metavar="SECONDS",
        help="seconds of traffic per phase (60)",
    )
    fleet.add_argument(
        "--window",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="[control] window_s, and the windows judged against the budget (30)",
    )
    fleet.add_argument(
        "--refit-every",
        type=seconds,
        default=5.0,
        metavar="SECONDS",
        help="[control] refit_interval_s (5)",
    )
    fleet.add_argument("--clients", type=count, default=4, help="concurrent clients (4)")
    fleet.add_argument(
        "--feedback-share",
        type=share,
        default=0.5,
        metavar="F",
        help="share of the yes/no answers labelled (0.5)",
    )
    fleet.add_argument("--seed", type=int, default=0, help="seed of the traffic and labels (0)")
    fleet.add_argument("--json", type=Path, help="also write the JSON here")
    fleet.set_defaults(func=bench_fleet)

    bench = groups["bench"].add_parser(
        "laya",
        help="cascade's Laya engine vs laya's torch Agent on a random checkpoint",
        description="Time cascade's ONNX Laya engine against laya's torch Agent on a random "
        "checkpoint of the given shape: single requests, then the bundled sample mix from "
        "concurrent clients. Prints a table and JSON.",
    )
    bench.add_argument(
        "--shape",
        choices=["base", "large", "tiny"],
        default="base",
        help="ModernBERT shape of the random checkpoint (default base)",
    )
    bench.add_argument("--threads", type=count, help="threads for both runtimes (default: all)")
    bench.add_argument(
        "--requests",
        type=count,
        default=24,
        help="requests from the sample mix in the concurrent run (default 24)",
    )
    bench.add_argument(
        "--clients",
        type=count,
        default=8,
        help="concurrent clients in the sample-mix run (default 8)",
    )
    bench.add_argument(
        "--repeat", type=count, default=5, help="single-request repetitions (default 5)"
    )
    bench.add_argument(
        "--sample",
        type=Path,
        help="requests JSONL (default: the bundled sample, cascade/bench/requests-sample.jsonl)",
    )
    bench.add_argument(
        "--precision",
        type=_precisions,
        default=["fp32"],
        help="cascade engine precisions, comma-separated: fp32 (default), int8, "
        "or fp32,int8 (both in one run, with the answers int8 changes)",
    )
    bench.add_argument("--json", type=Path, help="also write the figures as JSON here")
    bench.set_defaults(func=bench_laya)

    bench = groups["bench"].add_parser(
        "clef",
        help="time cascade's Clef engine against the reference systemone loop",
        description="Time cascade's batched Clef engine against the reference one-at-a-time "
        "systemone loop on random weights: latency per state length, then throughput from "
        "concurrent clients. Prints a table and JSON.",
    )
    bench.add_argument(
        "--shape",
        choices=("9b", "tiny"),
        default="9b",
        help="9b: Qwen3.5-9B-shaped random bf16 weights (CUDA only); "
        "tiny: a tiny release, runs on the CPU",
    )
    bench.add_argument(
        "--release",
        type=Path,
        default=None,
        help="tiny shape: an existing tiny release (default: make one)",
    )
    bench.add_argument("--device", default="auto", help="auto (CUDA if present), cuda or cpu")
    bench.add_argument(
        "--tokens", default="1024,4096,16384", help="comma-separated target state lengths in tokens"
    )
    bench.add_argument("--repeats", type=count, default=20, help="timed requests per length")
    bench.add_argument(
        "--concurrency",
        type=count,
        default=8,
        help="concurrent clients in the throughput run (default 8)",
    )
    bench.add_argument("--requests", type=count, default=64, help="requests in the throughput run")
    bench.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    bench.set_defaults(func=bench_clef)


def control_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="base URL of a running gateway (default: start "
        "`cascade serve --demo` on 127.0.0.1 with a decision log, serving the "
        "default policy with a [control] table of --max-strong-share, "
        "--target-accuracy, --window and --refit-every)",
    )
    parser.add_argument(
        "--requests",
        type=Path,
        help="labelled JSONL (default: the bundled sample, cascade/bench/requests-sample.jsonl)",
    )
    parser.add_argument(
        "--model", default="jev-latest", help="model for items that name none (default jev-latest)"
    )
    parser.add_argument(
        "--phase-duration",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="seconds per phase (120)",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent clients (4)")
    parser.add_argument(
        "--mix",
        default="0.2,0.8",
        metavar="P1,P2",
        help="share of hard items in phase 1 and phase 2 (default 0.2,0.8)",
    )
    parser.add_argument(
        "--feedback-share",
        type=float,
        default=0.5,
        metavar="F",
        help="share of answers a labeller posts /v1/feedback for (0.5)",
    )
    parser.add_argument(
        "--synthetic-labels",
        action="store_true",
        help="labels that make the cheap answer right with probability f(c) = "
        "c (c: its answer_confidence) instead of the items' gold",
    )
    parser.add_argument(
        "--with-forced",
        action="store_true",
        help="with --synthetic-labels, replay the items likely pre-routed strong "
        "too (a question of over 10 options, a state over 1,000 characters)",
    )
    parser.add_argument(
        "--cheap-model",
        default="laya",
        metavar="NAME",
        help="a cheap-only model name, asked once per item for the cheap answers "
        "synthetic labels build on (default laya)",
    )
    parser.add_argument(
        "--cheap-tier",
        default="laya",
        metavar="TIER",
        help="the cheap tier's name in x_cascade.tiers; every other tier "
        "counts as strong (default laya)",
    )
    parser.add_argument(
        "--max-strong-share",
        type=float,
        default=0.25,
        metavar="S",
        help="the budget the windows are judged against (0.25; a window over "
        "S + 0.02 is a violation)",
    )
    parser.add_argument(
        "--target-accuracy",
        type=float,
        default=0.9,
        metavar="A",
        help="the accuracy target of the kept cheap answers (0.9)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="sliding window of the strong share, s (300)",
    )
    parser.add_argument(
        "--refit-every",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="[control] refit_interval_s of a demo of its own (15)",
    )
    parser.add_argument(
        "--scrape-every",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often /metrics is read for the thresholds (2)",
    )
    parser.add_argument(
        "--reloads",
        type=int,
        default=0,
        metavar="N",
        help="POST /admin/reload N times, evenly over the run (0)",
    )
    parser.add_argument(
        "--admin-key",
        help="admin key for --reloads and /metrics (needed "
        "with --url when the gateway has one; a demo of its own is started "
        "with a fresh one)",
    )
    parser.add_argument(
        "--key",
        help="API key for /v1/systemone and /v1/feedback (and /metrics without --admin-key)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the mix and the labels (0)")
    parser.add_argument("--timeout", type=float, default=30.0, help="client timeout, s (30)")
    parser.add_argument(
        "--plot",
        type=Path,
        default=Path("bench-control.png"),
        metavar="PNG",
        help="where the threshold trajectories go (bench-control.png)",
    )
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    parser.set_defaults(func=bench_control)


def bench_control(args: argparse.Namespace) -> int:
    from cascade.bench import control, control_report

    try:
        mix = tuple(float(x) for x in args.mix.split(","))
    except ValueError:
        mix = ()
    if len(mix) != 2 or not all(0 <= x <= 1 for x in mix):
        raise UsageError(f"--mix {args.mix}: give two shares in [0, 1], e.g. 0.2,0.8")
    for flag, value in (
        ("--feedback-share", args.feedback_share),
        ("--max-strong-share", args.max_strong_share),
        ("--target-accuracy", args.target_accuracy),
    ):
        if not 0 <= value <= 1:
            raise UsageError(f"{flag} {value}: give a share in [0, 1]")
    for flag, value in (
        ("--phase-duration", args.phase_duration),
        ("--window", args.window),
        ("--scrape-every", args.scrape_every),
        ("--concurrency", args.concurrency),
        ("--refit-every", args.refit_every),
    ):
        if not value > 0:
            raise UsageError(f"{flag} {value}: must be > 0")
    if args.reloads < 0 or (args.reloads and args.url and not args.admin_key):
        raise UsageError("--reloads N needs N >= 0, and --admin-key with --url")
    if args.url:
        reachable(args.url)
    readable(args.requests, "--requests")
    opts = control.ControlOptions(
        phase_s=args.phase_duration,
        concurrency=args.concurrency,
        mix=(mix[0], mix[1]),
        feedback_share=args.feedback_share,
        synthetic=args.synthetic_labels,
        cheap_model=args.cheap_model,
        cheap_tier=args.cheap_tier,
        with_forced=args.with_forced,
        scrape_every_s=args.scrape_every,
        reloads=args.reloads,
        admin_key=args.admin_key,
        key=args.key,
        seed=args.seed,
        timeout_s=args.timeout,
        control=control.control_table(
            args.max_strong_share, args.target_accuracy, args.window, args.refit_every
        ),
    )
    random = (
        _served_random("bench control", [args.url], key=args.key, admin_key=args.admin_key)
        if args.url
        else _said("bench control", ["a demo of its own (`cascade serve --demo`)"])
    )
    items, run = control.run(args.url, requests=args.requests, opts=opts, model=args.model)
    result = control_report.summarize(
        run,
        items,
        opts,
        max_share=args.max_strong_share,
        target=args.target_accuracy,
        window_s=args.window,
        plot=args.plot,
    )
    control_report.write_plot(args.plot, result, run)
    return _report(control_report.table(result), result, args.json, random)


def _precisions(text: str) -> list[str]:
    """``fp32,int8`` -> ["fp32", "int8"] (each once, in the given order)."""
    found = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    wrong = [p for p in found if p not in ("fp32", "int8")]
    if wrong or not found:
        raise argparse.ArgumentTypeError(f"precisions are fp32 and int8, got {text!r}")
    return found


def _run_gateway(args: argparse.Namespace) -> int:
    from cascade.bench.gateway import main

    if min(args.requests, args.concurrency, args.repeat) < 1:
        raise UsageError("--requests, --concurrency and --repeat must be at least 1")
    return main(args.requests, args.concurrency, args.repeat, args.tracing)


def reachable(url: str) -> None:
    """Raise ``ConfigError`` when nothing accepts a connection at ``url`` (so a benchmark of
    a server that is not running says so, instead of counting connect errors)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {url}: give a base URL such as http://127.0.0.1:8000")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=5).close()
    except OSError as exc:
        raise ConfigError(
            f"--url {url}: nothing answers there ({exc.strerror or exc}); start "
            "the server first (e.g. `cascade serve --demo`)"
        ) from None


def readable(path: Path | None, flag: str) -> None:
    """Raise ``ConfigError`` naming ``flag`` when its file cannot be read (before any work)."""
    if path is not None and not path.is_file():
        raise ConfigError(f"{flag} {path}: no such file")


def bench_load(args: argparse.Namespace) -> int:
    from cascade.bench import load

    for url in args.url:
        reachable(url)
    readable(args.requests, "--requests")
    options: dict[str, Any] = dict(
        concurrency=args.concurrency,
        duration_s=args.duration,
        requests=args.requests,
        model=args.model,
        max_state_chars=args.max_state_chars,
        pid=args.pid,
        timeout_s=args.timeout,
        honour_retry_after=not args.ignore_retry_after,
        seed=args.seed,
    )
    random = _served_random("bench load", args.url)
    if len(args.url) > 1 or len(args.repeat_share or []) > 1:
        if args.pid is not None:
            raise ConfigError("--pid names one server: leave it out with several --url")
        matrix = load.run_matrix(args.url, args.repeat_share or [None], **options)
        return _report(load.matrix_table(matrix), matrix, args.json, random)
    share = args.repeat_share[0] if args.repeat_share else None
    result = load.run(args.url[0], repeat_share=share, **options)
    return _report(load.table(result), result, args.json, random)


def bench_cache_memory(args: argparse.Namespace) -> int:
    from cascade.bench import cache_memory

    if args.max_bytes < 1:
        raise ConfigError(f"--max-bytes {args.max_bytes}: must be >= 1")
    result = cache_memory.run(args.max_bytes)
    return _report(cache_memory.table(result), result, args.json)


def bench_soak(args: argparse.Namespace) -> int:
    from cascade.bench import soak

    reachable(args.url)
    random = _served_random("bench soak", [args.url], key=args.key)
    result = soak.run(
        args.url,
        duration_s=args.duration,
        window_s=args.window,
        honest_clients=args.honest,
        key=args.key,
        pid=args.pid,
    )
    return _report(soak.table(result), result, args.json, random)


def bench_tenants(args: argparse.Namespace) -> int:
    from cascade.bench import tenants

    reachable(args.url)
    if args.requests < 1 or not args.rate > 0:
        raise UsageError("--requests must be >= 1 and --rate > 0")
    random = _served_random("bench tenants", [args.url], key=args.quiet_key)
    result = tenants.run(
        args.url,
        quiet_key=args.quiet_key,
        flood_key=args.flood_key,
        requests=args.requests,
        rate=args.rate,
    )
    return _report(tenants.table(result), result, args.json, random)


def bench_store(args: argparse.Namespace) -> int:
    from cascade.bench import store
    from cascade.store import is_url

    text = args.clients or ("8" if args.load else "1,8,32")
    try:
        clients = [int(c) for c in text.split(",")]
    except ValueError:
        raise UsageError(f"--clients {text}: give comma-separated integers") from None
    if min(clients) < 1 or not args.seconds > 0:
        raise UsageError("--clients must be >= 1 and --seconds > 0")
    if args.postgres is not None and not is_url(args.postgres):
        raise UsageError(f"--postgres {args.postgres!r}: give a postgresql:// URL")
    if args.load:
        from cascade.bench import store_load

        if args.postgres is None:
            raise UsageError(
                "bench store --load needs --postgres URL: a database the "
                "PostgreSQL gateway may log bench requests to"
            )
        if args.rounds < 1:
            raise UsageError("--rounds must be >= 1")
        found = store_load.run_bench(
            postgres=args.postgres,
            clients=clients,
            seconds=args.seconds,
            rounds=args.rounds,
            tiers=args.tiers,
        )
        random = ["its `cascade serve --demo` gateways"] if args.tiers == "demo" else []
        return _report(
            store_load.table(found),
            found,
            args.json,
            _said("bench store --load", random) if random else None,
        )
    result = store.run_bench(postgres=args.postgres, clients=clients, seconds=args.seconds)
    return _report(store.table(result), result, args.json)


def bench_fleet(args: argparse.Namespace) -> int:
    import contextlib
    import shutil

    from cascade.bench import fleet, fleet_report
    from cascade.store import is_url

    if args.store is None or not is_url(args.store):
        raise UsageError(
            "bench fleet needs --store postgresql://USER@HOST/DB: the database "
            "every replica logs to (a fleet's labels are shared there)"
        )
    if args.replicas < 2:
        raise UsageError(f"--replicas {args.replicas}: a fleet needs at least 2")
    if args.redis is None and shutil.which("redis-server") is None:
        raise UsageError("bench fleet needs --redis URL (no redis-server on PATH to start one)")
    opts = fleet.FleetOptions(
        replicas=args.replicas,
        budget=args.budget,
        target=args.target_accuracy,
        phase_s=args.phase_duration,
        window_s=args.window,
        refit_s=args.refit_every,
        clients=args.clients,
        feedback_share=args.feedback_share,
        seed=args.seed,
    )
    random = _said("bench fleet", ["its `cascade serve --demo` replicas"])
    with contextlib.ExitStack() as stack:
        redis = args.redis or stack.enter_context(fleet.local_redis())
        records = fleet.run(redis, args.store, opts)
    result = fleet_report.summarize(records, opts)
    return _report(fleet_report.table(result), result, args.json, random)


def bench_laya(args: argparse.Namespace) -> int:
    from cascade.bench.laya import main

    readable(args.sample, "--sample")
    return main(args)


def bench_clef(args: argparse.Namespace) -> int:
    if args.shape == "9b" and not _cuda(args.device):
        print(
            "cascade bench clef: the 9b shape needs a CUDA device (about 20 GB of bf16 "
            "weights); use --shape tiny to run on the CPU",
            file=sys.stderr,
        )
        return 2
    from cascade.bench import clef as bench

    try:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    except ValueError:
        raise UsageError(
            f"--tokens {args.tokens}: give comma-separated integers, e.g. 1024,4096"
        ) from None
    result = bench.run(
        args.shape,
        release=args.release,
        device=args.device,
        tokens=tokens,
        repeats=args.repeats,
        concurrency=args.concurrency,
        requests=args.requests,
    )
    # Random weights by design: 9b-shaped random bf16, or a tiny release.
    return _report(bench.table(result), result, args.json, _said("bench clef", ["clef"]))


def _served_random(
    command: str, urls: list[str], *, key: str | None = None, admin_key: str | None = None
) -> list[str]:
    """The servers of ``urls`` that say they serve random weights, said on stderr."""
    from cascade.bench.served import served_demo

    return _said(command, [url for url in urls if served_demo(url, key=key, admin_key=admin_key)])


def _said(command: str, random: list[str]) -> list[str]:
    demo_banner(command, random)
    return random


def _report(
    table: str, result: dict[str, Any], json_path: Path | None, random: list[str] | None = None
) -> int:
    """Print the table and the JSON line (and write it to ``json_path`` when given), labelled
    DEMO when ``random`` names what serves random weights."""
    print(table)
    line = json.dumps({**result, **demo_label(random or [])})
    print(line)
    if json_path is not None:
        json_path.write_text(line + "\n")
    return 0


def _cuda(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return bool(torch.cuda.is_available())


def main(argv: list[str] | None = None) -> int:
    """``python -m cascade.cli.bench clef ...``: the Clef benchmark without the gateway's CLI."""
    parser = argparse.ArgumentParser(prog="python -m cascade.cli.bench")
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register({"bench": top})
    from cascade.cli import run

    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
