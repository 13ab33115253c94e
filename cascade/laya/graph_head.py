"""Laya's decision head, scorer and act head as ONNX (spec §2.6, §2.7)."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from cascade.laya.config import LayaConfig
from cascade.laya.graph_ops import Builder, attention, full_attention, linear, norm, split_heads

PAD_LOGIT = -1e4  # Laya fills padded option slots with this


def head_layer(
    g: Builder,
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
    a = norm(g, h, w, p + "norm1", 1e-5, bias=True)
    d = w[p + "self_attn.out_proj.weight"].shape[0]
    if read is None:
        wqkv = g.const(np.ascontiguousarray(w[p + "self_attn.in_proj_weight"].T))
        o = attention(
            g,
            a,
            wqkv,
            g.const(w[p + "self_attn.in_proj_bias"]),
            heads,
            d // heads,
            full_attention(g, key_add),
            None,
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
        k, v = g.ops("Split", kv, axis=-1, outputs=2, num_outputs=2)
        q, k, v = (split_heads(g, x, heads, d // heads) for x in (q, k, v))
        scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
        probs = g.op("Softmax", g.op("Add", scores, key_add), axis=-1)
        o = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        o = g.op("Reshape", o, g.const(np.array([0, 0, d], np.int64)))
    h = g.op("Add", h, linear(g, o, w, p + "self_attn.out_proj"))
    f = g.op("Relu", linear(g, norm(g, h, w, p + "norm2", 1e-5, bias=True), w, p + "linear1"))
    return g.op("Add", h, linear(g, f, w, p + "linear2"))


def head(
    g: Builder, cfg: LayaConfig, w: dict[str, np.ndarray], h: str, key_add: str, read: str
) -> str:
    """Type embedding + head layers; returns the hidden states at ``read`` positions only."""
    heads = max(1, cfg.encoder.hidden // 64)
    te = g.op("Gather", g.const(w["type_emb.weight"]), "qtype")
    h = g.op("Add", h, g.op("Unsqueeze", te, g.const(np.array([1], np.int64))))
    if cfg.head_layers == 0:
        return g.op("GatherND", h, read, batch_dims=1)
    for j in range(cfg.head_layers):
        last = j == cfg.head_layers - 1
        h = head_layer(g, w, f"head.layers.{j}.", h, key_add, heads, read if last else None)
    return h


def scorer_and_act(g: Builder, w: dict[str, np.ndarray], h: str) -> None:
    """Scorer and act head from ``h`` = [B, 1 + K, d]: the CLS position, then each marker."""
    one = g.const(np.array([1], np.int64))
    m = g.op("Slice", h, one, g.const(np.array([2**62], np.int64)), one)  # [B, K, d]
    s = norm(g, m, w, "scorer.0", 1e-5, bias=True)
    s = linear(g, g.op("Gelu", linear(g, s, w, "scorer.1")), w, "scorer.3")
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
    top, _ = g.ops("TopK", p, g.const(np.array([2], np.int64)), axis=-1, outputs=2)
    top1, top2 = g.ops("Split", top, axis=1, outputs=2, num_outputs=2)
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
    act = g.op("Gelu", linear(g, g.op("Concat", pooled, feats, axis=1), w, "act_head.0"))
    act = linear(g, act, w, "act_head.2")
    g.nodes.append(helper.make_node("Identity", [act], ["act_logits"]))
