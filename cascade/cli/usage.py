"""``cascade usage``: who spent what, per tenant and tier, from decision logs.

Reads the rows of one or more decision log files (``--from-log``, repeat for rotated files),
optionally since a time and for one tenant, and prints requests, questions, input tokens and
cost per tenant and tier (``cascade.eval.spend``) as a table, or JSON with ``--json``. Prices
are ``cascade eval``'s: the policy's ``[cost]`` with ``--policy``, else the defaults by kind
(cheap tier: laya's, strong tier: clef's), and ``--cost TIER=PRICE`` over both.
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import re
import time
from pathlib import Path
from typing import Any

from cascade.cli.errors import ConfigError, UsageError
from cascade.store import log_source, missing

DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def register(groups: dict[str, Any]) -> None:
    usage = groups["<top>"].add_parser(
        "usage",
        help="spend per tenant and tier, from decision logs",
        description="Requests, questions, input tokens and cost per tenant and tier, read from "
        "decision logs (cascade serve --decision-log). Cost: price per 1000 input tokens, as "
        "cascade eval computes it.",
    )
    usage.add_argument(
        "--from-log",
        type=log_source,
        action="append",
        required=True,
        metavar="FILE|URL",
        help="a decision log (repeat for rotated files: "
        "FILE.1, FILE.2, ...), or the postgresql:// URL of a fleet's store",
    )
    filter_flags(usage)
    usage.add_argument(
        "--policy",
        type=Path,
        metavar="P",
        help="the policy whose [cost] prices the tiers (default: laya 1, "
        "clef/upstream 20 per 1000 input tokens)",
    )
    usage.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="TIER=PRICE",
        help="price per 1000 input tokens of a tier (name, or cheap/strong)",
    )
    usage.add_argument("--json", action="store_true", help="print one JSON object, no table")
    usage.set_defaults(func=usage_command)


def filter_flags(parser: argparse.ArgumentParser) -> None:
    """``--since``/``--tenant``: which rows of the decision log are read (filtered in SQL)."""
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only requests since WHEN: an ISO 8601 date or time (UTC unless it "
        "names an offset), unix seconds, or an age such as 30m, 24h, 7d",
    )
    parser.add_argument(
        "--tenant", metavar="NAME", help='one tenant only ("" for requests without one)'
    )


def filters(args: argparse.Namespace) -> dict[str, Any]:
    """``read_rows``' keywords from ``filter_flags``."""
    return {
        "since": None if args.since is None else since_of(args.since, time.time()),
        "tenant": args.tenant,
    }


def since_of(text: str, now: float) -> float:
    """``--since``'s unix time: an age (``24h``), unix seconds, or an ISO 8601 date/time."""
    value = text.strip()
    if (age := DURATION.fullmatch(value)) is not None:
        return now - float(age.group(1)) * UNIT_S[age.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"--since {text!r}: expected an ISO 8601 date or time "
            "(2026-12-01, 2026-12-01T09:30Z), unix seconds, or an age such as "
            "30m, 24h, 7d"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def usage_command(args: argparse.Namespace) -> int:
    import msgspec

    from cascade.cli.eval import parse_costs
    from cascade.cli.summary import rounded
    from cascade.eval.spend import as_json, usage
    from cascade.policy.costs import DEFAULT_COST, costs
    from cascade.policy.files import load_policy
    from cascade.store import NotADecisionLog, read_rows

    overrides = parse_costs(args.cost)
    found_filters = filters(args)
    since = found_filters["since"]
    for path in missing(args.from_log):
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    price = (
        costs(load_policy(args.policy))
        if args.policy is not None
        else {"cheap": DEFAULT_COST["laya"], "strong": DEFAULT_COST["clef"]}
    )

    def rows() -> Any:
        for path in args.from_log:
            for row in read_rows(path, **found_filters):
                yield str(path), row

    try:
        found = usage(rows(), {**price, **overrides}, overrides)
    except NotADecisionLog as exc:
        raise ConfigError(str(exc)) from None
    report = {
        "files": [str(p) for p in args.from_log],
        "since": since,
        "tenant": args.tenant,
        **as_json(found),
    }
    if args.json:
        print(msgspec.json.encode(rounded(report)).decode())
    else:
        print(table(report))
    return 0


def table(report: dict[str, Any]) -> str:
    """One line per tenant and tier, then the totals per tier."""
    since = (
        ""
        if report["since"] is None
        else " since "
        + dt.datetime.fromtimestamp(report["since"], dt.UTC).isoformat(timespec="seconds")
    )
    prices = ", ".join(f"{t} {p:g}" for t, p in report["prices_per_1k_tokens"].items())
    lines = [
        f"{report['log_rows']} rows of {', '.join(report['files'])}{since}; cost per "
        f"1000 input tokens: {prices or '-'}",
        f"{'tenant':<16}{'tier':<10}{'requests':>10}{'questions':>11}{'final':>9}"
        f"{'input tokens':>14}{'cost':>12}",
    ]
    for line in [*report["rows"], *report["total"]]:
        tenant = line["tenant"] or "(none)"
        lines.append(
            f"{tenant:<16}{line['tier']:<10}{line['requests']:>10}"
            f"{line['questions']:>11}{line['final']:>9}{line['input_tokens']:>14,.0f}"
            f"{line['cost']:>12,.2f}"
        )
    if not report["rows"]:
        lines.append("(no requests)")
    if report["rows_without_tokens"]:
        lines.append(
            f"{report['rows_without_tokens']} rows come from logs written before "
            "token counts were logged: their tokens and cost count 0"
        )
    return "\n".join(lines)
