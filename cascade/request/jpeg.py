"""The scan count of a JPEG, from its marker structure alone: no pixel is decoded.

A decoder processes every scan over the whole image, whatever the scan holds: a progressive
refinement scan of end-of-band runs is about 31 bytes and costs as much as a real one (about
6 ms at 4000x4000), so a file's scan count, not its size, bounds its decode time. Pillow reads
the markers only up to the first scan, so we walk the rest: segments with a length, then after
each SOS the entropy-coded data up to the next marker that is neither a stuffed ``FF 00`` nor a
restart marker ``RSTn`` (``FF D0``-``FF D7``). Fill bytes (``FF FF``) may precede any marker.
"""

from __future__ import annotations

SOI, EOI, SOS = 0xD8, 0xD9, 0xDA
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM and RSTn: markers without a length


def count_scans(data: bytes) -> int:
    """The number of SOS markers between ``data``'s SOI and EOI.

    Raises ``ValueError`` when ``data`` is not a well-formed marker sequence ending in EOI (a
    truncated file, a bad segment length, a stray byte between segments). Work is linear in
    ``len(data)``.
    """
    if data[:2] != b"\xff\xd8":
        raise ValueError("no JPEG start-of-image marker")
    pos, scans, end = 2, 0, len(data)
    while True:
        if pos >= end or data[pos] != 0xFF:
            raise ValueError(f"no marker at byte {pos}")
        while pos < end and data[pos] == 0xFF:  # fill bytes before the marker code
            pos += 1
        if pos >= end:
            raise ValueError("the file ends inside a marker")
        marker = data[pos]
        pos += 1
        if marker == EOI:
            return scans
        if marker in _STANDALONE:
            continue
        if marker == SOI or marker == 0x00:
            raise ValueError(f"unexpected marker 0x{marker:02X} at byte {pos - 1}")
        if pos + 2 > end:
            raise ValueError("the file ends inside a segment length")
        length = int.from_bytes(data[pos : pos + 2], "big")
        if length < 2 or pos + length > end:
            raise ValueError(f"bad segment length {length} at byte {pos}")
        pos += length
        if marker == SOS:
            scans += 1
            pos = _entropy_end(data, pos)


def _entropy_end(data: bytes, pos: int) -> int:
    """The offset of the marker that ends the entropy-coded data starting at ``pos``."""
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= len(data):
            raise ValueError("the file ends inside a scan's entropy-coded data")
        code = data[pos + 1]
        if code == 0x00 or 0xD0 <= code <= 0xD7:  # stuffed FF, restart marker
            pos += 2
        elif code == 0xFF:  # a fill byte: the marker starts at the next FF
            pos += 1
        else:
            return pos
