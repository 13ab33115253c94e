"""Build Laya's fp32 ONNX graph directly from numpy weights (spec §5.1, §7.2 route (b)).

No torch: the graph is written op by op with ``onnx.helper``, so building it is deterministic and
takes seconds. I/O names and dtypes are upstream's, so exported artifacts are interchangeable:
``input_ids``/``attention_mask``/``marker_pos`` int64, ``marker_mask`` bool, ``qtype`` int64 [B]
-> ``logits`` float32 [B, K] (padded slots -1e4) and ``act_logits`` float32 [B, n_act]. The
batch, sequence and marker axes are dynamic; K must be at least 2 (TopK(2) in the act head).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cascade.laya.config import LayaConfig

OPSET = 20  # Gelu needs 20
MASKED = -1e9  # finite: a fully masked (padded) query row stays finite, never NaN
PAD_LOGIT = -1e4  # Laya fills padded option slots with this


class _Builder:
    """Accumulates nodes and initializers; every helper returns its output name."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, arr: np.ndarray | float | list, name: str | None = None) -> str:
        name = name or f"c{len(self.inits)}"
        array = np.asarray(arr)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs) -> str | list[str]:
        self._n += 1
        names = [f"{op_type.lower()}_{self._n}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names


def _rope_tables(g: _Builder, pos_f: str, theta: float, dim: int) -> tuple[str, str]:
    """cos/sin [L, dim] for positions 0..L-1, HF's rotate-half layout (both halves equal)."""
    exponent = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
    inv_freq = (1.0 / (np.float32(theta) ** exponent)).astype(np.float32)
    freqs = g.op("Mul", pos_f, g.const(inv_freq[None, :]))
    emb = g.op("Concat", freqs, freqs, axis=-1)
    return g.op("Cos", emb), g.op("Sin", emb)


def _rope(g: _Builder, x: str, cos: str, sin: str) -> str:
    x1, x2 = g.op("Split", x, axis=-1, outputs=2, num_outputs=2)
    rotated = g.op("Concat", g.op("Neg", x2), x1, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rotated, sin))


def _attention(
    g: _Builder,
    x: str,
    wqkv: str,
    bqkv: str | None,
    heads: int,
    dim: int,
    mask_add: str,
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
        q, k = _rope(g, q, *rope), _rope(g, k, *rope)
    q = g.op("Mul", q, g.const(np.float32(1.0 / math.sqrt(dim))))
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    probs = g.op("Softmax", g.op("Add", scores, mask_add), axis=-1)
    out = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    return g.op("Reshape", out, g.const(np.array([0, 0, heads * dim], np.int64)))


def _linear(g: _Builder, x: str, w: dict[str, np.ndarray], name: str, bias: bool = True) -> str:
    y = g.op("MatMul", x, g.const(np.ascontiguousarray(w[name + ".weight"].T)))
    return g.op("Add", y, g.const(w[name + ".bias"])) if bias else y


def _norm(
    g: _Builder, x: str, w: dict[str, np.ndarray], name: str, eps: float, bias: bool = False
) -> str:
    inputs = [x, g.const(w[name + ".weight"])]
    if bias:
        inputs.append(g.const(w[name + ".bias"]))
    return g.op("LayerNormalization", *inputs, axis=-1, epsilon=eps)


def _encoder(
    g: _Builder, cfg: LayaConfig, w: dict[str, np.ndarray], key_add: str, local_add: str, pos_f: str
) -> str:
    e = cfg.encoder
    x = g.op("Gather", g.const(w["encoder.embeddings.tok_embeddings.weight"]), "input_ids")
    x = _norm(g, x, w, "encoder.embeddings.norm", e.norm_eps)
    ropes = {
        True: _rope_tables(g, pos_f, e.global_theta, e.head_dim),
        False: _rope_tables(g, pos_f, e.local_theta, e.head_dim),
    }
    for i, is_global in enumerate(e.global_layers):
        p = f"encoder.layers.{i}."
        a = x if i == 0 else _norm(g, x, w, p + "attn_norm", e.norm_eps)
        o = _attention(
            g,
            a,
            g.const(np.ascontiguousarray(w[p + "attn.Wqkv.weight"].T)),
            None,
            e.heads,
            e.head_dim,
            key_add if is_global else local_add,
            ropes[is_global],
        )
        x = g.op("Add", x, _linear(g, o, w, p + "attn.Wo", bias=False))
        m = _linear(g, _norm(g, x, w, p + "mlp_norm", e.norm_eps), w, p + "mlp.Wi", bias=False)
        inp, gate = g.op("Split", m, axis=-1, outputs=2, num_outputs=2)
        y = g.op("Mul", g.op("Gelu", inp), gate)
        x = g.op("Add", x, _linear(g, y, w, p + "mlp.Wo", bias=False))
    return _norm(g, x, w, "encoder.final_norm", e.norm_eps)


def _split_heads(g: _Builder, x: str, heads: int, dim: int) -> str:
    x = g.op("Reshape", x, g.const(np.array([0, 0, heads, dim], np.int64)))
    return g.op("Transpose", x, perm=[0, 2, 1, 3])  # [B, H, L, dim]


def _head_layer(
    g: _Builder,
    w: dict[str, np.ndarray],
    p: str,
    h: str,
    key_add: str,
    heads: int,
    read: str | None,
) -> str:
    """One norm-first ``nn.TransformerEncoderLayer`` (ReLU FFN of width 4d).

    With ``read`` ([B, R, 1] positions), only those positions are computed as queries and
    returned ([B, R, d]); keys and values still cover the whole row. The last head layer needs
    no more: only the CLS and marker positions are read after it.
    """
    a = _norm(g, h, w, p + "norm1", 1e-5, bias=True)
    d = w[p + "self_attn.out_proj.weight"].shape[0]
    if read is None:
        wqkv = g.const(np.ascontiguousarray(w[p + "self_attn.in_proj_weight"].T))
        o = _attention(
            g, a, wqkv, g.const(w[p + "self_attn.in_proj_bias"]), heads, d // heads, key_add, None
        )
    else:
        h = g.op("GatherND", h, read, batch_dims=1)
        weight, bias = w[p + "self_attn.in_proj_weight"], w[p + "self_attn.in_proj_bias"]
        q = g.op(
            "MatMul",
            g.op("GatherND", a, read, batch_dims=1),
            g.const(np.ascontiguousarray(weight[:d].T)),
        )
        q = g.op(
            "Mul",
            g.op("Add", q, g.const(bias[:d])),
            g.const(np.float32(1.0 / math.sqrt(d // heads))),
        )
        kv = g.op(
            "Add", g.op("MatMul", a, g.const(np.ascontiguousarray(weight[d:].T))), g.const(bias[d:])
        )
        k, v = g.op("Split", kv, axis=-1, outputs=2, num_outputs=2)
        q, k, v = (_split_heads(g, x, heads, d // heads) for x in (q, k, v))
        scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
        probs = g.op("Softmax", g.op("Add", scores, key_add), axis=-1)
        o = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        o = g.op("Reshape", o, g.const(np.array([0, 0, d], np.int64)))
    h = g.op("Add", h, _linear(g, o, w, p + "self_attn.out_proj"))
    f = g.op("Relu", _linear(g, _norm(g, h, w, p + "norm2", 1e-5, bias=True), w, p + "linear1"))
    return g.op("Add", h, _linear(g, f, w, p + "linear2"))


def _head(
    g: _Builder, cfg: LayaConfig, w: dict[str, np.ndarray], h: str, key_add: str, read: str
) -> str:
    """Type embedding + head layers; returns the hidden states at ``read`` positions only."""
    heads = max(1, cfg.encoder.hidden // 64)
    te = g.op("Gather", g.const(w["type_emb.weight"]), "qtype")
    h = g.op("Add", h, g.op("Unsqueeze", te, g.const(np.array([1], np.int64))))
    if cfg.head_layers == 0:
        return g.op("GatherND", h, read, batch_dims=1)
    for j in range(cfg.head_layers):
        last = j == cfg.head_layers - 1
        h = _head_layer(g, w, f"head.layers.{j}.", h, key_add, heads, read if last else None)
    return h


def _outputs(g: _Builder, w: dict[str, np.ndarray], h: str) -> None:
    """Scorer and act head from ``h`` = [B, 1 + K, d]: the CLS position, then each marker."""
    one = g.const(np.array([1], np.int64))
    m = g.op("Slice", h, one, g.const(np.array([2**62], np.int64)), one)  # [B, K, d]
    s = _norm(g, m, w, "scorer.0", 1e-5, bias=True)
    s = _linear(g, g.op("Gelu", _linear(g, s, w, "scorer.1")), w, "scorer.3")
    raw = g.op("Squeeze", s, g.const(np.array([-1], np.int64)))
    g.nodes.append(
        helper.make_node("Where", ["marker_mask", raw, g.const(np.float32(PAD_LOGIT))], ["logits"])
    )
    p = g.op("Softmax", "logits", axis=-1)
    axes = g.const(np.array([-1], np.int64))
    k = g.op(
        "Max",
        g.op("ReduceSum", g.op("Cast", "marker_mask", to=TensorProto.FLOAT), axes, keepdims=0),
        g.const(np.float32(2.0)),
    )
    plogp = g.op("Mul", p, g.op("Log", g.op("Max", p, g.const(np.float32(1e-9)))))
    ent = g.op("Div", g.op("Neg", g.op("ReduceSum", plogp, axes, keepdims=0)), g.op("Log", k))
    top, _ = g.op("TopK", p, g.const(np.array([2], np.int64)), axis=-1, outputs=2)
    top1, top2 = g.op("Split", top, axis=1, outputs=2, num_outputs=2)
    col = g.const(np.array([1], np.int64))
    feats = g.op(
        "Concat",
        top1,
        g.op("Sub", top1, top2),
        g.op("Unsqueeze", ent, col),
        g.op("Unsqueeze", g.op("Div", k, g.const(np.float32(255.0))), col),
        axis=1,
    )
    pooled = g.op("Gather", h, g.const(np.array(0, np.int64)), axis=1)  # CLS
    act = g.op("Gelu", _linear(g, g.op("Concat", pooled, feats, axis=1), w, "act_head.0"))
    act = _linear(g, act, w, "act_head.2")
    g.nodes.append(helper.make_node("Identity", [act], ["act_logits"]))


def build_graph(cfg: LayaConfig, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The whole forward (encoder, decision head, scorer, act head) as one ONNX model."""
    g = _Builder()
    length = g.op("Squeeze", g.op("Shape", "input_ids", start=1, end=2))
    pos = g.op("Range", g.const(np.array(0, np.int64)), length, g.const(np.array(1, np.int64)))
    pos_f = g.op(
        "Unsqueeze", g.op("Cast", pos, to=TensorProto.FLOAT), g.const(np.array([1], np.int64))
    )  # [L, 1]
    valid = g.op(
        "Unsqueeze",
        g.op("Cast", "attention_mask", to=TensorProto.BOOL),
        g.const(np.array([1, 2], np.int64)),
    )  # [B, 1, 1, L]: padding masks keys only
    zero, masked = g.const(np.float32(0.0)), g.const(np.float32(MASKED))
    zero_i, zero_i1 = g.const(np.array(0, np.int64)), g.const(np.array([0], np.int64))
    key_add = g.op("Where", valid, zero, masked)
    dist = g.op(
        "Abs",
        g.op(
            "Sub",
            g.op("Unsqueeze", pos, g.const(np.array([1], np.int64))),
            g.op("Unsqueeze", pos, g.const(np.array([0], np.int64))),
        ),
    )
    band = g.op("LessOrEqual", dist, g.const(np.array(cfg.encoder.window // 2, np.int64)))
    local_add = g.op("Where", g.op("And", valid, band), zero, masked)  # [B, 1, L, L]
    cls = g.op(
        "Slice",
        g.op("Mul", "marker_pos", zero_i),
        zero_i1,
        g.const(np.array([1], np.int64)),
        g.const(np.array([1], np.int64)),
    )  # [B, 1] of zeros
    read = g.op(
        "Unsqueeze", g.op("Concat", cls, "marker_pos", axis=1), g.const(np.array([-1], np.int64))
    )  # [B, 1 + K, 1]: CLS, then each marker
    encoded = _encoder(g, cfg, weights, key_add, local_add, pos_f)
    _outputs(g, weights, _head(g, cfg, weights, encoded, key_add, read))

    def io(name: str, dtype: int, dims: list) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, dtype, dims)

    inputs = [
        io("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        io("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        io("marker_pos", TensorProto.INT64, ["batch", "markers"]),
        io("marker_mask", TensorProto.BOOL, ["batch", "markers"]),
        io("qtype", TensorProto.INT64, ["batch"]),
    ]
    outputs = [
        io("logits", TensorProto.FLOAT, ["batch", "markers"]),
        io("act_logits", TensorProto.FLOAT, ["batch", cfg.n_act]),
    ]
    graph = helper.make_graph(g.nodes, "laya", inputs, outputs, initializer=g.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="cascade.laya"
    )
    model.ir_version = 10
    return model
