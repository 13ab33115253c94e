"""Turn request bytes into validated wire Structs, with errors in the contract's shapes.

A body that is not JSON (truncated, NaN, invalid UTF-8, lone surrogates, nested past the
decoder's depth) is a 422 in FastAPI's shape, as the hosted Jev API answers it:
``{"loc": ["body", POS], "msg": "JSON decode error", "type": "json_invalid"}`` with POS the
character offset of the error; an empty body is 422 ``missing`` at ``["body"]``. A body that
parses but breaks the schema is a 422 whose ``loc`` names the question id; a text over its own
length limit is a 422 ``string_too_long`` at its ``loc``; a request over a size limit (state,
all texts together, a batch's answers) is a 413 that names the limit. Nothing here raises
anything but ``ClientError`` subclasses, and nothing here tokenizes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cascade.errors import PayloadTooLarge, ValidationFailed
from cascade.overrides import msgspec as messages
from cascade.questions import option_names, render_text
from cascade.schema import (
    LIMITS,
    ChoiceQuestion,
    Controls,
    Limits,
    NoulQuestion,
    Question,
    RequestEnvelope,
    ScoreQuestion,
    encoder,
    envelope_decoder,
    question_decoder,
)

_INT_BOUND = 2**63


def decode_at(
    decoder: msgspec.json.Decoder, data: bytes | msgspec.Raw, prefix: list[str | int]
) -> Any:
    """``data`` decoded by ``decoder``; a failure is a ``ValidationFailed`` whose ``loc`` starts
    with ``prefix`` (msgspec's message read by ``cascade.overrides.msgspec``)."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        msg, loc = messages.split(str(exc))
        missing = messages.missing_field(msg)
        if missing is not None:
            loc.append(missing)
        kind = "missing" if missing is not None else "value_error"
        if messages.too_long(msg):
            kind = "string_too_long"
        raise ValidationFailed.at([*prefix, *loc], msg, kind) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise json_invalid(bytes(data), exc) from None


def json_invalid(body: bytes, exc: Exception) -> ValidationFailed:
    """FastAPI's answer to a body that does not parse, at the character where it breaks."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as bad:
        at = bad.start
    else:
        at = messages.error_byte(exc, len(body))
    position = len(body[:at].decode("utf-8", "replace"))
    item = {"loc": ["body", position], "msg": "JSON decode error", "type": "json_invalid"}
    reason = f"request body is not valid JSON at character {position}: {exc}"
    return ValidationFailed([item], reason)


def check_json_value(value: Any, loc: list[str | int], limits: Limits = LIMITS) -> None:
    """Depth and integer bounds of free-form JSON (states, structured instructions)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limits.max_json_depth:
            raise ValidationFailed.at(
                loc, f"JSON nesting deeper than {limits.max_json_depth} levels", "too_deep"
            )
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= _INT_BOUND:
            raise ValidationFailed.at(loc, "integer outside the 64-bit range", "int_range")


def _text_chars(value: Any, loc: list[str | int], limit: int, limits: Limits) -> int:
    """The length of a client text (structured JSON: serialized), refused past ``limit``."""
    if isinstance(value, str):
        size = len(value)
    elif isinstance(value, dict | list):
        check_json_value(value, loc, limits)
        size = len(msgspec.json.encode(value))
    else:
        size = len(str(value))  # a number or bool label
    if size > limit:
        raise ValidationFailed.at(
            loc, f"String should have at most {limit} characters (got {size})", "string_too_long"
        )
    return size


def _question_chars(qid: str, q: Question, limits: Limits) -> int:
    """Every text of a question (id, instructions, labels, descriptions, levels), each within its
    limit; returns their total length."""
    loc: list[str | int] = ["questions", qid]
    total = len(qid)
    if q.instructions is not None:
        total += _text_chars(
            q.instructions, [*loc, "instructions"], limits.max_instructions_chars, limits
        )
    criteria = q.criteria
    if isinstance(criteria, dict):
        for i, (key, value) in enumerate(criteria.items()):
            total += _text_chars(key, [*loc, "criteria", i], limits.max_label_chars, limits)
            if value is not None:
                total += _text_chars(
                    value, [*loc, "criteria", key], limits.max_option_chars, limits
                )
    elif isinstance(criteria, list):
        limit = limits.max_label_chars if isinstance(q, ChoiceQuestion) else limits.max_option_chars
        for i, value in enumerate(criteria):
            total += _text_chars(value, [*loc, "criteria", i], limit, limits)
    if isinstance(q, NoulQuestion) and q.labels is not None:
        for name in ("false", "true"):
            total += _text_chars(
                getattr(q.labels, name), [*loc, "labels", name], limits.max_label_chars, limits
            )
    return total


def _check_question(qid: str, q: Question, limits: Limits) -> None:
    loc: list[str | int] = ["questions", qid]
    if isinstance(q, ChoiceQuestion):
        n = len(q.criteria)
        if n > limits.max_choice_options:
            raise PayloadTooLarge(
                f"question {qid!r} has {n} options; at most {limits.max_choice_options} allowed"
            )
        if len(set(option_names(q))) != n:  # the wire keys: True and "true" collide
            raise ValidationFailed.at([*loc, "criteria"], "choice labels must be unique")
    elif isinstance(q, ScoreQuestion):
        n = len(q.criteria)
        if n > limits.max_score_levels:
            raise PayloadTooLarge(
                f"question {qid!r} has {n} levels; at most {limits.max_score_levels} allowed"
            )
    else:
        n = 2
        _check_noul(loc, q)
    if n == 0:
        raise ValidationFailed.at([*loc, "criteria"], "criteria must not be empty")
    if q.option_order is not None and sorted(q.option_order) != list(range(n)):
        raise ValidationFailed.at(
            [*loc, "option_order"], f"option_order must be a permutation of 0..{n - 1}"
        )


def _check_noul(loc: list[str | int], q: NoulQuestion) -> None:
    if q.criteria is not None:
        unknown = {k for k in q.criteria if k.lower() not in ("true", "false")}
        if unknown:
            raise ValidationFailed.at(
                [*loc, "criteria"], f"noul criteria keys must be 'true'/'false', got {unknown}"
            )
    if q.labels is not None:
        false, true = q.labels.false.strip(), q.labels.true.strip()
        if not false or not true or false == true:
            raise ValidationFailed.at([*loc, "labels"], "labels must be distinct non-empty strings")


def _questions(raw: dict[str, msgspec.Raw], limits: Limits) -> tuple[dict[str, Question], int]:
    if not raw:
        raise ValidationFailed.at(["questions"], "at least one question is required")
    if len(raw) > limits.max_questions:
        raise PayloadTooLarge(f"{len(raw)} questions; at most {limits.max_questions} allowed")
    for qid in raw:
        if not qid or len(qid) > limits.max_question_id_chars:
            raise ValidationFailed.at(
                ["questions", qid[: limits.max_question_id_chars]],
                f"question ids must have 1 to {limits.max_question_id_chars} characters",
            )
    questions = {
        qid: decode_at(question_decoder, body, ["questions", qid]) for qid, body in raw.items()
    }
    chars = sum(_question_chars(qid, q, limits) for qid, q in questions.items())
    if chars > limits.max_question_text_chars:
        raise PayloadTooLarge(
            f"the questions' texts have {chars} characters together; at most "
            f"{limits.max_question_text_chars}"
        )
    for qid, q in questions.items():
        _check_question(qid, q, limits)
    total = sum(2 if isinstance(q, NoulQuestion) else len(q.criteria) for q in questions.values())
    if total > limits.max_total_options:
        raise PayloadTooLarge(f"{total} options in total; at most {limits.max_total_options}")
    return questions, chars


def check_state(state: Any, loc: list[str | int], limits: Limits = LIMITS) -> int:
    """The state's size in characters (structured: serialized), refused past the limit."""
    if isinstance(state, str):
        size = len(state)
    else:
        check_json_value(state, loc, limits)
        size = len(msgspec.json.encode(state))
    if size > limits.max_state_chars:
        raise PayloadTooLarge(f"state too large ({size} > {limits.max_state_chars} characters)")
    return size


def check_request_text(chars: int, limits: Limits = LIMITS) -> None:
    """The total of a request's texts: its state(s) and its questions' texts."""
    if chars > limits.max_request_text_chars:
        raise PayloadTooLarge(
            f"the request's texts (states and questions) have {chars} "
            f"characters together; at most {limits.max_request_text_chars}"
        )


_STATE_BYTES = 1024  # model, usage and x_cascade of one result, besides per-question entries
_QUESTION_BYTES = 512  # an answer's numbers and tags, its tier, reason and usage entries
_OPTION_BYTES = 40  # an option's probability (and score legend key) with its punctuation
_QID_COPIES = 6  # answers, x_cascade tiers / reasons / degraded, usage options / truncated


def answer_bytes(questions: dict[str, Question]) -> int:
    """An upper bound of one state's encoded answer (``SystemOneResponse``) to ``questions``:
    what each result of a batch repeats. Choice labels appear twice at most (``probabilities``
    and ``choice``), score levels once (``legend``)."""
    size = _STATE_BYTES
    for qid, q in questions.items():
        size += _QUESTION_BYTES + _QID_COPIES * len(encoder.encode(qid))
        size += sum(2 * len(encoder.encode(name)) + _OPTION_BYTES for name in option_names(q))
        if isinstance(q, ScoreQuestion):
            size += sum(len(encoder.encode(render_text(level))) for level in q.criteria)
    return size


def check_batch_answer(
    states: int, questions: dict[str, Question], limits: Limits = LIMITS
) -> None:
    """Refuse a batch whose answers could pass ``max_batch_answer_bytes`` before any work."""
    bound = states * answer_bytes(questions)
    if bound > limits.max_batch_answer_bytes:
        raise PayloadTooLarge(
            f"the batch's answers could reach {bound} bytes ({states} states x "
            f"{bound // states} bytes of labels, levels and numbers each); at most "
            f"{limits.max_batch_answer_bytes}: send fewer states per batch or shorter labels"
        )


def parse_envelope(body: bytes) -> RequestEnvelope:
    if not body.strip():
        raise ValidationFailed.at([], "Field required", "missing")
    return decode_at(envelope_decoder, body, [])


def parse_questions(
    env: RequestEnvelope, limits: Limits = LIMITS
) -> tuple[dict[str, Question], int]:
    """The validated questions, and the length of their texts together."""
    return _questions(env.questions, limits)


def controls_of(env: RequestEnvelope) -> Controls:
    return Controls(
        max_len=env.max_len,
        head_max_len=env.head_max_len,
        task=env.task,
        lang=env.lang,
        lang_guess=env.lang_guess,
        min_confidence=env.min_confidence,
    )
