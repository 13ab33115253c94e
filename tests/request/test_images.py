"""cascade.request.images: image checks, reference decoding and collection with 422 locations."""

from __future__ import annotations

import base64
import io
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from PIL import Image as PILImage
from PIL import ImageFile

from cascade.errors import PayloadTooLarge, ValidationFailed
from cascade.request.images import collect_images, image_bytes, load_image
from cascade.request.parts import Part
from cascade.schema import Limits, RequestEnvelope, envelope_decoder

BIG = 1 << 30
UNBOUNDED = Limits(max_image_bytes=BIG, max_image_pixels=BIG)


def _encode(fmt: str, size: tuple[int, int] = (8, 6), mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    PILImage.new(mode, size, (200, 30, 90) if mode == "RGB" else 1).save(out, format=fmt)
    return out.getvalue()


PNG, JPEG, WEBP = _encode("PNG"), _encode("JPEG"), _encode("WEBP")


def _with_png_size(png: bytes, width: int, height: int) -> bytes:
    """``png`` with its IHDR claiming another size (a valid CRC): a bomb costs nothing to make."""
    ihdr = png[12:16] + struct.pack(">II", width, height) + png[24:29]
    return png[:8] + png[8:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]


def _loc(exc: pytest.ExceptionInfo[ValidationFailed]) -> list[Any]:
    return exc.value.items[0]["loc"]


# ---------------------------------------------------------------- load_image


@pytest.mark.parametrize(
    ("data", "mime"), [(PNG, "image/png"), (JPEG, "image/jpeg"), (WEBP, "image/webp")]
)
def test_png_jpeg_and_webp_load_with_their_size(data: bytes, mime: str) -> None:
    image = load_image(data, limits=UNBOUNDED)
    assert (image.mime, image.width, image.height, image.data) == (mime, 8, 6, data)


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_other_formats_are_refused_with_their_loc(fmt: str) -> None:
    with pytest.raises(ValidationFailed, match="not PNG, JPEG or WebP") as exc:
        load_image(_encode(fmt), limits=UNBOUNDED, loc=["images", 1])
    assert _loc(exc) == ["body", "images", 1]


def test_bytes_over_the_limit_are_too_large() -> None:
    with pytest.raises(PayloadTooLarge, match=f"the {len(PNG) - 1}-byte limit"):
        load_image(PNG, limits=Limits(max_image_bytes=len(PNG) - 1, max_image_pixels=BIG))


def test_pixels_over_the_limit_are_too_large() -> None:
    load_image(PNG, limits=Limits(max_image_bytes=BIG, max_image_pixels=48))
    with pytest.raises(PayloadTooLarge, match="8x6 pixels exceeds the 47-pixel limit"):
        load_image(PNG, limits=Limits(max_image_bytes=BIG, max_image_pixels=47))


@pytest.mark.slow
@pytest.mark.parametrize("side", [10_000, 50_000])  # Pillow: a warning at 89 MP, an error at 179
def test_a_decompression_bomb_is_refused_from_its_header(side: int) -> None:
    bomb = _with_png_size(PNG, side, side)
    started = time.perf_counter()
    with pytest.raises(PayloadTooLarge, match="16000000-pixel limit"):
        load_image(bomb, limits=Limits(max_image_bytes=BIG, max_image_pixels=16_000_000))
    assert time.perf_counter() - started < 0.1


@pytest.mark.parametrize(
    "data",
    [
        PNG[:-20],  # truncated
        PNG[:30] + b"\x00" + PNG[31:],  # IHDR CRC broken
        JPEG[: len(JPEG) // 2],  # truncated scan
        WEBP[:-10],
        b"\x89PNG\r\n\x1a\n",
        b"",
    ],
)
def test_corrupt_images_are_refused(data: bytes) -> None:
    with pytest.raises(ValidationFailed):
        load_image(data, limits=UNBOUNDED)


# ---------------------------------------------------------------- image_bytes

B64 = base64.b64encode(PNG).decode()


@pytest.mark.parametrize(
    "ref",
    [
        B64,
        B64[:20] + "\n" + B64[20:],
        f"data:image/png;base64,{B64}",
        f"DATA:image/png;name=x.png;base64,{B64}",
        {"content_type": "image/png", "base64": B64},
    ],
)
def test_every_reference_form_decodes(ref: str | dict[str, str]) -> None:
    assert image_bytes(ref) == PNG


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("https://example.com/cat.png", "remote image URLs are not fetched"),
        ("HTTP://example.com/cat.png", "remote image URLs are not fetched"),
        (f"data:text/plain;base64,{B64}", "data:image/<type>;base64"),
        ("data:image/png,rawbytes", "data:image/<type>;base64"),
        ("data:image/png;base64", "data:image/<type>;base64"),
        ("not base64!", "not valid base64"),
        ({"content_type": "image/png"}, "needs a base64 string"),
        ({"base64": "@@@"}, "not valid base64"),
    ],
)
def test_bad_references_are_422(ref: str | dict[str, str], message: str) -> None:
    with pytest.raises(ValidationFailed, match=message) as exc:
        image_bytes(ref, loc=["images", 0])
    assert _loc(exc)[:3] == ["body", "images", 0]


# ---------------------------------------------------------------- collect_images


def _request(**fields: Any) -> RequestEnvelope:
    return envelope_decoder.decode(
        msgspec.json.encode({"state": "s", "questions": {"q": {"type": "noul"}}, **fields})
    )


LIMITS = Limits()


def test_images_then_assets_in_request_order() -> None:
    request = _request(
        images=[f"data:image/jpeg;base64,{base64.b64encode(JPEG).decode()}"],
        assets={
            "<image:b>": {"type": "image", "part": "asset-0"},
            "<image:a>": {"type": "image", "format": "png", "data_base64": B64},
        },
    )
    images = collect_images(request, {"asset-0": Part("asset-0", WEBP, "image/webp")}, LIMITS)
    assert [i.mime for i in images] == ["image/jpeg", "image/webp", "image/png"]


def test_no_images_is_an_empty_list() -> None:
    assert collect_images(_request(), {}, LIMITS) == []


def test_more_images_than_the_limit_is_422() -> None:
    request = _request(images=[B64] * 3, assets={"a": {"type": "image", "data_base64": B64}})
    with pytest.raises(ValidationFailed, match="at most 3 images per request, got 4") as exc:
        collect_images(request, {}, Limits(max_images=3))
    assert _loc(exc) == ["body", "assets"]
    assert exc.value.items[0]["type"] == "too_long"


def test_a_bad_image_reports_its_index() -> None:
    gif = base64.b64encode(_encode("GIF")).decode()
    with pytest.raises(ValidationFailed) as exc:
        collect_images(_request(images=[B64, B64, gif]), {}, LIMITS)
    assert _loc(exc) == ["body", "images", 2]


def test_image_limits_come_from_the_limits_table() -> None:
    with pytest.raises(PayloadTooLarge, match="images.0"):
        collect_images(_request(images=[B64]), {}, Limits(max_image_pixels=10))
    with pytest.raises(PayloadTooLarge, match="byte limit"):
        collect_images(_request(images=[B64]), {}, Limits(max_image_bytes=10))


@pytest.mark.parametrize(
    ("asset", "parts", "loc", "message"),
    [
        ({"type": "image"}, {}, ["assets", "x"], "exactly one of"),
        ({"data_base64": B64, "part": "asset-0"}, {}, ["assets", "x"], "exactly one of"),
        ({"part": "asset-1"}, {"asset-0": PNG}, ["assets", "x", "part"], "no multipart part"),
        ({"data_base64": B64}, {"asset-0": PNG}, ["assets"], "not claimed"),
        ({"data_base64": "%%%"}, {}, ["assets", "x", "data_base64"], "not valid base64"),
    ],
)
def test_asset_errors_are_422_at_the_asset(
    asset: dict[str, str], parts: dict[str, bytes], loc: list[str], message: str
) -> None:
    request = _request(assets={"x": asset})
    with pytest.raises(ValidationFailed, match=message) as exc:
        collect_images(request, {k: Part(k, v) for k, v in parts.items()}, LIMITS)
    assert _loc(exc) == ["body", *loc]


def test_a_part_claimed_twice_is_422() -> None:
    request = _request(assets={"a": {"part": "asset-0"}, "b": {"part": "asset-0"}})
    with pytest.raises(ValidationFailed, match="claimed by two assets") as exc:
        collect_images(request, {"asset-0": Part("asset-0", PNG)}, LIMITS)
    assert _loc(exc) == ["body", "assets", "b", "part"]


# ---------------------------------------------------------------- what the Clef tier can take


@pytest.mark.parametrize(
    ("size", "fmt"), [((201, 1), "PNG"), ((1, 300), "PNG"), ((300, 1), "JPEG"), ((2, 401), "WEBP")]
)
def test_an_aspect_ratio_over_200_is_422_at_the_image(size: tuple[int, int], fmt: str) -> None:
    with pytest.raises(ValidationFailed, match="aspect ratio is over the 200:1 limit") as exc:
        collect_images(
            _request(images=[B64, base64.b64encode(_encode(fmt, size)).decode()]), {}, LIMITS
        )
    assert _loc(exc) == ["body", "images", 1]
    assert exc.value.items[0]["type"] == "aspect_ratio"


def test_an_aspect_ratio_of_exactly_200_passes() -> None:
    assert load_image(_encode("PNG", (200, 1))).width == 200


def test_the_request_pixel_total_is_refused_before_any_image_is_decoded() -> None:
    jpeg = _encode("JPEG", (100, 100))
    corrupt = jpeg[: len(jpeg) * 9 // 10]  # a valid header, data that does not decode
    request = _request(images=[base64.b64encode(corrupt).decode(), B64])
    with pytest.raises(PayloadTooLarge, match="10048 pixels together; the limit is 10047"):
        collect_images(request, {}, Limits(max_request_pixels=10047))
    with pytest.raises(ValidationFailed, match="corrupt"):
        collect_images(request, {}, Limits(max_request_pixels=10048))


def test_checking_a_16_mp_jpeg_does_not_expand_it(tmp_path: Path) -> None:
    # In a fresh process: the peak RSS while checking a 4000x4000 JPEG (48 MB of RGB pixels).
    path = tmp_path / "big.jpg"
    PILImage.linear_gradient("L").resize((4000, 4000)).convert("RGB").save(path, "JPEG")
    code = f"""
from cascade.request.images import load_image
def peak_kib():  # this process's high-water RSS (ru_maxrss would start at the parent's)
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
data = open({str(path)!r}, "rb").read()
before = peak_kib()
load_image(data)
print(peak_kib() - before)
"""
    grown_kib = int(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        ).stdout
    )
    assert grown_kib < 16 * 1024, f"checking the image grew the process by {grown_kib} KiB"


# ---------------------------------------------------------------- JPEG scans


def _scan_bomb(side: int, extra: int) -> bytes:
    """A progressive JPEG with its last scan repeated ``extra`` times: each copy is a few bytes
    and costs the decoder a pass over the whole image."""
    out = io.BytesIO()
    PILImage.new("RGB", (side, side), (120, 60, 200)).save(out, "JPEG", progressive=True)
    data = out.getvalue()
    scan = data[data.rindex(b"\xff\xda") : -2]
    return data[:-2] + scan * extra + b"\xff\xd9"


def test_a_progressive_jpeg_is_accepted_up_to_the_scan_limit() -> None:
    normal = _scan_bomb(64, 0)  # libjpeg's 10 scans
    assert load_image(normal).mime == "image/jpeg"
    assert load_image(_scan_bomb(64, 90)).width == 64  # 100 scans, the limit
    with pytest.raises(ValidationFailed, match="101 scans; at most 100"):
        load_image(_scan_bomb(64, 91))


@pytest.mark.slow
def test_a_scan_bomb_is_422_at_the_image_without_decoding_it() -> None:
    bomb = _scan_bomb(4000, 2000)  # decoding it took 56 s on the 2-core machine
    request = _request(images=[B64, base64.b64encode(bomb).decode()])
    started = time.perf_counter()
    with pytest.raises(ValidationFailed, match="2010 scans") as exc:
        collect_images(request, {}, Limits())
    assert time.perf_counter() - started < 1.0
    assert _loc(exc) == ["body", "images", 1]
    assert exc.value.items[0]["type"] == "too_many_scans"


def test_the_gateway_decodes_no_image(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tier that reads the pixels decodes each image once (tests/clef/test_media.py).
    request = _request(
        images=[B64, base64.b64encode(_scan_bomb(64, 0)).decode(), base64.b64encode(WEBP).decode()]
    )
    loads: list[str | None] = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda im: loads.append(im.format))
    assert [image.mime for image in collect_images(request, {}, Limits())] == [
        "image/png",
        "image/jpeg",
        "image/webp",
    ]
    assert loads == []
