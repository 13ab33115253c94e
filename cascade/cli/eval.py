"""``cascade eval``: measure each tier and the cascade on labelled data (or a decision log).

The tier flags (``--policy P [--laya DIR]``, ``--demo``, ``--url URL [--model M]``,
``--calibration FILE``) are shared with ``cascade calibrate``, which imports them from here.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import sys
from pathlib import Path
from typing import Any

import msgspec

from cascade.cli.errors import UsageError
from cascade.cli.numbers import count
from cascade.cli.summary import rounded
from cascade.cli.usage import filter_flags, filters
from cascade.policy.model import Policy
from cascade.store import log_source, missing


def register(groups: dict[str, Any]) -> None:
    ev = groups["<top>"].add_parser(
        "eval",
        help="measure each tier and the cascade on labelled requests",
        description="Run each tier once on every item (cached under --out, so reruns resume), "
        "compute the cascade exactly as the gateway routes, sweep the thresholds, and write "
        "items.jsonl, summary.json, summary.md and PNG plots into --out.",
    )
    data_flags(ev)
    ev.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    tier_flags(ev, url=True, policy_help="the policy file whose tiers and cascade are measured")
    ev.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="TIER=PRICE",
        help="price per 1000 input tokens of a tier (name, or cheap/strong); "
        "default: the policy's [cost], else laya 1, clef/upstream 20",
    )
    ev.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON object instead of a table",
    )
    ev.add_argument(
        "--strong-down",
        action="store_true",
        help="decide as the gateway would with the strong tier unavailable: cheap "
        "answers standing in are marked degraded, refused requests are null",
    )
    ev.set_defaults(func=eval_command)


def data_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "data",
        type=Path,
        nargs="?",
        metavar="DATA.jsonl",
        help='labelled requests: {"id", "state", "questions", "gold"} per line',
    )
    parser.add_argument("--limit", type=count, metavar="N", help="the first N items only")
    parser.add_argument(
        "--from-log",
        type=log_source,
        action="append",
        default=[],
        metavar="FILE|URL",
        help="a decision log instead of DATA (repeat for "
        "rotated files), or a fleet's postgresql:// URL; needs --teacher strong",
    )
    filter_flags(parser)
    parser.add_argument(
        "--teacher",
        choices=["strong"],
        help="with --from-log: the strong tier's shadow answers stand in for gold",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is drawn only when stderr is a terminal)",
    )


def tier_flags(parser: argparse.ArgumentParser, *, url: bool, policy_help: str) -> None:
    parser.add_argument("--policy", type=Path, metavar="P", help=policy_help)
    parser.add_argument(
        "--laya",
        type=Path,
        metavar="DIR",
        help="with --policy or --demo: a Laya bundle instead of the policy's "
        "checkpoints (e.g. a `cascade distill` NEWDIR)",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="the demo tiers (tiny RANDOM weights: the figures mean nothing)",
    )
    if url:
        parser.add_argument(
            "--url", metavar="URL", help="evaluate any /v1/systemone server as a single tier"
        )
        parser.add_argument("--model", metavar="M", help="with --url: the model name to send")
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="apply a calibration from `cascade calibrate` (checked against the weights)",
    )


def check_source(args: argparse.Namespace) -> None:
    """The data flags make sense and their files exist (checked before any tier loads)."""
    if bool(args.data) == bool(args.from_log):
        raise UsageError("give DATA.jsonl or --from-log FILE (one of them)")
    if args.from_log and args.teacher != "strong":
        raise UsageError("--from-log needs --teacher strong (the log has no human labels)")
    if args.from_log and getattr(args, "strong_down", False):
        raise UsageError("--strong-down replays the tiers' outputs on DATA.jsonl, not --from-log")
    if args.data is not None and not args.data.is_file():
        raise FileNotFoundError(errno.ENOENT, "no such file", str(args.data))
    for path in missing(args.from_log):
        raise FileNotFoundError(errno.ENOENT, "no such file", path)


def tier_policy(args: argparse.Namespace) -> tuple[Policy, Any]:
    """The policy and settings the tier flags describe, calibration applied and checked."""
    from cascade.build import demo_policy, fingerprints
    from cascade.cli.route import laya_checkpoints
    from cascade.policy.calibration import (
        CalibrationError,
        check_checkpoints,
        with_calibration_file,
    )
    from cascade.policy.files import load_policy
    from cascade.policy.model import UpstreamTier
    from cascade.policy.novelty import check_reference, load_reference
    from cascade.settings import from_env

    url = getattr(args, "url", None)
    if sum(map(bool, (args.policy, args.demo, url))) != 1:
        raise UsageError(
            "give one of --policy P, --demo" + (", --url URL" if hasattr(args, "url") else "")
        )
    settings = from_env(demo=args.demo or None)
    if args.demo:
        policy = demo_policy(Path(settings.demo_dir), settings)
    elif url:
        tier = UpstreamTier(urls=[url], model=args.model, timeout_s=120.0, read_timeout_s=120.0)
        policy = Policy.single_tier("upstream", tier)
    else:
        policy = load_policy(args.policy)
    if args.laya is not None and not url:
        policy, _ = laya_checkpoints(policy, args.laya)
    if args.calibration is not None:
        policy = with_calibration_file(policy, args.calibration)
        found = fingerprints(policy)
        check_checkpoints(policy, found)
        try:
            check_reference(policy, load_reference(policy), found)
        except CalibrationError as exc:
            raise SystemExit(f"cascade {args.command}: {exc}") from None
    return policy, settings


def random_of(args: argparse.Namespace, policy: Policy) -> list[str]:
    """The tiers this run serves on random weights (none read from a decision log; ``--url``:
    the server, when it says so), said on stderr."""
    from cascade.answers import demo_banner
    from cascade.bench.served import served_demo
    from cascade.build import random_tiers

    url = getattr(args, "url", None)
    found = (
        []
        if args.from_log
        else [url]
        if url and served_demo(url)
        else []
        if url
        else random_tiers(policy)
    )
    demo_banner(args.command, found)
    return found


def meta(args: argparse.Namespace, policy: Policy) -> dict[str, Any]:
    from cascade.answers import DEMO_WARNING

    source = ", ".join(map(str, args.from_log)) if args.from_log else str(args.data)
    described = (
        "the demo tiers"
        if args.demo
        else f"`{args.policy}`"
        if args.policy
        else f"the server at {getattr(args, 'url', '')}"
    )
    random = random_of(args, policy)
    demo = bool(args.demo or random)
    return {
        "demo": demo,
        **({"warning": DEMO_WARNING} if demo else {}),
        **({"random_tiers": random} if random else {}),
        "data": source + (" (teacher: the strong tier's shadow answers)" if args.from_log else ""),
        "policy": described,
        "calibration": str(args.calibration) if args.calibration else None,
        "tier_names": {
            s: n for s in ("cheap", "strong") if (n := getattr(policy.route, s)) is not None
        },
    }


def parse_costs(pairs: list[str]) -> dict[str, float]:
    """``--cost TIER=PRICE`` flags as {tier or slot: price} (``UsageError`` for a bad one)."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise UsageError(f"--cost wants TIER=PRICE, got {pair!r}")
    return out


def eval_command(args: argparse.Namespace) -> int:
    from cascade.eval.data import DataError, load_items
    from cascade.eval.evaluate import run_tiers, slots_of, write_outputs
    from cascade.eval.from_log import log_rows
    from cascade.policy.costs import costs

    prices = parse_costs(args.cost)
    check_source(args)
    policy, settings = tier_policy(args)
    slots = slots_of(policy)
    if args.from_log:
        rows = log_rows(args.from_log, policy, labelled_only=True, **filters(args))
        errors: list[str] = []
    else:
        model = policy.models.cascade[0] if policy.models.cascade else "jev-latest"
        try:
            items = load_items(args.data, model=model, limit=args.limit)
        except DataError as exc:  # a bad line: its FILE:LINE, no traceback
            raise SystemExit(f"cascade eval: {exc}") from None
        rows, errors = asyncio.run(
            run_tiers(
                items,
                policy,
                settings,
                args.out,
                slots=slots,
                progress=not args.no_progress,
                strong_down=args.strong_down,
            )
        )
    for line in errors:
        print(f"eval: a tier failed on {line}", file=sys.stderr)
    summary = write_outputs(
        args.out,
        rows,
        slots=slots,
        price=costs(policy, prices),
        meta={**meta(args, policy), "failed_items": len(errors), "strong_down": args.strong_down},
    )
    cascade = summary["tiers"]["cascade"]
    if args.json:
        print(
            msgspec.json.encode(
                rounded(
                    {
                        "out": str(args.out),
                        "questions": summary["questions"],
                        "accuracy": cascade["accuracy"],
                        "escalation_rate": cascade["escalation_rate"],
                        "demo": summary["demo"],
                    }
                )
            ).decode()
        )
    else:
        print(table(args.out, summary))
    return 0


def table(out: Path, summary: dict[str, Any]) -> str:
    """Each tier's headline figures, rounded (all of them are in ``out/summary.json``)."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    lines = [
        f"{summary['questions']} questions of {summary['items']} items; figures, plots "
        f"and summary.md in {out}" + (" (DEMO: tiny random weights)" if summary["demo"] else ""),
        f"{'tier':<10}{'n':>6}{'accuracy':>10}{'macro F1':>10}{'ECE':>7}{'escalated':>11}",
    ]
    for name, tier in summary["tiers"].items():
        f1 = "-" if tier["macro_f1"] is None else f"{tier['macro_f1']:.3f}"
        ece = "-" if tier["ece"] is None else f"{tier['ece']:.3f}"
        lines.append(
            f"{name:<10}{tier['n']:>6}{pct(tier['accuracy']):>10}{f1:>10}{ece:>7}"
            f"{pct(tier.get('escalation_rate')):>11}"
        )
    return "\n".join(lines)
