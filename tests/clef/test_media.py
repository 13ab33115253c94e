"""``cascade.clef.media``: images the processor refuses are the client's 422; large images are
resized before the processor expands them, with the processor's own pixels."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from cascade.calls import EngineCall, Image
from cascade.clef.media import ImageEncoder
from cascade.errors import ValidationFailed
from cascade.schema import NoulQuestion
from tests.clef.test_engine import with_engine


def _image(width: int, height: int, fmt: str = "PNG", noise: bool = False) -> Image:
    pixels = os.urandom(width * height * 3) if noise else bytes(width * height * 3)
    buf = io.BytesIO()
    PILImage.frombytes("RGB", (width, height), pixels).save(buf, fmt)
    mime = {"PNG": "image/png", "JPEG": "image/jpeg"}[fmt]
    return Image(data=buf.getvalue(), mime=mime, width=width, height=height)


def _encoder(release: Path) -> ImageEncoder:
    return ImageEncoder(release, lambda text: [0] * len(text), image_token_id=1)


@pytest.mark.parametrize(
    ("width", "height", "fmt"), [(201, 1, "PNG"), (1, 300, "PNG"), (300, 1, "JPEG")]
)
def test_an_image_the_processor_refuses_is_a_422_naming_it(
    tiny_release: Path, width: int, height: int, fmt: str
) -> None:
    encoder = _encoder(tiny_release)
    images = [_image(8, 8), _image(width, height, fmt)]
    for run in (encoder.count, encoder.encode):
        with pytest.raises(ValidationFailed, match="aspect ratio") as exc:
            run(images)
        assert exc.value.items[0]["loc"] == ["body", "images", 1]


def test_the_in_process_tier_answers_such_an_image_with_a_client_error(tiny_release: Path) -> None:
    call = EngineCall(
        state="look",
        questions={"q": NoulQuestion(instructions="ok?")},
        model="clef-flash",
        images=[_image(201, 1)],
    )

    async def body(engine):  # noqa: ANN001
        with pytest.raises(ValidationFailed):
            await engine.answer(call)
        return engine.health()

    assert with_engine(tiny_release, body)["ready"]


def test_a_large_image_gets_the_processors_own_pixels(tiny_release: Path) -> None:
    encoder = _encoder(tiny_release)
    big = _image(640, 480, noise=True)  # the tiny release resizes anything to <= 16384 pixels
    ours = encoder.encode([big])
    assert ours is not None
    full = PILImage.open(io.BytesIO(big.data)).convert("RGB")
    theirs = encoder.processor([full], return_tensors="pt")
    assert ours.image_grid_thw.tolist() == theirs["image_grid_thw"].tolist()
    np.testing.assert_array_equal(ours.pixel_values.numpy(), theirs["pixel_values"].numpy())


def test_four_16_mp_images_are_encoded_without_holding_them_all(
    tiny_release: Path, tmp_path: Path
) -> None:
    path = tmp_path / "big.png"
    PILImage.linear_gradient("L").resize((4000, 4000)).convert("RGB").save(path)
    code = f"""
from pathlib import Path
from cascade.calls import Image
from cascade.clef.media import ImageEncoder
def peak_mib():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) // 1024
encoder = ImageEncoder(Path({str(tiny_release)!r}), lambda t: [0] * len(t), image_token_id=1)
image = Image(data=open({str(path)!r}, "rb").read(), mime="image/png", width=4000, height=4000)
before = peak_mib()
encoder.encode([image] * 4)
print(peak_mib() - before)
"""
    grown = int(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
        ).stdout.split()[-1]
    )
    # One 16 MP RGB image is 48 MB: four held at once (and their arrays) were about 400 MB.
    assert grown < 120, f"encoding four 16 MP images grew the process by {grown} MiB"


def _request_images(*datas: bytes) -> list[Image]:
    import base64

    import msgspec

    from cascade.request.images import collect_images
    from cascade.schema import LIMITS, envelope_decoder

    env = envelope_decoder.decode(
        msgspec.json.encode(
            {
                "state": "s",
                "questions": {"q": {"type": "noul"}},
                "images": [base64.b64encode(data).decode() for data in datas],
            }
        )
    )
    return collect_images(env, {}, LIMITS)


def test_a_request_decodes_each_image_once(
    tiny_release: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progressive = io.BytesIO()
    PILImage.new("RGB", (64, 48), (9, 99, 199)).save(progressive, "JPEG", progressive=True)
    png = _image(40, 30, noise=True).data
    encoder = _encoder(tiny_release)
    decoders: list[str] = []  # every PNG ("zip") or JPEG decode gets its decoder here; "raw"
    # ones build images from arrays (the processor's), no file
    getdecoder = PILImage._getdecoder

    def counted(mode: str, decoder_name: str, *args: object) -> object:
        decoders.append(decoder_name)
        return getdecoder(mode, decoder_name, *args)

    monkeypatch.setattr(PILImage, "_getdecoder", counted)
    media = encoder.encode(_request_images(png, progressive.getvalue()))  # gateway, then tier
    assert media is not None and media.image_grid_thw.shape[0] == 2
    assert [name for name in decoders if name != "raw"] == ["zip", "jpeg"]


def test_data_corrupt_inside_the_stream_is_the_tiers_422_naming_the_image(
    tiny_release: Path,
) -> None:
    import struct
    import zlib

    png = _image(40, 30).data
    start = png.index(b"IDAT") - 4
    length = struct.unpack(">I", png[start : start + 4])[0]
    garbage = b"IDAT" + b"\x78\x9c" + b"\xff" * (length - 2)  # a valid CRC over bad deflate
    broken = (
        png[: start + 4]
        + garbage
        + struct.pack(">I", zlib.crc32(garbage))
        + png[start + 12 + length :]
    )
    images = _request_images(png, broken)  # the gateway checks headers and CRCs only
    with pytest.raises(ValidationFailed, match="unreadable image") as exc:
        _encoder(tiny_release).encode(images)
    assert exc.value.items[0]["loc"] == ["body", "images", 1]
