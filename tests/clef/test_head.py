"""Our batched joint schema head against the reference head, and its tensor names."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cascade.clef.head import JointSchemaHead


@dataclass(frozen=True)
class Q:
    question_type: int
    question_span: tuple[int, int]
    option_spans: tuple[tuple[int, int], ...]


def test_state_dict_matches_the_reference_layout(reference, tiny_release):
    jsm, model, _ = reference
    config = json.loads((tiny_release / "joint_head_config.json").read_text())
    ours = {k: tuple(v.shape) for k, v in JointSchemaHead(**config).state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in jsm.JointSchemaHead(**config).state_dict().items()}
    assert ours == theirs
    assert set(load_file(tiny_release / "joint_head.safetensors")) == set(theirs)


@pytest.mark.parametrize("seed", [0, 1])
def test_padded_batch_matches_reference_head(reference, tiny_release, seed):
    """Right-padded rows of different lengths, many questions and options, random states."""
    jsm, model, _ = reference
    generator = torch.Generator().manual_seed(seed)
    lengths = [57, 40, 23]
    batch, length, hidden_size = len(lengths), max(lengths), 64
    hidden = torch.randn(batch, length, hidden_size, generator=generator)
    input_ids = torch.randint(0, 400, (batch, length), generator=generator)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    records = [
        [
            Q(1, (2, 5), ((6, 8), (8, 11), (12, 13), (13, 20))),
            Q(0, (21, 22), ((23, 25), (25, 30))),
            Q(2, (31, 35), ((36, 37), (38, 40), (41, 50))),
        ],
        [Q(0, (0, 3), ((3, 5), (6, 9)))],
        [Q(2, (1, 2), ((2, 4), (4, 5), (5, 7), (7, 9), (9, 12))), Q(1, (12, 14), ((15, 22),))],
    ]
    weight = model.language_model.get_output_embeddings().weight
    ours = JointSchemaHead(**json.loads((tiny_release / "joint_head_config.json").read_text()))
    ours.load_state_dict(model.head.state_dict())
    with torch.inference_mode():
        theirs = model.head(hidden, input_ids, mask, [_Record(r) for r in records], weight)
        mine = ours.eval()(hidden, input_ids, mask.sum(-1), records, weight)
    for record_ours, record_theirs in zip(mine, theirs, strict=True):
        for a, b in zip(record_ours, record_theirs, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4, rtol=0)


@dataclass(frozen=True)
class _Record:
    questions: list[Q]


def test_spans_outside_the_row_are_refused(tiny_release):
    head = JointSchemaHead(**json.loads((tiny_release / "joint_head_config.json").read_text()))
    with pytest.raises(ValueError, match="outside"):
        head(
            torch.zeros(1, 4, 64),
            torch.zeros(1, 4, dtype=torch.long),
            torch.tensor([4]),
            [[Q(0, (0, 1), ((1, 9),))]],
            torch.zeros(10, 64),
        )
