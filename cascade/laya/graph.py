"""Build Laya's fp32 ONNX graph directly from numpy weights (spec §5.1, §7.2 route (b)).

No torch: the graph is written op by op with ``onnx.helper``, so building it is deterministic and
takes seconds. I/O names and dtypes are upstream's, so exported artifacts are interchangeable:
``input_ids``/``attention_mask``/``marker_pos`` int64, ``marker_mask`` bool, ``qtype`` int64 [B]
-> ``logits`` float32 [B, K] (padded slots -1e4) and ``act_logits`` float32 [B, n_act], plus
cascade's own ``pooled`` float32 [B, hidden]: the encoder's output averaged over each row's
tokens (what the novelty gate measures distances on; the other outputs do not depend on it).
The batch, sequence and marker axes are dynamic; K must be at least 2 (TopK(2) in the act head).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from cascade.laya.config import LayaConfig
from cascade.laya.graph_band import BandTensors, banded_attention, make_band
from cascade.laya.graph_head import head, scorer_and_act
from cascade.laya.graph_ops import (
    MASKED,
    Builder,
    attention,
    full_attention,
    linear,
    norm,
    rope_tables,
)

OPSET = 20  # Gelu needs 20


def _encoder(
    g: Builder,
    cfg: LayaConfig,
    w: dict[str, np.ndarray],
    key_add: str,
    band: BandTensors,
    pos_f: str,
) -> str:
    e = cfg.encoder
    x = g.op("Gather", g.const(w["encoder.embeddings.tok_embeddings.weight"]), "input_ids")
    x = norm(g, x, w, "encoder.embeddings.norm", e.norm_eps)
    ropes = {
        True: rope_tables(g, pos_f, e.global_theta, e.head_dim),
        False: rope_tables(g, pos_f, e.local_theta, e.head_dim),
    }
    attends = {True: full_attention(g, key_add), False: banded_attention(g, band, e.head_dim)}
    for i, is_global in enumerate(e.global_layers):
        p = f"encoder.layers.{i}."
        a = x if i == 0 else norm(g, x, w, p + "attn_norm", e.norm_eps)
        o = attention(
            g,
            a,
            g.const(np.ascontiguousarray(w[p + "attn.Wqkv.weight"].T)),
            None,
            e.heads,
            e.head_dim,
            attends[is_global],
            ropes[is_global],
        )
        x = g.op("Add", x, linear(g, o, w, p + "attn.Wo", bias=False))
        m = linear(g, norm(g, x, w, p + "mlp_norm", e.norm_eps), w, p + "mlp.Wi", bias=False)
        inp, gate = g.ops("Split", m, axis=-1, outputs=2, num_outputs=2)
        y = g.op("Mul", g.op("Gelu", inp), gate)
        x = g.op("Add", x, linear(g, y, w, p + "mlp.Wo", bias=False))
    return norm(g, x, w, "encoder.final_norm", e.norm_eps)


def _pooled(g: Builder, encoded: str) -> None:
    """``pooled``: the mean of ``encoded`` [B, L, H] over each row's unpadded tokens."""
    mask = g.op(
        "Unsqueeze",
        g.op("Cast", "attention_mask", to=TensorProto.FLOAT),
        g.const(np.array([2], np.int64)),
    )  # [B, L, 1]
    axis = g.const(np.array([1], np.int64))
    total = g.op("ReduceSum", g.op("Mul", encoded, mask), axis, keepdims=0)
    g.nodes.append(
        helper.make_node("Div", [total, g.op("ReduceSum", mask, axis, keepdims=0)], ["pooled"])
    )


def build_graph(cfg: LayaConfig, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The whole forward (encoder, decision head, scorer, act head) as one ONNX model."""
    g = Builder()
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
    band = make_band(g, length, cfg.encoder.window)
    encoded = _encoder(g, cfg, weights, key_add, band, pos_f)
    scorer_and_act(g, weights, head(g, cfg, weights, encoded, key_add, read))
    _pooled(g, encoded)

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
        io("pooled", TensorProto.FLOAT, ["batch", cfg.encoder.hidden]),
    ]
    graph = helper.make_graph(g.nodes, "laya", inputs, outputs, initializer=g.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="cascade.laya"
    )
    model.ir_version = 10
    return model
