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

Every image is opened header-first: format and pixel count are checked before any pixel is
decoded, so a decompression bomb costs a header read. The format is detected from the bytes; an
asset's ``format`` and a part's content type are not trusted (the SDK labels unknown images
``application/octet-stream``). Decoding a full 16 MP image to prove it intact takes about 0.1 s,
so callers on an event loop should run ``collect_images`` in a worker thread when images are
present.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from collections.abc import Mapping, Sequence

from PIL import Image as PILImage

from cascade.calls import Image
from cascade.errors import PayloadTooLarge, ValidationFailed
from cascade.http.bodies import Part
from cascade.schema import Limits, RequestEnvelope, SystemOneRequest

_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
_FORMATS = tuple(_MIME)

Loc = Sequence[str | int]


def _invalid(loc: Loc, msg: str) -> ValidationFailed:
    return ValidationFailed.at(list(loc), msg)


def load_image(data: bytes, *, max_bytes: int, max_pixels: int, loc: Loc = ()) -> Image:
    """``data`` as a checked ``Image``: PNG, JPEG or WebP, within both limits, fully decodable.

    Raises ``PayloadTooLarge`` over ``max_bytes`` or ``max_pixels`` (checked from the header,
    before decoding) and ``ValidationFailed`` at ``loc`` for another format or corrupt data.
    """
    where = f" ({'.'.join(map(str, loc))})" if loc else ""
    if len(data) > max_bytes:
        raise PayloadTooLarge(
            f"image{where} of {len(data)} bytes exceeds the {max_bytes}-byte limit"
        )
    try:
        with warnings.catch_warnings():
            # Our own pixel limit below is the one that applies; Pillow's is a warning only.
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            with PILImage.open(io.BytesIO(data), formats=_FORMATS) as header:
                width, height, fmt = header.width, header.height, str(header.format)
                if width * height > max_pixels:
                    raise PayloadTooLarge(
                        f"image{where} of {width}x{height} pixels exceeds the "
                        f"{max_pixels}-pixel limit"
                    )
                header.verify()
            # verify() leaves the image unusable and skips pixel data; load() proves it decodes.
            with PILImage.open(io.BytesIO(data), formats=_FORMATS) as full:
                full.load()
    except PILImage.UnidentifiedImageError as exc:
        raise _invalid(loc, "the image is not PNG, JPEG or WebP") from exc
    except PILImage.DecompressionBombError as exc:
        raise PayloadTooLarge(f"image{where} exceeds the {max_pixels}-pixel limit") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise _invalid(loc, f"the image data is corrupt: {exc}") from exc
    return Image(data=data, mime=_MIME[fmt], width=width, height=height)


def _b64(text: str, loc: Loc) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _invalid(loc, "the image is not valid base64") from exc


def image_bytes(ref: str | Mapping[str, str], *, loc: Loc = ()) -> bytes:
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
    ``["body", "images", 2]``) or ``PayloadTooLarge`` (413) per image.
    """
    images = request.images or []
    assets = request.assets or {}
    if len(images) + len(assets) > limits.max_images:
        raise ValidationFailed.at(
            ["assets" if assets else "images"],
            f"at most {limits.max_images} images per request, got {len(images) + len(assets)}",
            "too_long",
        )
    found: list[tuple[bytes, Loc]] = [
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
    return [
        load_image(
            data, max_bytes=limits.max_image_bytes, max_pixels=limits.max_image_pixels, loc=loc
        )
        for data, loc in found
    ]
