"""Row assembly and collation, token for token as Laya builds them (spec §2.3, §2.4).

One row per (state, question)::

    [CLS] <type> question: <instructions> [SEP] [MASK] opt0 [MASK] opt1 ... [SEP] <state> [SEP]

``head_max_len`` caps instructions plus options (options at 48 tokens each; below a 16-token
remainder every option, its [MASK] included, is cut to ``max(4, (head_max_len - 16) // n)``;
instructions keep at least 8 tokens). The state fills what ``max_len`` leaves: str/dict states
keep their start, list states (conversations) keep their newest tokens. Truncating the state is
silent (reported in usage); losing an option marker is a ``ValidationFailed``.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np

from cascade.errors import ValidationFailed
from cascade.laya.questions import Prepared
from cascade.laya.tokenizer import LayaTokenizer

OPTION_TOKENS = 48  # each option's text is cut to this many tokens before any capping
MIN_OPTION_BUDGET = 16
MIN_OPTION_TOKENS = 4
MIN_INSTRUCTION_TOKENS = 8


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One model input row and what assembling it cost."""

    ids: list[int]
    markers: list[int]  # index of each option's [MASK] in ``ids``, in slot order
    qtype: int
    distinct: int  # options whose capped token spans are still distinct
    tokens_per_option: int | None  # the cap applied to every option, if any
    state_used: int  # state tokens kept in this row

    @property
    def collapsed(self) -> bool:
        return self.distinct < len(self.markers)


def serialize_state(state: str | dict[str, Any] | list[Any]) -> str:
    """A str as is; anything else as ``json.dumps`` with default separators, non-ASCII kept."""
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)


def encode_state(tok: LayaTokenizer, state: str | dict[str, Any] | list[Any]) -> list[int]:
    return tok.encode(tok.strip_mask(serialize_state(state)))


def build_head(
    tok: LayaTokenizer, q: Prepared, head_max_len: int
) -> tuple[list[int], list[int], int, int | None]:
    """``(head ids, markers, distinct options, per-option cap)`` for one question."""
    texts = [f"{q.type} question: {tok.strip_mask(q.instructions)}"]
    slots = q.order if q.order is not None else range(len(q.options))
    texts += [" " + tok.strip_mask(q.options[i]) for i in slots]
    head_ids, *encoded = tok.encode_many(texts)
    opt_ids = [[tok.mask_id, *ids[:OPTION_TOKENS]] for ids in encoded]
    budget = head_max_len - sum(map(len, opt_ids))
    per_option = None
    if budget < MIN_OPTION_BUDGET:
        per_option = max(
            MIN_OPTION_TOKENS, (head_max_len - MIN_OPTION_BUDGET) // max(1, len(opt_ids))
        )
        opt_ids = [o[:per_option] for o in opt_ids]
        budget = head_max_len - sum(map(len, opt_ids))
    ids = [tok.cls_id, *head_ids[: max(MIN_INSTRUCTION_TOKENS, budget)], tok.sep_id]
    markers = []
    for o in opt_ids:
        markers.append(len(ids))
        ids += o
    ids.append(tok.sep_id)
    return ids, markers, len({tuple(o) for o in opt_ids}), per_option


def build_row(
    tok: LayaTokenizer,
    q: Prepared,
    state_ids: list[int],
    *,
    keep_newest: bool,
    max_len: int,
    head_max_len: int,
) -> Row:
    """Assemble one row; raises ``ValidationFailed`` when option markers do not fit."""
    ids, markers, distinct, per_option = build_head(tok, q, head_max_len)
    room = max(0, max_len - len(ids) - 1)  # -1 keeps room for the closing [SEP]
    kept = state_ids[max(0, len(state_ids) - room) :] if keep_newest else state_ids[:room]
    ids = (ids + kept + [tok.sep_id])[:max_len]
    fitting = [m for m in markers if m < max_len]
    if len(fitting) != len(markers):
        raise ValidationFailed.at(
            ["questions", q.qid],
            f"question {q.qid!r}: only {len(fitting)} of its {len(markers)} option markers fit "
            f"in max_len={max_len} with head_max_len={head_max_len} spent on the question; "
            "lower head_max_len, raise max_len, or use fewer options",
        )
    return Row(
        ids=ids,
        markers=markers,
        qtype=q.qtype,
        distinct=distinct,
        tokens_per_option=per_option,
        state_used=len(kept),
    )


def build_rows(
    tok: LayaTokenizer,
    state: str | dict[str, Any] | list[Any],
    questions: list[Prepared],
    *,
    max_len: int,
    head_max_len: int,
) -> tuple[list[Row], int]:
    """Rows of every question in request order, and the state's full token count."""
    state_ids = encode_state(tok, state)
    rows = [
        build_row(
            tok,
            q,
            state_ids,
            keep_newest=isinstance(state, list),
            max_len=max_len,
            head_max_len=head_max_len,
        )
        for q in questions
    ]
    return rows, len(state_ids)


def collate(rows: list[Row], pad_id: int) -> dict[str, np.ndarray]:
    """The five model inputs: right-padded ids, and at least 2 marker columns (TopK(2))."""
    n, width = len(rows), max(len(r.ids) for r in rows)
    k = max(2, max(len(r.markers) for r in rows))
    ids = np.full((n, width), pad_id, dtype=np.int64)
    mask = np.zeros((n, width), dtype=np.int64)
    pos = np.zeros((n, k), dtype=np.int64)
    mmask = np.zeros((n, k), dtype=bool)
    for i, r in enumerate(rows):
        ids[i, : len(r.ids)] = r.ids
        mask[i, : len(r.ids)] = 1
        pos[i, : len(r.markers)] = r.markers
        mmask[i, : len(r.markers)] = True
    qtype = np.array([r.qtype for r in rows], dtype=np.int64)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "marker_pos": pos,
        "marker_mask": mmask,
        "qtype": qtype,
    }
