"""Reading the keys file (``CASCADE_API_KEYS_FILE``) into ``Tenants``: every finding at once,
each as ``FILE:LINE: error: ...``.

Two formats. The TOML one has ``[[tenant]]`` tables (``cascade.tenants.model``) and an optional
``[limits]`` table. The old one holds one key per line (``#`` comments), each key one unnamed
tenant without limits. A file is the old format when every line that is not blank or a comment
is one token of key characters (no spaces, quotes, brackets or ``#``) and it does not decode as
TOML with a ``tenant`` or ``limits`` key; anything else is read as TOML and must validate.
Inline ``CASCADE_API_KEYS`` are unnamed tenants too. ``load_tenants`` is the one function that
reads keys: boot and reload call it (a failed reload keeps the tenants it had).
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from cascade.overrides import msgspec as messages
from cascade.policy.files import PolicyError
from cascade.policy.model import Policy
from cascade.policy.toml_keys import KeyPath, key_lines, locate
from cascade.settings import Settings, key_file_text
from cascade.tenants.keys import HASHED, Tenants, digest, from_hashed
from cascade.tenants.model import KeysFile, LimitsBackend, Tenant, TenantEntry
from cascade.tenants.overlay import tenant_policy

_TOKEN = re.compile(r"^[A-Za-z0-9._~+/=:-]+$")
TENANT_HEADER = re.compile(r"^\s*\[\[\s*tenant\s*\]\]")


class KeysFileError(PolicyError):
    """A keys file that cannot be used; ``messages`` are ``FILE:LINE: error: ...`` lines
    (reported as a policy file's are)."""


class Parsed(msgspec.Struct, frozen=True, kw_only=True):
    """A keys file as read: its tenants (old format: one unnamed entry per key) and backend."""

    entries: list[TenantEntry]
    backend: LimitsBackend
    plain: list[str]  # old-format keys, hashed when tenants are built
    toml: bool


def read_text(path: str) -> str:
    return key_file_text(
        path,
        "CASCADE_API_KEYS_FILE",
        what="API keys file",
        create="`cascade keys add NAME --file FILE`, or one key per line",
    )


def is_old_format(text: str) -> bool:
    lines = [line.strip() for line in text.splitlines()]
    content = [line for line in lines if line and not line.startswith("#")]
    if not all(_TOKEN.match(line) for line in content):
        return False
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return True
    return not ({"tenant", "limits"} & set(data))


def parse(text: str, filename: str) -> Parsed:
    """The keys file's text decoded and checked; ``KeysFileError`` lists every error."""
    if is_old_format(text):
        keys = [line.strip() for line in text.splitlines()]
        plain = [k for k in keys if k and not k.startswith("#")]
        return Parsed(entries=[], backend=LimitsBackend(), plain=plain, toml=False)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found_line = re.search(r"\(at line (\d+)", str(exc))
        line = found_line.group(1) if found_line else max(1, len(text.splitlines()))
        raise KeysFileError([f"{filename}:{line}: error: invalid TOML: {exc}"]) from None
    found = list(_findings(data))
    if not found:
        keys_file = msgspec.convert(data, KeysFile)
        found = list(_checks(keys_file))
    if found:
        lines = tenant_lines(text)
        raise KeysFileError(
            [f"{filename}:{locate(lines, path)}: error: {message}" for path, message in found]
        )
    return Parsed(entries=keys_file.tenant, backend=keys_file.limits, plain=[], toml=True)


def tenant_lines(text: str) -> dict[KeyPath, int]:
    """Key path -> line, with the i-th ``[[tenant]]`` table's keys under ``("tenant", i)``
    (``key_lines`` alone would put every tenant's keys at the first table)."""
    out = key_lines(text)
    rows = text.splitlines()
    starts = [n for n, row in enumerate(rows) if TENANT_HEADER.match(row)]
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(rows)
        for path, line in key_lines("\n".join(rows[start:end])).items():
            if path[:1] == ("tenant",):
                out[("tenant", str(i), *path[1:])] = start + line
    return out


def _findings(data: dict[str, Any]) -> Iterator[tuple[KeyPath, str]]:
    """Unknown keys and wrong types, each with its key path (msgspec stops at the first)."""
    for key in data:
        if key not in ("tenant", "limits"):
            yield (key,), f"unknown key `{key}` (known: limits, tenant)"
    tenants = data.get("tenant", [])
    if not isinstance(tenants, list):
        yield ("tenant",), "`tenant` must be an array of tables ([[tenant]])"
        tenants = []
    for i, table in enumerate(tenants):
        yield from _table(table, TenantEntry, ("tenant", str(i)), f"[[tenant]] #{i + 1}")
    if "limits" in data:
        yield from _table(data["limits"], LimitsBackend, ("limits",), "[limits]")


@functools.cache
def _fields(cls: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """``cls``'s fields by name (read once: ``msgspec.structs.fields`` evaluates annotations)."""
    return {f.encode_name: f for f in msgspec.structs.fields(cls)}


def _table(
    value: Any, cls: type[msgspec.Struct], path: KeyPath, what: str
) -> Iterator[tuple[KeyPath, str]]:
    if not isinstance(value, dict):
        yield path, f"{what} must be a table"
        return
    fields = _fields(cls)
    for key, item in value.items():
        if key not in fields:
            yield (*path, key), f"{what}: unknown key `{key}` (known: {', '.join(fields)})"
            continue
        try:
            msgspec.convert(item, fields[key].type)
        except msgspec.ValidationError as exc:
            yield (*path, key), f"{what}: `{key}`: {messages.split(str(exc))[0]}"
    for name, info in fields.items():
        required = info.default is msgspec.NODEFAULT and info.default_factory is msgspec.NODEFAULT
        if required and name not in value:
            yield path, f"{what} is missing the key `{name}`"


def _checks(keys_file: KeysFile) -> Iterator[tuple[KeyPath, str]]:
    """Duplicates, key hashes and the backend's URL."""
    names: dict[str, int] = {}
    hashes: dict[str, str] = {}
    for i, entry in enumerate(keys_file.tenant):
        path = ("tenant", str(i))
        if entry.name in names:
            yield (*path, "name"), f"tenant `{entry.name}` is defined twice"
        names.setdefault(entry.name, i)
        for key in entry.keys:
            if not HASHED.match(key):
                yield (
                    (*path, "keys"),
                    (
                        f"tenant `{entry.name}`: keys hold `sha256:` and 64 hex "
                        "digits (`cascade keys add` writes them), never a key"
                    ),
                )
            elif key in hashes:
                yield (
                    (*path, "keys"),
                    (f"tenant `{entry.name}`: a key of tenant `{hashes[key]}` is listed again"),
                )
            hashes.setdefault(key, entry.name)
    backend = keys_file.limits
    if backend.backend == "redis" and not (backend.url or "").startswith(
        ("redis://", "rediss://", "unix://")
    ):
        yield ("limits", "backend"), '[limits] backend = "redis" needs url = "redis://HOST:PORT/DB"'


def load_tenants(settings: Settings, policy: Policy | None = None) -> Tenants:
    """The tenants of ``settings`` (inline keys and the keys file), each tenant's ``policy``
    file resolved against ``policy`` (the gateway's). Without ``policy`` only the keys file
    itself is checked (at boot, before any weights load)."""
    inline = [Tenant(name="") for _ in settings.api_keys]
    keys = [(digest(k), t) for k, t in zip(settings.api_keys, inline, strict=True) if k]
    backend = None
    if settings.api_keys_file:
        path = settings.api_keys_file
        text = read_text(path)
        parsed = parse(text, path)
        backend = parsed.backend
        keys += [(digest(k), Tenant(name="")) for k in parsed.plain]
        base = Path(path).parent
        for i, entry in enumerate(parsed.entries):
            resolved = None
            if entry.policy is not None:
                where = f"{path}:{locate(tenant_lines(text), ('tenant', str(i), 'policy'))}"
                if policy is not None:
                    resolved = tenant_policy(base / entry.policy, policy, where=where)
                elif not (base / entry.policy).is_file():
                    raise KeysFileError(
                        [f"{where}: error: tenant policy {base / entry.policy}: no such file"]
                    )
            tenant = Tenant(
                name=entry.name, limits=entry.limits(), policy=resolved, expires=entry.expires
            )
            keys += [(from_hashed(k), tenant) for k in entry.keys]
    return Tenants(keys, backend)
