"""``cascade keys add|remove|list``: the tenants of an API keys file (``CASCADE_API_KEYS_FILE``;
docs/tenants.md). ``add`` prints a new key once on stdout and writes only its hash; ``remove``
takes out one key (by the start of its hash) or a whole tenant; ``list`` never shows a key.
Edits hold the file's lock from read to write (``cascade.tenants.rewrite``)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any


def register(groups: dict[str, Any]) -> None:
    keys = groups["keys"]
    add = keys.add_parser(
        "add",
        help="add a new key to tenant NAME (created if needed); print it once",
        description="Create a random key for tenant NAME (the tenant is added when new), write "
        "only its sha256 hash to FILE (created with mode 0600; the rest of the file is kept as "
        "it is) and print the key on stdout, once: it is not stored anywhere.",
    )
    add.add_argument("name", metavar="NAME", help="tenant name (letters, digits, _ . -)")
    add.add_argument(
        "--file",
        required=True,
        type=Path,
        metavar="FILE",
        help="the keys file (CASCADE_API_KEYS_FILE)",
    )
    add.set_defaults(func=add_command)
    remove = keys.add_parser(
        "remove",
        help="remove one key of tenant NAME (--key HASH_PREFIX), or the whole tenant",
        description="Remove from FILE the key of tenant NAME whose sha256 hash starts with "
        "HASH_PREFIX (hex digits as `cascade keys list` shows them; they must match one key), "
        "or, without --key, tenant NAME's whole table. The rest of the file is kept as it is; "
        "a running gateway applies the change on its next reload.",
    )
    remove.add_argument("name", metavar="NAME", help="tenant name")
    remove.add_argument(
        "--key", metavar="HASH_PREFIX", help="the start of the key's hash (at least 8 hex digits)"
    )
    remove.add_argument(
        "--file",
        required=True,
        type=Path,
        metavar="FILE",
        help="the keys file (CASCADE_API_KEYS_FILE)",
    )
    remove.set_defaults(func=remove_command)
    show = keys.add_parser(
        "list",
        help="tenants, key counts and hash prefixes, limits, expiry (never keys)",
        description="List FILE's tenants: names, how many keys (and the first hex digits of "
        "each hash), limits, policy and expiry. Keys themselves are never stored or shown.",
    )
    show.add_argument(
        "--file",
        required=True,
        type=Path,
        metavar="FILE",
        help="the keys file (CASCADE_API_KEYS_FILE)",
    )
    show.set_defaults(func=list_command)


def add_command(args: argparse.Namespace) -> int:
    from cascade.tenants.editing import with_key
    from cascade.tenants.keys import hashed, new_key
    from cascade.tenants.rewrite import edit

    path: Path = args.file
    key = new_key()
    edit(path, lambda text: with_key(text, str(path), args.name, hashed(key)))
    print(key)
    return 0


def remove_command(args: argparse.Namespace) -> int:
    from cascade.cli.errors import UsageError
    from cascade.tenants.files import KeysFileError
    from cascade.tenants.removing import without_key, without_tenant
    from cascade.tenants.rewrite import edit

    path: Path = args.file
    if not path.exists():
        raise KeysFileError([f"{path}: error: no such keys file"])
    prefix: str | None = args.key
    if prefix is not None and not re.fullmatch(r"(sha256:)?[0-9a-fA-F]{8,64}", prefix):
        raise UsageError(
            f"--key {prefix}: expected at least 8 hex digits of the key's hash, "
            "as `cascade keys list` shows them"
        )
    removed: list[str] = []

    def change(text: str) -> str:
        if prefix is None:
            return without_tenant(text, str(path), args.name)
        out, hashed = without_key(text, str(path), args.name, prefix)
        removed.append(hashed)
        return out

    edit(path, change)
    what = f"key {removed[0][7:15]}… of tenant" if removed else "tenant"
    print(f"{path}: removed {what} {args.name}", file=sys.stderr)
    return 0


def list_command(args: argparse.Namespace) -> int:
    import msgspec

    from cascade.tenants.files import parse, read_text

    path = str(args.file)
    parsed = parse(read_text(path), path)
    if not parsed.toml:
        print(f"{path}: {len(parsed.plain)} unnamed keys (one key per line; no limits)")
        return 0
    rows = [("tenant", "keys", "limits", "policy", "expires")]
    for entry in parsed.entries:
        limits = msgspec.structs.asdict(entry.limits())
        rows.append(
            (
                entry.name,
                f"{len(entry.keys)} " + " ".join(k[7:15] + "…" for k in entry.keys),
                " ".join(f"{k}={v}" for k, v in limits.items() if v is not None) or "-",
                entry.policy or "-",
                entry.expires.isoformat() if entry.expires else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    backend = parsed.backend
    if backend.backend != "local":
        print(
            f"limits: {backend.backend} (on_error={backend.on_error}, "
            f"timeout_s={backend.timeout_s})"
        )
    return 0
