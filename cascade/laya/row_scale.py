"""Row scaling of a GEMM's input, the graph rewrite the int8 recipe applies before quantizing.

ONNX Runtime's dynamic quantization quantizes a GEMM's input with one scale for the whole
tensor (every row of the batch, every token). ``row_scale`` rewrites ``y = MatMul(x, W)`` as::

    r = max(ReduceMax(|x|, last axis), 1e-12)     # one scale per token row
    y = Mul(MatMul(Div(x, r), W), r)

which is the same product in fp32 (up to rounding), but the quantized ``MatMul`` then sees rows
of max |value| 1: the per-tensor scale fits every row about as well as a scale of its own would,
instead of being set by the batch's most extreme token. The ``MatMul`` keeps its name and its
weight initializer, so the quantizer still finds and selects it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import helper, numpy_helper

TINY = "row_scale/tiny"
AXES = "row_scale/axes"


def row_scale(model: Any, names: set[str]) -> None:
    """Rewrite the ``MatMul`` nodes named ``names`` in ``model`` (in place) as above."""
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(1e-12, np.float32), TINY),
            numpy_helper.from_array(np.array([-1], np.int64), AXES),
        ]
    )
    nodes = []
    for node in model.graph.node:
        if node.name not in names:
            nodes.append(node)
            continue
        if node.op_type != "MatMul":
            raise ValueError(f"row_scale: {node.name} is a {node.op_type}, not a MatMul")
        x, y, p = node.input[0], node.output[0], node.name
        nodes += [
            helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
            helper.make_node(
                "ReduceMax", [f"{p}/abs", AXES], [f"{p}/amax"], name=f"{p}/ReduceMax", keepdims=1
            ),
            helper.make_node("Max", [f"{p}/amax", TINY], [f"{p}/r"], name=f"{p}/Max"),
            helper.make_node("Div", [x, f"{p}/r"], [f"{p}/x"], name=f"{p}/Div"),
        ]
        node.input[0], node.output[0] = f"{p}/x", f"{p}/y"
        nodes += [node, helper.make_node("Mul", [f"{p}/y", f"{p}/r"], [y], name=f"{p}/Mul")]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
