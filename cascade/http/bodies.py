"""Request bodies: ``Content-Encoding`` decoding with a hard cap, and ``multipart/form-data``.

Both functions are pure and synchronous; the app reads the raw body (already capped at the
wire) and calls them before JSON decoding. The decompressed size is checked while inflating, so a
zstd or gzip bomb is refused after at most about ``limit`` bytes of output, never materialised.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import msgspec
import multipart
import zstandard

from cascade.errors import MalformedBody, PayloadTooLarge, UnsupportedMediaType

# A zstd block of 4 compressed bytes (an RLE block) can expand to 128 KiB, the format's worst
# ratio. zstandard's decompressobj has no output cap of its own, so input goes in slices of
# ``room // _ZSTD_SLICE_DIVISOR`` bytes (at least 16): each call then yields at most about
# room / 16 + 512 KiB, and output stops within that of the limit.
_ZSTD_SLICE_DIVISOR = 16 * 32 * 1024
_ZSTD_MIN_SLICE = 16
_ZSTD_MAX_SLICE = 64 * 1024
_ZLIB_WBITS = 15  # zlib-wrapped deflate (RFC 1950)
_RAW_WBITS = -15  # raw deflate (RFC 1951), which some servers send as "deflate"
_GZIP_WBITS = 16 + 15  # gzip (RFC 1952)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the decompressed body exceeds the {limit}-byte limit")


def _inflate(data: bytes, wbits: int, limit: int, *, members: bool) -> bytes:
    """zlib/raw/gzip data, decompressed into at most ``limit`` bytes.

    ``members``: gzip allows several concatenated members; anything after the end of the
    stream is otherwise trailing garbage and refused.
    """
    out = bytearray()
    while True:
        inflater = zlib.decompressobj(wbits)
        pending = data
        while not inflater.eof:
            # max_length bounds this call's output: one byte over the limit proves the excess.
            piece = inflater.decompress(pending, limit + 1 - len(out))
            out += piece
            if len(out) > limit:
                raise _too_large(limit)
            pending = inflater.unconsumed_tail
            if not piece and not pending:
                raise MalformedBody("the compressed body is truncated")
        data = inflater.unused_data
        if not data:
            return bytes(out)
        if not members:
            raise MalformedBody("trailing data after the compressed body")


def _gunzip(data: bytes, limit: int) -> bytes:
    return _inflate(data, _GZIP_WBITS, limit, members=True)


def _deflate(data: bytes, limit: int) -> bytes:
    # HTTP "deflate" means zlib-wrapped, but raw deflate is common in the wild: accept both, as
    # browsers and curl do, choosing by the zlib header (CM = 8 and a valid FCHECK).
    wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    return _inflate(data, _ZLIB_WBITS if wrapped else _RAW_WBITS, limit, members=False)


def _unzstd(data: bytes, limit: int) -> bytes:
    # The window is the decoder's one large allocation; no valid body needs one over the limit.
    window = 1 << min(31, max(10, (limit - 1).bit_length()))
    decompressor = zstandard.ZstdDecompressor(max_window_size=window)
    out = bytearray()
    while True:  # one decompressobj per frame: frames may be concatenated
        frame = decompressor.decompressobj()
        pos = 0
        while not frame.eof:
            if pos >= len(data):
                raise MalformedBody("the compressed body is truncated")
            room = limit + 1 - len(out)
            step = min(_ZSTD_MAX_SLICE, max(_ZSTD_MIN_SLICE, room // _ZSTD_SLICE_DIVISOR))
            out += frame.decompress(data[pos : pos + step])
            pos += step
            if len(out) > limit:
                raise _too_large(limit)
        # unused_data is what the frame did not need of the last slice only.
        data = frame.unused_data + data[pos:]
        if not data:
            return bytes(out)


def _identity(data: bytes, limit: int) -> bytes:
    if len(data) > limit:
        raise PayloadTooLarge(f"the body exceeds the {limit}-byte limit")
    return data


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "zstd": _unzstd,
    "gzip": _gunzip,
    "x-gzip": _gunzip,
    "deflate": _deflate,
    "identity": _identity,
}


def decode_content(body: bytes, content_encoding: str | None, *, limit: int) -> bytes:
    """``body`` with every coding of ``content_encoding`` undone, last applied first.

    Each stage's output is capped at ``limit`` bytes: ``PayloadTooLarge`` (naming the limit) as
    soon as it would pass it. Corrupt or truncated data raises ``MalformedBody``; a coding other
    than zstd, gzip, x-gzip, deflate or identity raises ``UnsupportedMediaType``.
    """
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    unknown = [c for c in codings if c not in _DECODERS]
    if unknown:
        raise UnsupportedMediaType(
            f"unsupported Content-Encoding {unknown[0]!r}; use zstd, gzip, deflate or identity"
        )
    body = _identity(body, limit)
    for coding in reversed(codings):
        try:
            body = _DECODERS[coding](body, limit)
        except (zlib.error, zstandard.ZstdError) as exc:
            raise MalformedBody(f"the body is not valid {coding} data: {exc}") from exc
    return body


# ---------------------------------------------------------------- multipart/form-data


class Part(msgspec.Struct, frozen=True):
    """One ``multipart/form-data`` part other than ``request`` (an ``asset-N`` image)."""

    name: str
    data: bytes
    content_type: str | None = None
    filename: str | None = None


REQUEST_PART = "request"


def split_multipart(
    body: bytes, content_type: str, *, limit_parts: int
) -> tuple[bytes, dict[str, Part]]:
    """The JSON bytes of the ``request`` part, and every other part by name.

    This is what typesafe-sdk sends with assets: a ``request`` part (``application/json``)
    first, then one part per image named ``asset-N``. ``limit_parts`` caps the parts other than
    ``request`` (``PayloadTooLarge``). A missing boundary, a broken stream, a part without a
    name, a repeated name or a missing ``request`` part raise ``MalformedBody``.
    """
    mime, options = multipart.parse_options_header(content_type)
    if mime != "multipart/form-data" or not options.get("boundary"):
        raise MalformedBody("multipart bodies must be multipart/form-data with a boundary")
    parts: dict[str, Part] = {}
    chunks: list[bytes] = []
    segment: multipart.MultipartSegment | None = None
    try:
        with multipart.PushMultipartParser(
            options["boundary"], max_segment_count=limit_parts + 1
        ) as parser:
            # parse(b"") marks the end of input, so a truncated stream raises instead of ending.
            for event in (*parser.parse(body), *parser.parse(b"")):
                if isinstance(event, multipart.MultipartSegment):
                    segment, chunks = event, []
                elif event:
                    chunks.append(bytes(event))
                elif segment is not None:
                    _add_part(parts, segment, b"".join(chunks))
    except multipart.ParserLimitReached as exc:
        raise PayloadTooLarge(
            f"the multipart body has more than the {limit_parts}-part limit of assets"
        ) from exc
    except multipart.MultipartError as exc:
        raise MalformedBody(f"invalid multipart/form-data body: {exc}") from exc
    request = parts.pop(REQUEST_PART, None)
    if request is None:
        raise MalformedBody("the multipart body has no 'request' part")
    return request.data, parts


def _add_part(parts: dict[str, Part], segment: multipart.MultipartSegment, data: bytes) -> None:
    if not segment.name:
        raise MalformedBody("a multipart part has no name")
    if segment.name in parts:
        raise MalformedBody(f"the multipart part {segment.name!r} appears twice")
    parts[segment.name] = Part(segment.name, data, segment.content_type, segment.filename)
