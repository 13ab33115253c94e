"""cascade.http.bodies: content decoding with a decompressed-size cap, and multipart bodies."""

from __future__ import annotations

import gzip
import time
import tracemalloc
import zlib

import pytest
import zstandard
from typesafe_sdk._core.compression import COMPRESSORS
from typesafe_sdk._core.multipart import Part as SdkPart
from typesafe_sdk._core.multipart import encode_multipart

from cascade.errors import MalformedBody, PayloadTooLarge, UnsupportedMediaType
from cascade.http.bodies import decode_content, split_multipart
from cascade.request.parts import Part

DATA = b'{"state": "hello", "questions": {}}' * 200
LIMIT = 1 << 20


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-15)
    return compressor.compress(data) + compressor.flush()


CODECS = {
    "zstd": zstandard.compress,
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "identity": bytes,
}


@pytest.mark.parametrize("coding", sorted(CODECS))
def test_each_coding_round_trips(coding: str) -> None:
    assert decode_content(CODECS[coding](DATA), coding, limit=LIMIT) == DATA


@pytest.mark.parametrize("header", [None, "", "identity", " Identity "])
def test_no_coding_passes_the_body_through(header: str | None) -> None:
    assert decode_content(DATA, header, limit=LIMIT) == DATA


def test_what_typesafe_sdk_sends_decodes() -> None:
    assert decode_content(COMPRESSORS["zstd"](DATA), "zstd", limit=LIMIT) == DATA


def test_raw_deflate_is_accepted_as_deflate() -> None:
    assert decode_content(_raw_deflate(DATA), "deflate", limit=LIMIT) == DATA


def test_chained_codings_are_undone_last_first() -> None:
    body = zstandard.compress(gzip.compress(DATA))  # gzip applied first, then zstd
    assert decode_content(body, "GZIP, zstd", limit=LIMIT) == DATA


def test_concatenated_gzip_members_and_zstd_frames() -> None:
    half = len(DATA) // 2
    parts = (DATA[:half], DATA[half:])
    assert decode_content(b"".join(map(gzip.compress, parts)), "gzip", limit=LIMIT) == DATA
    assert decode_content(b"".join(map(zstandard.compress, parts)), "zstd", limit=LIMIT) == DATA


@pytest.mark.parametrize("coding", ["zstd", "gzip", "deflate", "identity"])
def test_output_exactly_at_the_limit_passes_and_one_byte_more_is_refused(coding: str) -> None:
    data = bytes(range(256)) * 40
    encoded = CODECS[coding](data)
    assert decode_content(encoded, coding, limit=len(data)) == data
    with pytest.raises(PayloadTooLarge, match=f"the {len(data) - 1}-byte limit"):
        decode_content(encoded, coding, limit=len(data) - 1)


def test_a_valid_gzip_body_followed_by_an_empty_member_decodes() -> None:
    body = gzip.compress(DATA) + gzip.compress(b"")
    assert decode_content(body, "gzip", limit=LIMIT) == DATA
    assert (
        decode_content(zstandard.compress(DATA) + zstandard.compress(b""), "zstd", limit=LIMIT)
        == DATA
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("coding", "piece", "count"),
    [
        ("zstd", zstandard.compress(b""), 400_000),  # 3.6 MB of empty frames: 34.7 s before
        ("gzip", gzip.compress(b"x", mtime=0), 200_000),
    ],  # 4.2 MB of 1-byte members: 10.7 s
)
def test_many_frames_or_members_decode_in_linear_time(
    coding: str, piece: bytes, count: int
) -> None:
    started = time.perf_counter()
    out = decode_content(piece * count, coding, limit=16 << 20)
    elapsed = time.perf_counter() - started
    assert len(out) == count * len(gzip.decompress(piece) if coding == "gzip" else b"")
    assert elapsed < 3.0, f"{count} {coding} pieces took {elapsed:.1f} s"


def _zstd_zeros(n_bytes: int) -> bytes:
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    chunk = bytes(16 << 20)
    pieces = [compressor.compress(chunk) for _ in range(n_bytes // len(chunk))]
    return b"".join([*pieces, compressor.flush()])


@pytest.mark.slow
def test_a_1_gb_zstd_bomb_is_refused_fast_and_without_a_memory_spike() -> None:
    bomb = _zstd_zeros(1 << 30)
    assert len(bomb) < 64 * 1024
    limit = 16 << 20
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(PayloadTooLarge, match="16777216-byte limit"):
            decode_content(bomb, "zstd", limit=limit)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5
    assert peak < 1.25 * limit


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_zlib_bomb_is_refused_without_a_memory_spike(coding: str) -> None:
    zeros = bytes(64 << 20)
    bomb = gzip.compress(zeros, 1) if coding == "gzip" else zlib.compress(zeros, 1)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge, match=f"{LIMIT}-byte limit"):
            decode_content(bomb, coding, limit=LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * LIMIT


@pytest.mark.parametrize(
    ("coding", "body"),
    [
        ("zstd", zstandard.compress(DATA)[:-5]),
        ("zstd", b"not zstd at all"),
        ("zstd", zstandard.compress(DATA) + b"junk"),
        ("gzip", gzip.compress(DATA)[:-12]),
        ("gzip", b"\x1f\x8b garbage"),
        ("gzip", gzip.compress(DATA) + b"junk"),
        ("deflate", zlib.compress(DATA)[:-8]),
        ("deflate", zlib.compress(DATA) + b"junk"),
        ("deflate", b"\xff\xff\xff"),
        ("zstd", b""),
    ],
)
def test_corrupt_or_truncated_data_is_malformed(coding: str, body: bytes) -> None:
    with pytest.raises(MalformedBody):
        decode_content(body, coding, limit=LIMIT)


@pytest.mark.parametrize("header", ["br", "gzip, compress", "zstd;q=1"])
def test_unknown_codings_are_unsupported(header: str) -> None:
    with pytest.raises(UnsupportedMediaType, match="Content-Encoding"):
        decode_content(gzip.compress(DATA), header, limit=LIMIT)


# ---------------------------------------------------------------- multipart

PNG = b"\x89PNG\r\n\x1a\n fake png bytes \r\n--not-a-boundary"
JPEG = b"\xff\xd8\xff fake jpeg"


def _sdk_body(*parts: SdkPart) -> tuple[str, bytes]:
    return encode_multipart(list(parts))


def test_the_sdk_layout_splits_into_request_json_and_asset_parts() -> None:
    # The exact layout typesafe-sdk's with_assets sends: request first, then asset-N parts.
    content_type, body = _sdk_body(
        SdkPart("request", "application/json", b'{"state": "s"}'),
        SdkPart("asset-0", "image/png", PNG, "asset-0"),
        SdkPart("asset-1", "application/octet-stream", JPEG, "asset-1"),
    )
    request, parts = split_multipart(body, content_type, limit_parts=4)
    assert request == b'{"state": "s"}'
    assert parts == {
        "asset-0": Part("asset-0", PNG, "image/png", "asset-0"),
        "asset-1": Part("asset-1", JPEG, "application/octet-stream", "asset-1"),
    }


def test_too_many_parts_is_too_large() -> None:
    content_type, body = _sdk_body(
        SdkPart("request", "application/json", b"{}"),
        *(SdkPart(f"asset-{i}", "image/png", PNG, f"asset-{i}") for i in range(3)),
    )
    assert len(split_multipart(body, content_type, limit_parts=3)[1]) == 3
    with pytest.raises(PayloadTooLarge, match="2-part limit"):
        split_multipart(body, content_type, limit_parts=2)


def test_a_missing_request_part_is_malformed() -> None:
    content_type, body = _sdk_body(SdkPart("asset-0", "image/png", PNG, "asset-0"))
    with pytest.raises(MalformedBody, match="no 'request' part"):
        split_multipart(body, content_type, limit_parts=4)


def test_a_repeated_part_name_is_malformed() -> None:
    content_type, body = _sdk_body(
        SdkPart("request", "application/json", b"{}"),
        SdkPart("asset-0", "image/png", PNG),
        SdkPart("asset-0", "image/png", PNG),
    )
    with pytest.raises(MalformedBody, match="appears twice"):
        split_multipart(body, content_type, limit_parts=4)


def test_a_part_without_a_name_is_malformed() -> None:
    body = b"--b\r\nContent-Disposition: form-data\r\n\r\n{}\r\n--b--\r\n"  # no name parameter
    with pytest.raises(MalformedBody):
        split_multipart(body, "multipart/form-data; boundary=b", limit_parts=4)


def test_a_truncated_stream_is_malformed() -> None:
    content_type, body = _sdk_body(
        SdkPart("request", "application/json", b"{}"), SdkPart("asset-0", "image/png", PNG)
    )
    with pytest.raises(MalformedBody, match="invalid multipart"):
        split_multipart(body[:-20], content_type, limit_parts=4)


@pytest.mark.parametrize(
    "content_type", ["multipart/form-data", "multipart/mixed; boundary=b", "application/json"]
)
def test_a_content_type_without_a_form_data_boundary_is_malformed(content_type: str) -> None:
    with pytest.raises(MalformedBody, match="boundary"):
        split_multipart(b"--b\r\n", content_type, limit_parts=4)
