"""Bearer keys, stored hashed: ``sha256:<hex>``. A presented key is hashed, then its digest is
looked up in a dict of every stored digest: one hash and one lookup whatever the number of keys,
and the same for a wrong key as for no key (an absent one is hashed as ""). The lookup's time
says nothing about how close a key was: it hashes the digest (with the interpreter's secret
hash seed) and compares only digests that share a bucket, which no one can choose without a
sha256 preimage."""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime

from cascade.errors import Unauthorized
from cascade.tenants.model import ANONYMOUS, LimitsBackend, Tenant

PREFIX = "sha256:"
HASHED = re.compile(r"^sha256:[0-9a-f]{64}$")
KEY_PREFIX = "csk-"  # new keys: csk- and 43 url-safe characters (256 bits)


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def hashed(key: str) -> str:
    """How ``key`` is written to a keys file."""
    return PREFIX + digest(key).hex()


def from_hashed(text: str) -> bytes:
    """The digest of a ``sha256:<hex>`` entry (checked by ``HASHED`` first)."""
    return bytes.fromhex(text.removeprefix(PREFIX))


class Tenants:
    """Every key's digest and its tenant, and the ``[limits]`` backend. No keys: auth is off
    and every request is the anonymous tenant, without limits."""

    def __init__(
        self, keys: list[tuple[bytes, Tenant]], backend: LimitsBackend | None = None
    ) -> None:
        self._keys = dict(keys)  # a digest listed twice: its last tenant
        self.backend = backend or LimitsBackend()

    def __eq__(self, other: object) -> bool:
        """The same keys, tenants and backend (a reload that changes none is ``unchanged``)."""
        if not isinstance(other, Tenants):
            return NotImplemented
        return (self._keys, self.backend) == (other._keys, other.backend)

    __hash__ = None  # type: ignore[assignment]  # mutable holder: compared, never hashed

    def key_counts(self) -> dict[str, int]:
        """Each tenant name's number of keys ("": the unnamed ones)."""
        counts: dict[str, int] = {}
        for tenant in self._keys.values():
            counts[tenant.name] = counts.get(tenant.name, 0) + 1
        return counts

    def fingerprint(self) -> str:
        """A hash of every key's digest and tenant name: equal when the same keys open the same
        tenants (audit records hold it, never a key)."""
        found = hashlib.sha256()
        for key, tenant in sorted(self._keys.items()):
            found.update(key + tenant.name.encode() + b"\0")
        return found.hexdigest()

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def find(self, token: str | None) -> Tenant | None:
        """The tenant whose key ``token`` is, expired or not; None when it is no key."""
        if not self._keys:
            return ANONYMOUS
        found = self._keys.get(digest(token or ""))  # no key: the same hash and lookup
        return found if token else None

    def verify(self, token: str | None, now: datetime | None = None) -> Tenant:
        """The tenant of ``token``; ``Unauthorized`` for a missing, wrong or expired key."""
        tenant = self.find(token)
        if tenant is None:
            raise Unauthorized("missing or invalid API key (send Authorization: Bearer <key>)")
        if tenant.expires is not None and tenant.expires <= (now or datetime.now(UTC)):
            raise Unauthorized("API key expired")
        return tenant
