"""The served int8 recipe against the per-tensor reference, on the same rows.

The reference is ONNX Runtime's default dynamic quantization of the fp32 export (every
``MatMul`` with a weight, one scale per tensor: what ``cascade export laya --int8`` wrote
before cascade had a recipe of its own). ``same_rows_flips`` runs the fp32 export and each int8
model on the same rows in the same fixed batches (``batch`` rows, sorted by length, as the
engine's batcher groups them), so both int8 models' activation scales see the same batch-mates,
and counts the answers each changes against fp32 (a flip: another argmax) with its mean and
largest |Δp|.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from cascade.engines.onnx import OnnxSession
from cascade.laya import decode
from cascade.laya.config import LayaConfig
from cascade.laya.rows import Row, collate


def per_tensor(fp32: Path, out: Path) -> Path:
    """Write the per-tensor reference of the fp32 model file ``fp32`` to ``out``; its path."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out.parent.mkdir(parents=True, exist_ok=True)
    quantize_dynamic(
        fp32, out, weight_type=QuantType.QInt8, per_channel=False, use_external_data_format=True
    )
    return out


def _probabilities(
    model: Path, rows: Sequence[Row], cfg: LayaConfig, pad_id: int, threads: int, batch: int
) -> list[np.ndarray]:
    session = OnnxSession(model, intra_op_threads=threads)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].ids))
    out: list[np.ndarray] = [np.empty(0)] * len(rows)
    for start in range(0, len(order), batch):
        group = order[start : start + batch]
        logits, _ = session.run(collate([rows[i] for i in group], pad_id))
        for j, i in enumerate(group):
            k = len(rows[i].markers)
            out[i] = decode.probabilities(
                logits[j, :k], cfg.temperature_for(rows[i].qtype, k), None
            )
    return out


def same_rows_flips(
    fp32: Path,
    models: Mapping[str, Path],
    rows: Sequence[Row],
    cfg: LayaConfig,
    pad_id: int,
    *,
    threads: int,
    batch: int = 8,
) -> dict[str, dict[str, float]]:
    """Per int8 model: questions, flips against ``fp32``, mean and max |Δp| (all model files)."""
    base = _probabilities(fp32, rows, cfg, pad_id, threads, batch)
    found = {}
    for name, path in models.items():
        other = _probabilities(path, rows, cfg, pad_id, threads, batch)
        dps = [float(np.abs(a - b).max()) for a, b in zip(base, other, strict=True)]
        found[name] = {
            "questions": len(rows),
            "flips": sum(int(a.argmax() != b.argmax()) for a, b in zip(base, other, strict=True)),
            "mean_dp": float(np.mean(dps)),
            "max_dp": max(dps),
        }
    return found
