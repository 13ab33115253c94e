"""The ONNX graph against the torch reference, across lengths and head depths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from cascade.laya.checkpoint import load_weights
from cascade.laya.config import load_config
from cascade.laya.export import sample_feeds
from cascade.laya.graph import build_graph
from cascade.laya.tiny import write_random


def max_diffs(ckpt: Path, shapes: list[tuple[int, int, int]]) -> list[tuple[float, float]]:
    import torch

    from cascade.laya.torch_ref import TorchLaya

    torch.set_num_threads(1)
    cfg = load_config(ckpt)
    weights = load_weights(ckpt, cfg)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(build_graph(cfg, weights).SerializeToString(), options)
    reference = TorchLaya(cfg, weights)
    out = []
    for seq, batch, markers in shapes:
        feeds = sample_feeds(cfg, batch, seq, markers, seed=seq)
        ours, ref = session.run(["logits", "act_logits"], feeds), reference.forward(feeds)
        out.append(tuple(float(np.abs(a - b).max()) for a, b in zip(ours, ref, strict=True)))
    return out


def test_sliding_window_chunks_match_full_attention_at_any_length(
    tiny_dirs: dict[str, Path],
) -> None:
    # window 8 -> chunks of 4: lengths below, at and between chunk multiples, and long rows
    shapes = [(3, 2, 2), (5, 3, 2), (13, 3, 4), (31, 2, 5), (97, 3, 5), (130, 2, 3)]
    for logits, act in max_diffs(tiny_dirs["v5"], shapes):
        assert logits < 1e-4 and act < 1e-4


@pytest.mark.parametrize("head_layers", [0, 1])
def test_other_head_depths(tmp_path: Path, head_layers: int) -> None:
    ckpt = write_random(tmp_path / "c", agent={"head_layers": head_layers}, seed=5)
    for logits, act in max_diffs(ckpt, [(40, 3, 4)]):
        assert logits < 1e-4 and act < 1e-4
