"""The small op helpers Laya's ONNX graph is written with (``cascade.laya.graph``).

``Builder`` accumulates nodes and initializers; every helper returns its output's name. Weights
of ``MatMul``s are stored transposed (``x @ W.T`` becomes ``MatMul(x, W_T)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

MASKED = -1e9  # finite: a fully masked (padded) query row stays finite, never NaN


class Builder:
    """Accumulates nodes and initializers; every helper returns its output name."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, arr: Any, name: str | None = None) -> str:
        """An initializer from ``arr`` (an array, a number or a nested list; float64 stored as
        float32); its name."""
        name = name or f"c{len(self.inits)}"
        array = np.asarray(arr)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        """A node with one output; its name."""
        (name,) = self.ops(op_type, *inputs, outputs=1, **attrs)
        return name

    def ops(self, op_type: str, *inputs: str, outputs: int, **attrs: Any) -> list[str]:
        """A node with ``outputs`` outputs; their names."""
        self._n += 1
        names = [f"{op_type.lower()}_{self._n}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names


def rope_tables(g: Builder, pos_f: str, theta: float, dim: int) -> tuple[str, str]:
    """cos/sin [L, dim] for positions 0..L-1, HF's rotate-half layout (both halves equal)."""
    exponent = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
    inv_freq = (1.0 / (np.float32(theta) ** exponent)).astype(np.float32)
    freqs = g.op("Mul", pos_f, g.const(inv_freq[None, :]))
    emb = g.op("Concat", freqs, freqs, axis=-1)
    return g.op("Cos", emb), g.op("Sin", emb)


def apply_rope(g: Builder, x: str, cos: str, sin: str) -> str:
    x1, x2 = g.ops("Split", x, axis=-1, outputs=2, num_outputs=2)
    rotated = g.op("Concat", g.op("Neg", x2), x1, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rotated, sin))


Attend = Callable[[str, str, str], str]  # (q scaled, k, v) [B, H, L, dim] -> [B, H, L, dim]


def full_attention(g: Builder, mask_add: str) -> Attend:
    """Softmax attention over every key, with an additive mask broadcast to [B, H, L, L]."""

    def attend(q: str, k: str, v: str) -> str:
        scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
        probs = g.op("Softmax", g.op("Add", scores, mask_add), axis=-1)
        return g.op("MatMul", probs, v)

    return attend


def attention(
    g: Builder,
    x: str,
    wqkv: str,
    bqkv: str | None,
    heads: int,
    dim: int,
    attend: Attend,
    rope: tuple[str, str] | None,
) -> str:
    """Packed-QKV multi-head attention; returns the concatenated heads [B, L, heads*dim]."""
    qkv = g.op("MatMul", x, wqkv)
    if bqkv is not None:
        qkv = g.op("Add", qkv, bqkv)
    qkv = g.op("Reshape", qkv, g.const(np.array([0, 0, 3, heads, dim], np.int64)))
    qkv = g.op("Transpose", qkv, perm=[2, 0, 3, 1, 4])  # [3, B, H, L, dim]
    q, k, v = (g.op("Gather", qkv, g.const(np.array(i, np.int64)), axis=0) for i in range(3))
    if rope is not None:
        q, k = apply_rope(g, q, *rope), apply_rope(g, k, *rope)
    q = g.op("Mul", q, g.const(np.float32(1.0 / math.sqrt(dim))))
    out = g.op("Transpose", attend(q, k, v), perm=[0, 2, 1, 3])
    return g.op("Reshape", out, g.const(np.array([0, 0, heads * dim], np.int64)))


def linear(g: Builder, x: str, w: dict[str, np.ndarray], name: str, bias: bool = True) -> str:
    y = g.op("MatMul", x, g.const(np.ascontiguousarray(w[name + ".weight"].T)))
    return g.op("Add", y, g.const(w[name + ".bias"])) if bias else y


def norm(
    g: Builder, x: str, w: dict[str, np.ndarray], name: str, eps: float, bias: bool = False
) -> str:
    inputs = [x, g.const(w[name + ".weight"])]
    if bias:
        inputs.append(g.const(w[name + ".bias"]))
    return g.op("LayerNormalization", *inputs, axis=-1, epsilon=eps)


def split_heads(g: Builder, x: str, heads: int, dim: int) -> str:
    x = g.op("Reshape", x, g.const(np.array([0, 0, heads, dim], np.int64)))
    return g.op("Transpose", x, perm=[0, 2, 1, 3])  # [B, H, L, dim]
