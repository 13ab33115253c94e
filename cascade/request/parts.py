"""What a multipart body's parts are, once split (by ``cascade.http.bodies``)."""

from __future__ import annotations

import msgspec


class Part(msgspec.Struct, frozen=True):
    """One ``multipart/form-data`` part other than ``request`` (an ``asset-N`` image)."""

    name: str
    data: bytes
    content_type: str | None = None
    filename: str | None = None
