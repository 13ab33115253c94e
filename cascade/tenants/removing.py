"""``cascade keys remove``'s edits of a keys file's text: one key (by the start of its hash, as
``cascade keys list`` shows it) taken from one tenant, or a whole ``[[tenant]]`` table taken out;
every other byte of the file stays as it was."""

from __future__ import annotations

import re

import msgspec

from cascade.tenants.files import TENANT_HEADER, KeysFileError, Parsed, parse
from cascade.tenants.model import TenantEntry

_TABLE_HEADER = re.compile(r"^\s*\[")


def without_tenant(text: str, filename: str, name: str) -> str:
    """``text`` without tenant ``name``'s table (``KeysFileError`` if it cannot be)."""
    entries, rows, start, end = _table(text, filename, name)
    while end > start + 1 and not rows[end - 1].strip():  # the blank lines after it stay
        end -= 1
    while start > 0 and not rows[start - 1].strip():  # those before it go with it
        start -= 1
    out = "".join(rows[:start] + rows[end:])
    return _checked(out, filename, [e for e in entries if e.name != name])


def without_key(text: str, filename: str, name: str, prefix: str) -> tuple[str, str]:
    """``text`` with tenant ``name``'s one key whose hash starts with ``prefix`` (hex, with or
    without ``sha256:``) removed, and that hash (``KeysFileError`` if it cannot be)."""
    entries, rows, start, end = _table(text, filename, name)
    entry = next(e for e in entries if e.name == name)
    hex_prefix = prefix.removeprefix("sha256:").lower()
    found = [k for k in entry.keys if hex_prefix and k[7:].startswith(hex_prefix)]
    if len(found) != 1:
        what = "no key" if not found else f"{len(found)} keys"
        raise KeysFileError(
            [
                f"{filename}: error: tenant `{name}` has {what} whose hash starts "
                f"with `{prefix}` (see `cascade keys list`)"
            ]
        )
    if len(entry.keys) == 1:
        raise KeysFileError(
            [
                f"{filename}: error: `{found[0][:15]}…` is tenant `{name}`'s only "
                f"key: remove the tenant instead (`cascade keys remove {name}`)"
            ]
        )
    block = "".join(rows[start:end])
    quoted = rf"""(["']){re.escape(found[0])}\1"""
    edited, count = re.subn(rf",\s*{quoted}", "", block, count=1)  # after another item
    if not count:
        edited, count = re.subn(rf"{quoted}\s*,?[ \t]*", "", block, count=1)
    out = "".join(rows[:start]) + edited + "".join(rows[end:])
    expected = [
        msgspec.structs.replace(e, keys=[k for k in e.keys if k != found[0]])
        if e.name == name
        else e
        for e in entries
    ]
    return _checked(out, filename, expected), found[0]


def _table(text: str, filename: str, name: str) -> tuple[list[TenantEntry], list[str], int, int]:
    """The file's tenants, its rows, and the rows ``[start, end)`` of tenant ``name``'s table."""
    parsed: Parsed = parse(text, filename)
    if not parsed.toml:
        raise KeysFileError(
            [
                f"{filename}: error: the file holds one key per line (the old "
                "format): delete the key's line by hand"
            ]
        )
    names = [e.name for e in parsed.entries]
    if name not in names:
        raise KeysFileError([f"{filename}: error: no tenant `{name}`"])
    rows = text.splitlines(keepends=True)
    starts = [n for n, row in enumerate(rows) if TENANT_HEADER.match(row)]
    if len(starts) != len(names):
        raise KeysFileError(
            [
                f"{filename}: error: tenants written as inline tables cannot be "
                "edited here; write them as [[tenant]] tables"
            ]
        )
    start = starts[names.index(name)]
    end = next((n for n in range(start + 1, len(rows)) if _TABLE_HEADER.match(rows[n])), len(rows))
    return parsed.entries, rows, start, end


def _checked(out: str, filename: str, expected: list[TenantEntry]) -> str:
    """``out``, when it reads back as exactly the ``expected`` tenants (never write a bad edit)."""
    try:
        entries = parse(out, filename).entries
    except KeysFileError:
        entries = None
    if entries != expected:
        raise KeysFileError(
            [f"{filename}: error: could not make this edit safely; edit the file by hand"]
        )
    return out
