"""Index tensors that let the joint schema head run a padded batch in one pass.

Every question and option of every record becomes a *segment* (questions first, then
options, in record → question → option order). ``Layout`` holds, for each segment, the flat
positions ``b * L + t`` of its tokens and where its result goes in padded ``[B, slots, W]``
tensors. Built once per batch on the CPU and moved to the device in one go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Layout:
    batch: int
    n_questions: int
    counts: tuple[tuple[int, ...], ...]  # options per question, per record
    positions: Tensor  # [T] flat token positions of all segments
    segment: Tensor  # [T] segment id of each position
    sizes: Tensor  # [n_questions + n_options] tokens per segment
    question_record: Tensor  # [nQ]
    question_slot: Tensor  # [nQ] index of the question inside its record
    question_types: Tensor  # [nQ]
    question_padding: Tensor  # [B, max questions] True where no question
    option_record: Tensor  # [nO]
    option_slot: Tensor  # [nO] index of the option among all options of its record
    option_question: Tensor  # [nO] global question index
    max_options: int

    @classmethod
    def build(
        cls, records: Sequence[Sequence[Any]], lengths: Tensor, length: int, device: torch.device
    ) -> Layout:
        """``records[b]``: objects with ``question_type``, ``question_span``, ``option_spans``."""
        limits = lengths.tolist()
        q_spans: list[tuple[int, int, int]] = []
        o_spans: list[tuple[int, int, int]] = []
        cols: dict[str, list[int]] = {k: [] for k in ("qr", "qs", "qt", "or", "os", "oq")}
        for b, questions in enumerate(records):
            slot = 0
            for k, question in enumerate(questions):
                q_index = len(q_spans)
                q_spans.append((b, *_checked(question.question_span, limits[b])))
                cols["qr"].append(b)
                cols["qs"].append(k)
                cols["qt"].append(int(question.question_type))
                for span in question.option_spans:
                    o_spans.append((b, *_checked(span, limits[b])))
                    cols["or"].append(b)
                    cols["os"].append(slot)
                    cols["oq"].append(q_index)
                    slot += 1
        positions: list[int] = []
        segment: list[int] = []
        for index, (b, start, end) in enumerate(q_spans + o_spans):
            positions.extend(range(b * length + start, b * length + end))
            segment.extend([index] * (end - start))

        def tensor(values: list[int]) -> Tensor:
            return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)

        max_questions = max(len(q) for q in records)
        q_padding = torch.ones(len(records), max_questions, dtype=torch.bool)
        for b, questions in enumerate(records):
            q_padding[b, : len(questions)] = False
        return cls(
            batch=len(records),
            n_questions=len(q_spans),
            counts=tuple(tuple(len(q.option_spans) for q in qs) for qs in records),
            positions=tensor(positions),
            segment=tensor(segment),
            sizes=tensor([end - start for _, start, end in q_spans + o_spans]),
            question_record=tensor(cols["qr"]),
            question_slot=tensor(cols["qs"]),
            question_types=tensor(cols["qt"]),
            question_padding=q_padding.to(device),
            option_record=tensor(cols["or"]),
            option_slot=tensor(cols["os"]),
            option_question=tensor(cols["oq"]),
            max_options=max(sum(len(q.option_spans) for q in qs) for qs in records),
        )

    @property
    def option_positions(self) -> Tensor:
        """Flat positions of all option tokens (the tail of ``positions``)."""
        return self.positions[self.segment >= self.n_questions]

    def segment_mean(self, flat: Tensor) -> Tensor:
        """Mean of ``flat[positions]`` per segment: [n_questions + n_options, D]."""
        total = flat.new_zeros(len(self.sizes), flat.shape[-1])
        total.index_add_(0, self.segment, flat[self.positions])
        return total / self.sizes[:, None].to(flat.dtype)

    def option_mean(self, rows: Tensor) -> Tensor:
        """Mean per option of ``rows``, one row per option token (in ``option_positions`` order)."""
        option_segment = self.segment[self.segment >= self.n_questions] - self.n_questions
        total = rows.new_zeros(len(self.sizes) - self.n_questions, rows.shape[-1])
        total.index_add_(0, option_segment, rows)
        return total / self.sizes[self.n_questions :, None].to(rows.dtype)

    def segment_softmax(self, scores: Tensor) -> Tensor:
        """Softmax of per-option ``scores`` over the options of each question."""
        peak = scores.new_full((self.n_questions,), float("-inf"))
        peak = peak.scatter_reduce(0, self.option_question, scores, reduce="amax")
        exp = (scores - peak[self.option_question]).exp()
        total = scores.new_zeros(self.n_questions).index_add_(0, self.option_question, exp)
        return exp / total[self.option_question]

    def pad_options(self, flat: Tensor) -> Tensor:
        out = flat.new_zeros(self.batch, self.max_options, flat.shape[-1])
        out[self.option_record, self.option_slot] = flat
        return out

    def pad_questions(self, flat: Tensor) -> Tensor:
        out = flat.new_zeros(self.batch, self.question_padding.shape[1], flat.shape[-1])
        out[self.question_record, self.question_slot] = flat
        return out

    def split(self, flat: Tensor) -> list[list[Tensor]]:
        """Per-option values back to ``[record][question] -> [n_options]``."""
        parts = iter(torch.split(flat, [n for qs in self.counts for n in qs]))
        return [[next(parts) for _ in qs] for qs in self.counts]


def _checked(span: tuple[int, int], limit: int) -> tuple[int, int]:
    start, end = int(span[0]), int(span[1])
    if not 0 <= start < end <= limit:
        raise ValueError(f"span {span} is empty or outside the {limit} real tokens")
    return start, end
