"""Clef's prompt: piecewise tokenization, exact spans and the over-long policy (spec §1.2-1.4).

The prompt is a concatenation of separately tokenized pieces; spans are end-exclusive
absolute token indices of the instruction text and of each option's JSON payload. Choice
options appear sorted by id, noul options as ``true`` then ``false``, score levels in order.
Each ``EncodedQuestion`` also carries ``caller_order``, the prompt index of each option in
the caller's order (choice: the request's criteria order; score: levels; noul:
``[false, true]``), so engines can report probabilities the way ``QuestionResult`` wants.

Over-long prompts follow ``overlong``: ``"reject"`` raises ``TokensExceeded``;
``"truncate"`` cuts the state's tail as the reference does and reports the dropped count.
A schema that does not fit even with an empty state is always refused.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cascade.errors import TokensExceeded, ValidationFailed
from cascade.schema import ChoiceQuestion, NoulQuestion, Question

SYSTEM_PROMPT = (
    "Read the complete state and schema. Decide every field jointly. Each answer "
    "must be exactly one of that field's allowed options."
)
PREFIX = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nSTATE:\n"
SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
SCHEMA_HEAD = "\n\nSCHEMA FIELDS:\n"
QUESTION_TYPES = {"noul": 0, "choice": 1, "score": 2}
NOUL_DEFAULTS = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}

Overlong = Literal["reject", "truncate"]
TokenizeBatch = Callable[[list[str]], list[list[int]]]


def locked_tokenize(tokenizer: Any) -> TokenizeBatch:
    """``tokenize_batch`` over a transformers tokenizer, serialized: its wrapper mutates the
    Rust tokenizer per call, so concurrent calls from helper threads can fail."""
    lock = threading.Lock()

    def tokenize_batch(texts: list[str]) -> list[list[int]]:
        with lock:
            return tokenizer(texts, add_special_tokens=False).input_ids

    return tokenize_batch


def render(value: Any) -> str:
    """Strings as they are; anything else as compact, key-sorted, non-ASCII-preserving JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def question_options(question: Question) -> tuple[list[tuple[str, Any]], list[int]]:
    """``(prompt options as (id, description), caller_order)`` for one question."""
    if isinstance(question, NoulQuestion):
        # Keys in any case ("True", "FALSE"), as Laya reads them.
        given = {str(k).lower(): v for k, v in (question.criteria or {}).items()}
        criteria = {**NOUL_DEFAULTS, **given}
        return [("true", criteria["true"]), ("false", criteria["false"])], [1, 0]
    if isinstance(question, ChoiceQuestion):
        if isinstance(question.criteria, dict):
            caller = [(str(k), v) for k, v in question.criteria.items()]
        else:  # Laya's list of labels: ids only, no descriptions
            caller = [(render(label), None) for label in question.criteria]
        prompt = sorted(caller, key=lambda item: item[0])
        index = {oid: i for i, (oid, _) in enumerate(prompt)}
        return prompt, [index[oid] for oid, _ in caller]
    levels = [(str(i), v) for i, v in enumerate(question.criteria)]
    return levels, list(range(len(levels)))


@dataclass(frozen=True)
class EncodedQuestion:
    question_id: str
    question_type: int
    question_span: tuple[int, int]
    option_spans: tuple[tuple[int, int], ...]
    option_ids: tuple[str, ...]  # prompt order
    caller_order: tuple[int, ...]  # prompt index of each option, in the caller's order


@dataclass(frozen=True)
class Encoded:
    """One prompt. ``input_ids`` include media tokens; ``media_offset`` is where they start."""

    input_ids: tuple[int, ...]
    questions: tuple[EncodedQuestion, ...]
    state_tokens: int  # state tokens kept
    state_dropped: int  # state tokens cut in truncate mode
    media_offset: int


# A reject-mode state longer than this many characters per token of the limit has its prefix
# counted first (see ``PromptEncoder._refuse_far_over``).
PREFIX_CHARS_PER_TOKEN = 8
CUT_MARGIN_TOKENS = 64


class PromptEncoder:
    """Builds ``Encoded`` prompts with one batched tokenizer call per request.

    ``tokenize_batch(texts)`` must tokenize each text on its own without special-token
    insertion (``tokenizer(texts, add_special_tokens=False).input_ids``). Thread-safe if
    ``tokenize_batch`` is.
    """

    def __init__(
        self,
        tokenize_batch: TokenizeBatch,
        *,
        max_length: int = 16384,
        overlong: Overlong = "reject",
    ) -> None:
        self.tokenize_batch = tokenize_batch
        self.max_length = max_length
        self.overlong = overlong
        fixed = [PREFIX, SUFFIX, SCHEMA_HEAD, "\nALLOWED OPTIONS:\n", "\n", "END FIELD\n"]
        self._fixed = dict(zip(fixed, tokenize_batch(fixed), strict=True))

    def encode(
        self, state: Any, questions: Mapping[str, Question], media_ids: Sequence[int] = ()
    ) -> Encoded:
        """Encode one request; raises ``TokensExceeded`` per the over-long policy."""
        text = render(state)
        if self.overlong == "reject":
            self._refuse_far_over(text)
        state_ids, schema, spans = self._tokenize(text, questions)
        prefix = self._fixed[PREFIX] + list(media_ids)
        fixed = len(prefix) + len(schema) + len(self._fixed[SUFFIX])
        if fixed > self.max_length:
            raise TokensExceeded(
                f"Clef prompt needs {fixed} tokens before the state (schema and images); "
                f"limit is {self.max_length}"
            )
        total = fixed + len(state_ids)
        if total > self.max_length and self.overlong == "reject":
            raise TokensExceeded(
                f"Clef input has {total} tokens; limit is {self.max_length} "
                f"(state has {len(state_ids)} tokens; overlong=reject)"
            )
        kept = state_ids[: self.max_length - fixed]
        offset = len(prefix) + len(kept)
        return Encoded(
            input_ids=tuple(prefix + kept + schema + self._fixed[SUFFIX]),
            questions=tuple(q.shifted(offset) for q in spans),
            state_tokens=len(kept),
            state_dropped=len(state_ids) - len(kept),
            media_offset=len(self._fixed[PREFIX]),
        )

    def count(self, state: Any, questions: Mapping[str, Question], media_tokens: int = 0) -> int:
        """The full prompt length before any truncation (never raises for length)."""
        state_ids, schema, _ = self._tokenize(render(state), questions)
        return (
            len(self._fixed[PREFIX])
            + media_tokens
            + len(state_ids)
            + len(schema)
            + len(self._fixed[SUFFIX])
        )

    def _refuse_far_over(self, text: str) -> None:
        """Refuse a state whose first ``PREFIX_CHARS_PER_TOKEN × max_length`` characters already
        hold more than ``max_length`` tokens, without tokenizing the rest: a 1,000,000-character
        state took about 1 s and 180 MB to count in full, only to be refused."""
        cut = PREFIX_CHARS_PER_TOKEN * self.max_length
        if len(text) <= cut:
            return
        # Cutting a word can split its tokens differently; the margin keeps the refusal sure.
        (head,) = self.tokenize_batch([text[:cut]])
        if len(head) > self.max_length + CUT_MARGIN_TOKENS:
            raise TokensExceeded(
                f"Clef input is too long: the state's first {cut} characters already hold "
                f"{len(head)} tokens; limit is {self.max_length} (overlong=reject)"
            )

    def _tokenize(
        self, text: str, questions: Mapping[str, Question]
    ) -> tuple[list[int], list[int], list[_PromptSpans]]:
        pieces: list[str] = [text]
        layouts = []
        for i, (qid, question) in enumerate(questions.items()):
            options, caller = question_options(question)
            qtype = question.type
            instructions = question.instructions
            if instructions is None or instructions == "":
                instructions = qid
            pieces.append(f"\nFIELD {i + 1}\nID: {qid}\nTYPE: {qtype}\nINSTRUCTION: ")
            pieces.append(render(instructions))
            for j, (oid, description) in enumerate(options):
                payload = {"option_id": oid}
                if description is not None:
                    payload["description"] = description
                pieces.extend((f"OPTION {j + 1}: ", render(payload)))
            layouts.append((qid, qtype, options, caller))
        tokens = iter(self.tokenize_batch(pieces))
        state_ids = next(tokens)
        schema, spans = self._schema(tokens, layouts)
        return state_ids, schema, spans

    def _schema(self, tokens, layouts) -> tuple[list[int], list[_PromptSpans]]:  # noqa: ANN001
        ids = list(self._fixed[SCHEMA_HEAD])
        spans = []
        for qid, qtype, options, caller in layouts:
            ids += next(tokens)
            start = len(ids)
            ids += next(tokens)
            if len(ids) == start:  # the head averages this span: it must hold a token
                raise ValidationFailed.at(["questions", qid], "question id must not be empty")
            question_span = (start, len(ids))
            ids += self._fixed["\nALLOWED OPTIONS:\n"]
            option_spans = []
            for _ in options:
                ids += next(tokens)
                start = len(ids)
                ids += next(tokens)
                option_spans.append((start, len(ids)))
                ids += self._fixed["\n"]
            ids += self._fixed["END FIELD\n"]
            spans.append(
                _PromptSpans(
                    qid,
                    QUESTION_TYPES[qtype],
                    question_span,
                    option_spans,
                    [oid for oid, _ in options],
                    caller,
                )
            )
        return ids, spans


@dataclass(frozen=True)
class _PromptSpans:
    """Spans relative to the schema block, before the prefix and state are known."""

    qid: str
    qtype: int
    question: tuple[int, int]
    options: list[tuple[int, int]]
    option_ids: list[str]
    caller: list[int]

    def shifted(self, offset: int) -> EncodedQuestion:
        return EncodedQuestion(
            question_id=self.qid,
            question_type=self.qtype,
            question_span=(self.question[0] + offset, self.question[1] + offset),
            option_spans=tuple((s + offset, e + offset) for s, e in self.options),
            option_ids=tuple(self.option_ids),
            caller_order=tuple(self.caller),
        )
