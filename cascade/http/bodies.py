"""Request bodies: ``Content-Encoding`` decoding with a hard cap, and ``multipart/form-data``.

Both functions are pure and synchronous; the app reads the raw body (already capped at the
wire) and calls them before JSON decoding. The decompressed size is checked while inflating, so a
zstd or gzip bomb is refused after at most about ``limit`` bytes of output, never materialised.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import multipart
import zstandard

from cascade.errors import MalformedBody, PayloadTooLarge, UnsupportedMediaType
from cascade.request.parts import Part

# A zstd block of 4 compressed bytes (an RLE block) can expand to 128 KiB, the format's worst
# ratio. zstandard's decompressobj has no output cap of its own, so its input is bounded to
# ``room // _ZSTD_SLICE_DIVISOR`` bytes per call (at least 16): each call then yields at most about
# room / 16 + 512 KiB, and output stops within that of the limit. zlib takes an output cap.
_ZSTD_SLICE_DIVISOR = 16 * 32 * 1024
_ZSTD_MIN_SLICE = 16
# Each frame (zstd) or member (gzip) is fed slices that start at _FIRST_SLICE bytes and double up
# to _MAX_SLICE. What a finished frame leaves of its last slice is copied (``unused_data``), so the
# copy is at most about twice the frame itself: the work is linear in the body however many
# frames it holds. (Feeding each frame the whole rest of the body was quadratic: a 3.6 MB body of
# empty zstd frames took 35 s.)
_FIRST_SLICE = 64
_MAX_SLICE = 64 * 1024
_ZLIB_WBITS = 15  # zlib-wrapped deflate (RFC 1950)
_RAW_WBITS = -15  # raw deflate (RFC 1951), which some servers send as "deflate"
_GZIP_WBITS = 16 + 15  # gzip (RFC 1952)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the decompressed body exceeds the {limit}-byte limit")


def _undo(
    data: bytes,
    limit: int,
    start: Callable[[], Any],
    step: Callable[[Any, memoryview, int], bytes],
    max_slice: Callable[[int], int],
    *,
    many: bool,
) -> bytes:
    """``data`` decompressed frame after frame into at most ``limit`` bytes. ``start()`` begins a
    frame: a zlib or zstandard decompressobj, read through its ``eof`` and ``unused_data``.

    ``step(frame, piece, room)`` feeds one slice and returns its output; ``max_slice(room)`` bounds
    a slice by the room left. ``many``: frames may be concatenated (gzip members, zstd frames);
    otherwise anything after the first is trailing garbage.
    """
    out = bytearray()
    view = memoryview(data)
    pos = 0
    while True:
        frame = start()
        size = _FIRST_SLICE
        while not frame.eof:
            if pos >= len(view):
                raise MalformedBody("the compressed body is truncated")
            room = limit + 1 - len(out)
            piece = view[pos : pos + min(size, max_slice(room))]
            pos += len(piece)
            out += step(frame, piece, room)
            if len(out) > limit:  # one byte over the limit proves the excess
                raise _too_large(limit)
            size = min(2 * size, _MAX_SLICE)
        pos -= len(frame.unused_data)
        if pos >= len(view):
            return bytes(out)
        if not many:
            raise MalformedBody("trailing data after the compressed body")


def _inflate(data: bytes, wbits: int, limit: int, *, many: bool) -> bytes:
    # max_length caps each call's output; input that it leaves (unconsumed_tail) only remains
    # when the cap was reached, and then the body is over the limit anyway.
    return _undo(
        data,
        limit,
        lambda: zlib.decompressobj(wbits),
        lambda frame, piece, room: frame.decompress(piece, room),
        lambda room: _MAX_SLICE,
        many=many,
    )


def _gunzip(data: bytes, limit: int) -> bytes:
    return _inflate(data, _GZIP_WBITS, limit, many=True)


def _deflate(data: bytes, limit: int) -> bytes:
    # HTTP "deflate" means zlib-wrapped, but raw deflate is common in the wild: accept both, as
    # browsers and curl do, choosing by the zlib header (CM = 8 and a valid FCHECK).
    wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    return _inflate(data, _ZLIB_WBITS if wrapped else _RAW_WBITS, limit, many=False)


def _unzstd(data: bytes, limit: int) -> bytes:
    # The window is the decoder's one large allocation; no valid body needs one over the limit.
    window = 1 << min(31, max(10, (limit - 1).bit_length()))
    decompressor = zstandard.ZstdDecompressor(max_window_size=window)
    return _undo(
        data,
        limit,
        decompressor.decompressobj,
        lambda frame, piece, room: frame.decompress(piece),
        lambda room: max(_ZSTD_MIN_SLICE, room // _ZSTD_SLICE_DIVISOR),
        many=True,
    )


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
