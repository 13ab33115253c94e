"""``cascade audit``: the admin audit log of a decision store (``cascade.audit``)."""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import time
from typing import TYPE_CHECKING, Any

from cascade.cli.errors import ConfigError
from cascade.cli.numbers import count
from cascade.cli.usage import since_of
from cascade.store import log_source, missing

if TYPE_CHECKING:
    from cascade.schema import AuditRecord

COLUMNS = ("time (UTC)", "action", "actor", "client", "outcome", "replica", "policy", "changed")


def register(groups: dict[str, Any]) -> None:
    p = groups["<top>"].add_parser(
        "audit",
        help="the admin audit log: reloads, dry runs, freezes, key changes",
        description="Print the admin audit records of a decision store, oldest first: when, "
        "which admin key (by its name, never the key) or signal/watch/fleet, from where, what "
        "(policy, calibration and key hashes before -> after, the policy's changed tables) and "
        "the outcome. Exit 0; 1 for a bad log.",
    )
    p.add_argument(
        "--from-log",
        type=log_source,
        required=True,
        metavar="FILE|URL",
        help="a decision log (SQLite file) or a fleet's postgresql:// URL",
    )
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="only records since WHEN: an ISO 8601 date or time (UTC unless it "
        "names an offset), unix seconds, or an age such as 30m, 24h, 7d",
    )
    p.add_argument(
        "--limit", type=count, default=1000, metavar="N", help="the newest N records (default 1000)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per record")
    p.set_defaults(func=audit_command)


def audit_command(args: argparse.Namespace) -> int:
    import msgspec

    from cascade.audit.log import read
    from cascade.store import NotADecisionLog

    for path in missing([args.from_log]):
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    since = 0.0 if args.since is None else since_of(args.since, time.time())
    try:
        records = read(str(args.from_log), since=since, limit=args.limit)
    except (NotADecisionLog, ConnectionError) as exc:
        raise ConfigError(str(exc)) from None
    if args.json:
        for record in records:
            print(msgspec.json.encode(record).decode())
    else:
        print(table(records))
    return 0


def table(records: list[AuditRecord]) -> str:
    """One line per record, columns aligned; the policy hash as ``before -> after``."""
    rows = [COLUMNS, *(_cells(record) for record in records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join(
        "  ".join(
            [*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]
        ).rstrip()
        for row in rows
    )


def _cells(record: AuditRecord) -> tuple[str, ...]:
    when = dt.datetime.fromtimestamp(record.ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    before, after = record.before.get("policy", "")[:12], record.after.get("policy", "")[:12]
    policy = before if before == after else f"{before} -> {after}"
    changed = ", ".join(record.changed) or ", ".join(
        f"{key}={value}" for key, value in record.detail.items()
    )
    return (
        when,
        record.action,
        record.actor,
        record.client or "-",
        record.outcome,
        record.replica,
        policy,
        changed,
    )
