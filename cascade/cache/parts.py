"""Cached values: a tier's whole answer (joint tiers), or one question's share of it.

A tier that answers each question alone (``Engine.independent_questions``) has its answer split
into one ``CachedPart`` per question and joined back in the caller's question order exactly as
the tier assembles it (Laya's ``cascade.laya.decode.usage``): tokens summed over the rows, the
state's truncation per row, collapsed option spans. ``join(call, split(answer))`` equals ``answer``.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from cascade.calls import EngineAnswer, EngineCall, EngineUsage, QuestionResult, merge
from cascade.schema import OptionSpans


class CachedPart(msgspec.Struct, array_like=True, kw_only=True):
    """One question's share of an answer."""

    model: str
    result: QuestionResult
    row_tokens: int
    state_tokens: int | None
    dropped: int = 0  # state tokens this question's row dropped
    options: OptionSpans | None = None  # its collapsed option spans


_part_encoder = msgspec.msgpack.Encoder()
_part_decoder = msgspec.msgpack.Decoder(CachedPart)
_answer_decoder = msgspec.msgpack.Decoder(EngineAnswer)


def split(answer: EngineAnswer) -> dict[str, CachedPart] | None:
    """One part per question, or None when the usage does not say each row's tokens."""
    usage = answer.usage
    if set(usage.row_tokens) != set(answer.results):
        return None
    return {
        qid: CachedPart(
            model=answer.model,
            result=result,
            row_tokens=usage.row_tokens[qid],
            state_tokens=usage.state_tokens,
            dropped=usage.dropped.get(qid, 0),
            options=usage.options.get(qid),
        )
        for qid, result in answer.results.items()
    }


def join(call: EngineCall, parts: Mapping[str, CachedPart]) -> EngineAnswer | None:
    """The answer to ``call`` from one part per question; None if the parts disagree on what
    answered or on the state's length (then nothing is served from them)."""
    ordered = [(qid, parts[qid]) for qid in call.questions]
    models = {p.model for _, p in ordered}
    states = {p.state_tokens for _, p in ordered}
    if len(models) != 1 or len(states) != 1:
        return None
    return merge([_answer(qid, p) for qid, p in ordered])


def _answer(qid: str, part: CachedPart) -> EngineAnswer:
    """One part as the answer to its question alone."""
    dropped = {qid: part.dropped} if part.dropped > 0 else {}
    return EngineAnswer(
        model=part.model,
        results={qid: part.result},
        usage=EngineUsage(
            input_tokens=part.row_tokens,
            state_tokens=part.state_tokens,
            state_tokens_dropped=part.dropped,
            truncated_questions=list(dropped),
            dropped=dropped,
            row_tokens={qid: part.row_tokens},
            options={qid: part.options} if part.options is not None else {},
        ),
    )


def encode(value: CachedPart | EngineAnswer) -> bytes:
    return _part_encoder.encode(value)


def decode_part(data: bytes) -> CachedPart | None:
    """A part, or None for bytes that are not one (another version's, or damaged)."""
    try:
        return _part_decoder.decode(data)
    except msgspec.DecodeError:
        return None


def decode_answer(data: bytes) -> EngineAnswer | None:
    try:
        return _answer_decoder.decode(data)
    except msgspec.DecodeError:
        return None
