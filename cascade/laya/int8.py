"""Opt-in dynamic int8 quantisation of an export, and how many answers it moves.

Ports found that int8 weights move Laya's answers (spec §5.3), so cascade serves fp32 and only
writes ``model.int8.onnx`` on request, printing how many argmax answers change on a sample of
random well-formed rows and the largest probability shift.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cascade.laya.config import load_config
from cascade.laya.export import META_FILE, MODEL_FILE, sample_feeds

INT8_FILE = "model.int8.onnx"


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def quantize_and_compare(
    export_dir: Path, *, batches: int = 8, progress: Callable[[str], None] = print
) -> dict[str, float]:
    """Write ``model.int8.onnx`` next to the fp32 model; return and print the answer drift."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    cfg = load_config(Path(json.loads((export_dir / META_FILE).read_text())["checkpoint"]))
    progress("laya int8: quantizing weights (dynamic, per-tensor QInt8)")
    quantize_dynamic(
        export_dir / MODEL_FILE,
        export_dir / INT8_FILE,
        weight_type=QuantType.QInt8,
        use_external_data_format=True,
    )
    fp32, int8 = (
        ort.InferenceSession(str(export_dir / f), providers=["CPUExecutionProvider"])
        for f in (MODEL_FILE, INT8_FILE)
    )
    changed = total = 0
    worst = 0.0
    for seed in range(batches):
        feeds = sample_feeds(cfg, 4, min(cfg.max_len, 128), 5, seed=1000 + seed)
        a, b = (s.run(["logits"], feeds)[0] for s in (fp32, int8))
        for row, mask in enumerate(feeds["marker_mask"]):
            pa, pb = _softmax(a[row][mask]), _softmax(b[row][mask])
            changed += int(pa.argmax() != pb.argmax())
            worst = max(worst, float(np.abs(pa - pb).max()))
            total += 1
    progress(
        f"laya int8: {changed} of {total} sample answers changed, max |Δp| {worst:.4f}; "
        f"fp32 stays the served model"
    )
    return {"changed": changed, "total": total, "max_dp": worst}
