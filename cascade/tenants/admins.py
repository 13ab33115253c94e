"""The admin keys (``CASCADE_ADMIN_KEYS``, ``CASCADE_ADMIN_KEYS_FILE``) as named ``Tenants``, so
an admin action is recorded by its key's name (``cascade.audit``), never the key.

The file takes the API keys file's formats (``cascade.tenants.files``): TOML ``[[tenant]]``
tables, each a ``name`` and ``keys`` (``sha256:`` hashes; limits and policies mean nothing here),
or the old one key per line, whose keys are named by position: ``admin-1``, ``admin-2``, ...
Inline ``CASCADE_ADMIN_KEYS`` are ``admin-env-1``, ``admin-env-2``, ...
"""

from __future__ import annotations

from cascade.settings import Settings, key_file_text
from cascade.tenants.files import parse
from cascade.tenants.keys import Tenants, digest, from_hashed
from cascade.tenants.model import Tenant


def load_admins(settings: Settings) -> Tenants:
    """Every admin key's digest and name; ``SettingsError`` (unreadable file) or
    ``KeysFileError`` (``FILE:LINE: error:`` lines)."""
    keys = [
        (digest(key), Tenant(name=f"admin-env-{n}"))
        for n, key in enumerate((k for k in settings.admin_keys if k), 1)
    ]
    path = settings.admin_keys_file
    if path:
        text = key_file_text(
            path,
            "CASCADE_ADMIN_KEYS_FILE",
            what="admin keys file",
            create="one key per line, or [[tenant]] tables",
        )
        parsed = parse(text, path)
        keys += [(digest(key), Tenant(name=f"admin-{n}")) for n, key in enumerate(parsed.plain, 1)]
        keys += [
            (from_hashed(key), Tenant(name=entry.name))
            for entry in parsed.entries
            for key in entry.keys
        ]
    return Tenants(keys)
