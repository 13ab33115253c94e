"""Request images: decoding references, checking each image, and gathering them in order.

Two wire forms carry images:

- Ollama / Cloudflare ``images``: base64 strings, ``data:image/...;base64,`` URLs, or Cloudflare's
  ``{"content_type", "base64"}`` objects. Remote ``http(s)://`` URLs are refused (422): the
  gateway never fetches on a client's behalf.
- TypeSafe ``assets``: placeholder -> ``{"type": "image", "data_base64" | "part"}``, where
  ``part`` names an ``asset-N`` part of a multipart body. The placeholders (``<image:...>`` or the
  caller's alias) stay in ``state``/``instructions`` as plain text; engines receive the images as
  one list, ``images`` first and then ``assets`` in the request's order, so a tier that can see
  images (Clef-flash) gets them in the order the client declared them.

Images are checked here, never decoded, in two passes so that nothing is read that cannot fit:
first every image's header (format, pixel count, aspect ratio, and the request's pixel total),
then each JPEG's marker structure up to EOI with its scan count, the one thing besides pixels
that a decode's cost grows with (``cascade.request.jpeg``). Both are work linear in the bytes, and
they bound what decoding an image can cost. The tier that reads the pixels decodes each image
once (the Clef tier, one at a time) and refuses data corrupt inside the compressed stream there,
with a 422 naming the image; a remote tier gets the original bytes. Callers run
``collect_images`` on the ``DecodePool``.

The format is detected from the bytes; an asset's ``format`` and a part's content type are not
trusted (the SDK labels unknown images ``application/octet-stream``).
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from PIL import Image as PILImage

from cascade.calls import Image
from cascade.errors import PayloadTooLarge, ValidationFailed
from cascade.request.jpeg import count_scans
from cascade.request.parts import Part
from cascade.schema import LIMITS, Limits, RequestEnvelope, SystemOneRequest

_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
_FORMATS = tuple(_MIME)

BodyLoc = Sequence[str | int]


def _invalid(loc: BodyLoc, msg: str, kind: str = "value_error") -> ValidationFailed:
    return ValidationFailed.at(list(loc), msg, kind)


def read_header(data: bytes, *, limits: Limits = LIMITS, loc: BodyLoc = ()) -> Image:
    """``data``'s format and size from its header, checked; no pixel is decoded.

    Raises ``PayloadTooLarge`` over ``limits.max_image_bytes`` or ``max_image_pixels`` and
    ``ValidationFailed`` at ``loc`` for another format, corrupt data, or an aspect ratio over
    ``max_image_aspect`` (the Clef tier's image processor refuses those).
    """
    where = _where(loc)
    if len(data) > limits.max_image_bytes:
        raise PayloadTooLarge(
            f"image{where} of {len(data)} bytes exceeds the {limits.max_image_bytes}-byte limit"
        )
    with _pillow_errors(loc, limits.max_image_pixels):
        with PILImage.open(io.BytesIO(data), formats=_FORMATS) as header:
            width, height, fmt = header.width, header.height, str(header.format)
            if width * height > limits.max_image_pixels:
                raise PayloadTooLarge(
                    f"image{where} of {width}x{height} pixels exceeds the "
                    f"{limits.max_image_pixels}-pixel limit"
                )
            header.verify()
    if min(width, height) < 1:
        raise _invalid(loc, f"the image is {width}x{height} pixels; both sides must be >= 1")
    if max(width, height) / min(width, height) > limits.max_image_aspect:
        raise _invalid(
            loc,
            f"the image is {width}x{height} pixels: its aspect ratio is over the "
            f"{limits.max_image_aspect:g}:1 limit",
            "aspect_ratio",
        )
    return Image(data=data, mime=_MIME[fmt], width=width, height=height)


def check_scans(
    image: Image, *, max_scans: int = LIMITS.max_jpeg_scans, loc: BodyLoc = ()
) -> Image:
    """``image`` if it is not a JPEG, or a well-formed one of at most ``max_scans`` scans.

    Raises ``ValidationFailed`` at ``loc`` otherwise (``too_many_scans``, or corrupt data).
    """
    if image.mime != "image/jpeg":
        return image
    try:
        scans = count_scans(image.data)
    except ValueError as exc:
        raise _invalid(loc, f"the image data is corrupt: {exc}") from exc
    if scans > max_scans:
        raise _invalid(
            loc, f"the JPEG has {scans} scans; at most {max_scans} are decoded", "too_many_scans"
        )
    return image


def load_image(data: bytes, *, limits: Limits = LIMITS, loc: BodyLoc = ()) -> Image:
    """``data`` as a checked ``Image``: ``read_header`` then ``check_scans``; nothing decoded."""
    return check_scans(
        read_header(data, limits=limits, loc=loc), max_scans=limits.max_jpeg_scans, loc=loc
    )


def _where(loc: BodyLoc) -> str:
    return f" ({'.'.join(map(str, loc))})" if loc else ""


@contextmanager
def _pillow_errors(loc: BodyLoc, max_pixels: int) -> Iterator[None]:
    """Pillow's errors as ours. Our pixel limit is the one that applies; Pillow's own bomb
    check (a warning under 2x its limit, an error over) must neither warn nor refuse first."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            yield
    except PILImage.UnidentifiedImageError as exc:
        raise _invalid(loc, "the image is not PNG, JPEG or WebP") from exc
    except PILImage.DecompressionBombError as exc:
        raise PayloadTooLarge(f"image{_where(loc)} exceeds the {max_pixels}-pixel limit") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise _invalid(loc, f"the image data is corrupt: {exc}") from exc


def _b64(text: str, loc: BodyLoc) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _invalid(loc, "the image is not valid base64") from exc


def image_bytes(ref: str | Mapping[str, str], *, loc: BodyLoc = ()) -> bytes:
    """The raw bytes of one ``images`` entry (see the module docstring for the accepted forms).

    Raises ``ValidationFailed`` at ``loc`` for remote URLs, non-image data URLs, non-base64
    data URLs, objects without a string ``base64`` and invalid base64.
    """
    if isinstance(ref, Mapping):
        data = ref.get("base64")
        if not isinstance(data, str):
            raise _invalid(loc, "an image object needs a base64 string field 'base64'")
        return _b64(data, [*loc, "base64"])
    head = ref[:16].lower()
    if head.startswith(("http://", "https://")):
        raise _invalid(loc, "remote image URLs are not fetched; send base64 or a data: URL")
    if head.startswith("data:"):
        meta, comma, payload = ref[5:].partition(",")
        params = [p.strip().lower() for p in meta.split(";")]
        if not comma or not params[0].startswith("image/") or "base64" not in params[1:]:
            raise _invalid(loc, "a data URL must be data:image/<type>;base64,<data>")
        return _b64(payload, loc)
    return _b64(ref, loc)


def collect_images(
    request: SystemOneRequest | RequestEnvelope, parts: Mapping[str, Part], limits: Limits
) -> list[Image]:
    """Every image of ``request``, checked: ``images`` first, then ``assets`` in order.

    ``parts`` are the multipart parts other than ``request`` (empty for a JSON body). Each asset
    names exactly one of ``data_base64`` or ``part``; each part must be claimed by exactly one
    asset, as TypeSafe's API requires. Raises ``ValidationFailed`` (422, with ``loc`` such as
    ``["body", "images", 2]``) or ``PayloadTooLarge`` (413) per image, or for the request's
    pixel total (``limits.max_request_pixels``) before any JPEG's scans are counted. No image is
    decoded here.
    """
    images = request.images or []
    assets = request.assets or {}
    if len(images) + len(assets) > limits.max_images:
        raise ValidationFailed.at(
            ["assets" if assets else "images"],
            f"at most {limits.max_images} images per request, got {len(images) + len(assets)}",
            "too_long",
        )
    found: list[tuple[bytes, BodyLoc]] = [
        (image_bytes(ref, loc=["images", i]), ["images", i]) for i, ref in enumerate(images)
    ]
    claimed: set[str] = set()
    for name, asset in assets.items():
        loc = ["assets", name]
        if (asset.data_base64 is None) == (asset.part is None):
            raise _invalid(loc, "an asset needs exactly one of 'data_base64' or 'part'")
        if asset.data_base64 is not None:
            found.append((image_bytes(asset.data_base64, loc=[*loc, "data_base64"]), loc))
            continue
        part = str(asset.part)
        if part not in parts:
            raise _invalid([*loc, "part"], f"no multipart part named {part!r}")
        if part in claimed:
            raise _invalid([*loc, "part"], f"the part {part!r} is claimed by two assets")
        claimed.add(part)
        found.append((parts[part].data, loc))
    unclaimed = sorted(set(parts) - claimed)
    if unclaimed:
        raise _invalid(
            ["assets"], f"the multipart part {unclaimed[0]!r} is not claimed by an asset"
        )
    headers = [read_header(data, limits=limits, loc=loc) for data, loc in found]
    total = sum(image.width * image.height for image in headers)
    if total > limits.max_request_pixels:
        raise PayloadTooLarge(
            f"the request's images have {total} pixels together; the limit is "
            f"{limits.max_request_pixels}"
        )
    return [
        check_scans(image, max_scans=limits.max_jpeg_scans, loc=loc)
        for image, (_, loc) in zip(headers, found, strict=True)
    ]
