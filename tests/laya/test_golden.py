"""Upstream's recorded goldens (tests/fixtures/laya-golden, see its SOURCE.md) through our rows
and decode.

Decode: recorded logits -> our decode -> the recorded answers, for every case. Rows: a fake
tokenizer replays the recorded token ids of each text (the real tokenizers are not available),
so our row assembly, capping, truncation, collation and usage must reproduce the recorded rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cascade.laya import decode
from cascade.laya.config import EncoderConfig, LayaConfig
from cascade.laya.questions import prepare
from cascade.laya.rows import build_rows, collate, serialize_state
from cascade.schema import Question
from tests.laya.conftest import laya_dicts, to_questions

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "laya-golden"
CASES = sorted(GOLDEN.glob("*/case_*.json"))
assert len(CASES) == 30, f"expected the 30 upstream golden cases under {GOLDEN}"
CAPPED = {"many_options", "shortlist_many_options"}  # options were cut to a per-option cap
FILLER = 999_999  # stands for tokens the recording cut away


def load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    return json.loads(path.read_text()), json.loads((path.parent / "meta.json").read_text())


def questions_of(case: dict) -> dict[str, Question]:
    """The case's questions through the wire schema, as the gateway decodes them."""
    return to_questions(case.get("reduced_questions") or case["questions"])


def config_of(meta: dict) -> LayaConfig:
    encoder = EncoderConfig(
        hidden=64,
        layers=1,
        heads=1,
        intermediate=64,
        vocab=8,
        window=8,
        global_theta=1.0,
        local_theta=1.0,
        global_layers=(True,),
    )
    return LayaConfig(
        encoder_id="golden",
        head_layers=0,
        n_act=2,
        max_len=meta["max_len"],
        head_max_len=meta["head_max_len"],
        temperature=tuple(meta["temperature"]),
        temperature_by_options=meta["temperature_by_options"],
        encoder=encoder,
    )


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recorded_logits_decode_to_recorded_answers(path: Path) -> None:
    case, meta = load(path)
    cfg = config_of(meta)
    questions = questions_of(case)
    prepared = prepare(questions)
    outputs = [
        (
            np.asarray(case["logits"][i][: len(pq["markers"])], dtype=np.float32),
            np.asarray(case["act_logits"][i], dtype=np.float32),
            None,
        )  # no pooled vector
        for i, pq in enumerate(case["per_question"])
    ]
    rows = [
        _Markers(len(pq["markers"]), q.qtype)
        for pq, q in zip(case["per_question"], prepared, strict=True)
    ]
    results = decode.results(prepared, rows, outputs, cfg)  # type: ignore[arg-type]
    usage = decode.usage([], [], 0)
    assert laya_dicts(questions, results, usage)["answers"] == case["result"]["answers"]


class _Markers:
    """The two row facts decoding reads: the option count and the question type."""

    def __init__(self, n: int, qtype: int) -> None:
        self.markers = [0] * n
        self.qtype = qtype


class ReplayTokenizer:
    """Answers ``encode`` with the ids the recording shows for each text."""

    def __init__(self, meta: dict, table: dict[str, list[int]]) -> None:
        special = meta["special_tokens"]
        self.cls_id, self.sep_id = special["cls_id"], special["sep_id"]
        self.pad_id, self.mask_id = special["pad_id"], special["mask_id"]
        self.mask_text = special["mask_token"]
        self.table = table

    def encode(self, text: str) -> list[int]:
        return list(self.table[text])

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def strip_mask(self, text: str) -> str:
        return text.replace(self.mask_text, " ")


def replay_table(case: dict, meta: dict) -> dict[str, list[int]]:
    """Text -> recorded ids, padded with FILLER where the recording shows a cut."""
    sep, mask = meta["special_tokens"]["sep_id"], meta["special_tokens"]["mask_token"]
    capped = case["name"] in CAPPED
    state_tokens = case["result"]["usage"]["state_tokens"]
    table: dict[str, list[int]] = {}
    best_state: list[int] = []
    for pq in case["per_question"]:
        ids, markers = pq["input_ids"], pq["markers"]
        head_end = ids.index(sep, markers[-1])
        spans = [ids[a + 1 : b] for a, b in zip(markers, [*markers[1:], head_end], strict=True)]
        # under a cap, the options that reach it and the instructions that fill what the options
        # leave were cut: their texts continue past what the row shows
        per = max(map(len, spans)) + 1 if capped else None
        head = ids[1 : markers[0] - 1]
        head_cut = capped and len(head) == max(
            8, meta["head_max_len"] - sum(len(x) + 1 for x in spans)
        )
        table[pq["head_text"]] = head + [FILLER] * 64 * head_cut
        for text, span in zip(pq["options"], spans, strict=True):
            table[" " + text.replace(mask, " ")] = span + [FILLER] * 64 * (len(span) + 1 == per)
        best_state = max(best_state, ids[head_end + 1 : -1], key=len)
    missing = [FILLER] * (state_tokens - len(best_state))
    newest = isinstance(case["state"], list)
    table[serialize_state(case["state"]).replace(mask, " ")] = (
        missing + best_state if newest else best_state + missing
    )
    return table


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recorded_rows_are_rebuilt(path: Path) -> None:
    case, meta = load(path)
    tok = ReplayTokenizer(meta, replay_table(case, meta))
    questions = prepare(questions_of(case))
    rows, state_tokens = build_rows(
        tok,
        case["state"],
        questions,
        max_len=meta["max_len"],  # type: ignore[arg-type]
        head_max_len=meta["head_max_len"],
    )
    assert [r.ids for r in rows] == [pq["input_ids"] for pq in case["per_question"]]
    assert [r.markers for r in rows] == [pq["markers"] for pq in case["per_question"]]
    batch = collate(rows, tok.pad_id)
    for name, want in case["batch"].items():
        np.testing.assert_array_equal(batch[name], np.asarray(want), err_msg=name)
    usage = decode.usage(questions, rows, state_tokens)
    built = laya_dicts({}, {}, usage)["usage"]
    assert built == case["result"]["usage"]
