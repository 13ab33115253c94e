"""Sliding-window attention computed in chunks, so local layers cost O(L * window), not O(L^2).

A local layer lets position i see keys j with |i - j| <= W (W = ``local_attention // 2``). With
chunks of C = W positions, the queries of chunk c only ever see keys of chunks c-1, c and c+1, so
scores are computed for those 3C keys instead of all L; every other score would be masked to
zero weight anyway. The result equals full attention under the band mask (the masked terms add
exactly 0.0 to the softmax sums); only the summation order differs. Laya's torch runtime computes
the full L x L scores, so for long rows this is where cascade does less work than upstream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from onnx import TensorProto

from cascade.laya.graph_ops import MASKED, Builder


class BandTensors(NamedTuple):
    """Tensors shared by every local layer of one graph (names in the graph)."""

    chunk: int
    q_pads: str  # pad the sequence axis to n * C
    kv_pads: str  # ... plus one empty chunk on each side
    ends: tuple[str, str, str]  # [n], [n + 1], [n + 2]: slices of the padded chunk axis
    length: str  # [L]
    mask_add: str  # [B, 1, n, C, 3C]: 0 where the key is real and inside the band, else MASKED


def _i64(g: Builder, *values: int) -> str:
    return g.const(np.array(values, np.int64))


def _three_chunks(g: Builder, x: str, axis: int, band: BandTensors) -> str:
    """Chunk c of the result holds padded chunks c, c+1, c+2 (= original c-1, c, c+1)."""
    parts = [
        g.op("Slice", x, _i64(g, start), end, _i64(g, axis))
        for start, end in zip((0, 1, 2), band.ends, strict=True)
    ]
    return g.op("Concat", *parts, axis=axis + 1)


def make_band(g: Builder, length: str, window: int) -> BandTensors:
    """Chunking tensors for a graph whose rows are ``length`` (a scalar int64) long."""
    c = max(1, window // 2)
    n = g.op(
        "Div",
        g.op("Add", length, g.const(np.array(c - 1, np.int64))),
        g.const(np.array(c, np.int64)),
    )
    pad_end = g.op(
        "Unsqueeze", g.op("Sub", g.op("Mul", n, g.const(np.array(c, np.int64))), length), _i64(g, 0)
    )
    n1 = g.op("Unsqueeze", n, _i64(g, 0))
    ends = (n1, g.op("Add", n1, _i64(g, 1)), g.op("Add", n1, _i64(g, 2)))
    band = BandTensors(
        chunk=c,
        q_pads=g.op("Concat", _i64(g, 0), pad_end, axis=0),
        kv_pads=g.op("Concat", _i64(g, c), g.op("Add", pad_end, _i64(g, c)), axis=0),
        ends=ends,
        length=g.op("Unsqueeze", length, _i64(g, 0)),
        mask_add="",
    )
    valid = g.op("Pad", "attention_mask", band.kv_pads, g.const(np.array(0, np.int64)), _i64(g, 1))
    valid = g.op("Reshape", valid, _i64(g, 0, -1, c))  # [B, n + 2, C]
    valid = g.op("Cast", _three_chunks(g, valid, 1, band), to=TensorProto.BOOL)
    valid = g.op("Reshape", valid, _i64(g, 0, 1, -1, 1, 3 * c))  # [B, 1, n, 1, 3C]
    r, j = np.arange(c)[:, None], np.arange(3 * c)[None, :]
    inside = g.const(np.abs(j - c - r) <= window // 2)  # key j - C of a chunk vs query r
    mask = g.op(
        "Where", g.op("And", valid, inside), g.const(np.float32(0.0)), g.const(np.float32(MASKED))
    )
    return band._replace(mask_add=mask)


def banded_attention(g: Builder, band: BandTensors, dim: int) -> Callable[[str, str, str], str]:
    """``attend(q, k, v)`` for [B, H, L, dim] inputs (q already scaled) under the band."""

    def attend(q: str, k: str, v: str) -> str:
        c = band.chunk
        shape = _i64(g, 0, 0, -1, c, dim)  # [B, H, chunks, C, dim]
        q = g.op("Reshape", g.op("Pad", q, band.q_pads, g.const(np.float32(0)), _i64(g, 2)), shape)
        k, v = (
            g.op("Reshape", g.op("Pad", x, band.kv_pads, g.const(np.float32(0)), _i64(g, 2)), shape)
            for x in (k, v)
        )
        k, v = (_three_chunks(g, x, 2, band) for x in (k, v))  # [B, H, n, 3C, dim]
        scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 2, 4, 3]))
        probs = g.op("Softmax", g.op("Add", scores, band.mask_add), axis=-1)
        out = g.op("Reshape", g.op("MatMul", probs, v), _i64(g, 0, 0, -1, dim))
        return g.op("Slice", out, _i64(g, 0), band.length, _i64(g, 2))

    return attend
