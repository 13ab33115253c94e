"""Reading request files, and the teacher's answers in the rows' slot order."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

from cascade.laya.preview import Previewer
from cascade.learn import dataset
from cascade.learn.figures import _unslot
from cascade.learn.source import SourceError, read_requests


def test_refused_lines_and_images_are_counted_not_fatal(tmp_path: Path) -> None:
    good = {
        "id": 1,
        "state": "hello",
        "gold": {"q": "a"},
        "source": "x",
        "questions": {"q": {"type": "choice", "criteria": ["a", "b"]}},
    }
    lines = [
        good,
        {**good, "id": 2},  # the same content twice: one item
        {**good, "state": "hi", "questions": {"q": {"type": "choice", "criteria": []}}},
        {**good, "state": "img", "images": ["aGVsbG8="]},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + "{oops\n")
    items, left_out = read_requests(path)
    assert [i.call.state for i in items] == ["hello"]
    assert left_out["invalid"] == 2 and left_out["with_images"] == 1
    assert left_out["first_invalid"].startswith("line 3:")
    path.write_text("{oops\n")
    with pytest.raises(SourceError, match="no usable text requests"):
        read_requests(path)


def test_teacher_probabilities_follow_option_order(demo_dir: Path, tmp_path: Path) -> None:
    question = {
        "type": "score",
        "instructions": "How angry?",
        "criteria": ["a", "b", "c"],
        "option_order": [2, 0, 1],
    }
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"id": 1, "state": "x", "questions": {"q": question}}) + "\n")
    (item,), _ = read_requests(path)
    taught = msgspec.structs.replace(item, teacher={"q": [0.7, 0.2, 0.1]})
    previewer = Previewer({"english": demo_dir / "laya-english"})
    built = dataset.build(previewer, "english", [taught], held_back=0.0)
    (example,) = built.train
    assert example.teacher == [0.1, 0.7, 0.2]  # slot s shows option order[s]
    back = _unslot(np.array(example.teacher), question["option_order"])
    assert back.tolist() == [0.7, 0.2, 0.1]
