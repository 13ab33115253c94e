"""cascade.request.jpeg: a JPEG's scan count from its markers, entropy-coded data skipped right."""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image as PILImage

from cascade.request.jpeg import count_scans


def _jpeg(mode: str = "RGB", size: tuple[int, int] = (64, 48), **options: object) -> bytes:
    # Noise: its entropy-coded data is full of stuffed FF 00 pairs. Seeded: a few of every
    # hundred random images cut into one-block restart intervals have none.
    pixels = random.Random(1).randbytes(size[0] * size[1] * len(mode))
    out = io.BytesIO()
    PILImage.frombytes(mode, size, pixels).save(out, "JPEG", **options)
    return out.getvalue()


@pytest.mark.parametrize(
    ("data", "scans"),
    [
        (_jpeg(), 1),
        (_jpeg(progressive=True), 10),  # libjpeg's standard script, YCbCr
        (_jpeg("L", progressive=True), 6),  # ... and grayscale
        (_jpeg(restart_marker_blocks=1), 1),  # an RSTn after every block
        (_jpeg(progressive=True, restart_marker_rows=1), 10),
    ],
)
def test_scans_are_counted_as_libjpeg_writes_them(data: bytes, scans: int) -> None:
    assert b"\xff\x00" in data[data.index(b"\xff\xda") :]
    assert count_scans(data) == scans


def test_restart_markers_and_fill_bytes_are_not_scans() -> None:
    data = _jpeg(restart_marker_blocks=1)
    assert sum(data.count(bytes([0xFF, n])) for n in range(0xD0, 0xD8)) > 10
    eoi = data.rindex(b"\xff\xd9")
    assert count_scans(data[:eoi] + b"\xff\xff\xff" + data[eoi:]) == 1


@pytest.mark.parametrize(
    "cut",
    [
        lambda d: d[:-2],  # no EOI
        lambda d: d[: len(d) * 9 // 10],  # inside a scan
        lambda d: d[:1] + b"\x00" + d[2:],  # no SOI
        lambda d: d[:2] + b"\x00" + d[2:],  # a stray byte where a marker belongs
        lambda d: d[:4] + b"\xff\xff" + d[6:],  # a segment longer than the file
        lambda d: d[: d.index(b"\xff\xda") + 3],  # inside the SOS header
    ],
)
def test_malformed_marker_structure_is_an_error(cut) -> None:  # noqa: ANN001
    with pytest.raises(ValueError):
        count_scans(cut(_jpeg(progressive=True)))
