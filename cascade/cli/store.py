"""``cascade store migrate URL``: create or upgrade the PostgreSQL decision store's schema.

Serving does the same at boot; both take an advisory lock, so replicas and this command may
run at once.
"""

from __future__ import annotations

import argparse
from typing import Any

from cascade.cli.errors import ConfigError


def register(groups: dict[str, Any]) -> None:
    migrate = groups["store"].add_parser(
        "migrate",
        help="create or upgrade the decision store's schema at URL",
        description="Create the decision store's tables in a PostgreSQL database, or upgrade "
        "them to this cascade's schema (safe while gateways boot against it).",
    )
    migrate.add_argument(
        "url",
        metavar="URL",
        help="postgresql://USER@HOST:PORT/DB (password in the URL, PGPASSWORD "
        "or CASCADE_DECISION_LOG_PASSWORD_FILE)",
    )
    migrate.set_defaults(func=migrate_command)


def migrate_command(args: argparse.Namespace) -> int:
    from cascade.store import is_url
    from cascade.store.postgres import migrate, safe_url

    if not is_url(args.url):
        raise ConfigError(
            f"{args.url!r}: not a postgresql:// URL (a SQLite decision log "
            "needs no migration: the gateway migrates it when it opens it)"
        )
    try:
        found, now = migrate(args.url)
    except Exception as exc:
        raise ConfigError(
            f"cannot migrate {safe_url(args.url)}: {' '.join(str(exc).split())}"
        ) from None
    print(
        f"{safe_url(args.url)}: schema {found} -> {now}"
        if found != now
        else f"{safe_url(args.url)}: schema {now}, up to date"
    )
    return 0
