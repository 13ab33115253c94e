"""``cascade keys add``'s edit of a keys file's text: one hash added to one tenant's ``keys``
(the tenant appended when new); every other byte of the file stays as it was."""

from __future__ import annotations

import json

import msgspec

from cascade.tenants.files import TENANT_HEADER, KeysFileError, is_old_format, parse, tenant_lines
from cascade.tenants.model import TenantName

NEW_FILE = "# cascade API keys (CASCADE_API_KEYS_FILE): hashes only, see `cascade keys --help`\n"


def with_key(text: str, filename: str, name: str, hashed: str) -> str:
    """``text`` with ``hashed`` added to tenant ``name`` (``KeysFileError`` if it cannot be)."""
    try:
        msgspec.convert(name, TenantName)
    except msgspec.ValidationError:
        raise KeysFileError(
            [
                f"{filename}: error: tenant name `{name}`: letters, digits and "
                "_ . - only, 64 at most, starting with a letter or digit"
            ]
        ) from None
    if text.strip() and is_old_format(text):
        raise KeysFileError(
            [
                f"{filename}: error: the file holds one key per line (the old "
                "format); move its keys to [[tenant]] tables first"
            ]
        )
    entries = parse(text, filename).entries
    rows = text.splitlines(keepends=True)
    starts = [n for n, row in enumerate(rows) if TENANT_HEADER.match(row)]
    if len(starts) != len(entries):
        raise KeysFileError(
            [
                f"{filename}: error: tenants written as inline tables cannot be "
                "edited here; write them as [[tenant]] tables"
            ]
        )
    names = [e.name for e in entries]
    if name not in names:
        block = f"\n[[tenant]]\nname = {json.dumps(name)}\nkeys = [{json.dumps(hashed)}]\n"
        sep = "" if not text or text.endswith("\n") else "\n"
        out = (text or NEW_FILE) + sep + block
    else:
        i = names.index(name)
        lines = tenant_lines(text)
        line = lines.get(("tenant", str(i), "keys"))
        if line is None:  # after its name
            at_name = lines.get(("tenant", str(i), "name"), starts[i] + 1)
            rows.insert(at_name, f"keys = [{json.dumps(hashed)}]\n")
        else:
            row = rows[line - 1]
            at = row.index("[", row.index("=")) + 1
            rest = row[at:].strip()
            item = json.dumps(hashed) + ("," if not rest else "" if rest[0] == "]" else ", ")
            rows[line - 1] = row[:at] + item + row[at:]
        out = "".join(rows)
    found = parse(out, filename).entries
    if not any(e.name == name and hashed in e.keys for e in found):  # never write a bad edit
        raise KeysFileError(
            [f"{filename}: error: could not add the key to tenant `{name}`; edit the file by hand"]
        )
    return out
