"""OpenAI's ``POST /v1/decisions`` to and from the System One call the cascade answers.

Request (``decision_call``): ``input`` becomes the System One ``state``. A string stays a string;
a list of items becomes a conversation, a list state (``[{"role", "content"}, ...]``, whose newest
tokens Laya keeps when it truncates), one entry per item in order:

- messages: ``{"role", "content"}`` with ``content`` the item's parts concatenated: text as is,
  ``input_json`` as one-line JSON, ``output_text`` and ``refusal`` as their text, each
  ``input_image`` as a placeholder ``<image:N>`` (the image goes to ``images``, N from 1 in order
  of appearance, the questions' images after the input's);
- tool items: ``{"type", "call_id", "name", "arguments" | "input"}`` (and ``namespace``) for
  calls, ``{"type", "call_id", "output"}`` for outputs, rendered as above. An output must follow
  a call of its kind with the same ``call_id``. ``id``, ``status``, ``phase``, ``detail`` and cache
  breakpoints are not rendered.

Questions become System One questions with ids from their ``name`` (unnamed or repeated names:
``question_<index>``): ``predicate`` → ``noul``; ``choice`` → ``choice`` whose criteria map each
value's text to its description (a string that reads like a boolean of the same question, e.g.
``"true"`` beside ``true``, is shown with its JSON quotes, so the labels stay distinct);
``score`` → ``score`` with one level per ``label`` (``label: description`` when described).
The System One validation then runs unchanged (limits, 1-400 questions instead of 1-64), and its
errors are reported at the OpenAI field (``questions[2].choices[1]``).

Answers (``decision``) come back in question order: the System One probabilities with the typed
choice values and the level labels, ``confidence`` as the gateway's profile defines it, and a
``refusal`` for each question the cascade could not answer: the gateway decides once, with
per-question refusals (``Gateway.decide(partial=True)``, ``cascade.policy.flow``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from cascade.calls import EngineCall
from cascade.contracts.openai_schema import (
    QUESTION_TYPES,
    TOOL_TYPES,
    Choice,
    ChoiceProbability,
    CustomToolCall,
    Decision,
    DecisionAnswer,
    DecisionUsage,
    FunctionCall,
    InputImage,
    InputJSON,
    InputTokensDetails,
    OpenAIError,
    OpenAIErrorDetail,
    OutputTokensDetails,
    Predicate,
    PredicateAnswer,
    Refusal,
    RefusalText,
    Score,
    ScoreProbability,
    message_decoder,
    peek_decoder,
    question_decoder,
    request_decoder,
    tool_decoder,
)
from cascade.contracts.openai_schema import ChoiceAnswer as OpenAIChoice
from cascade.contracts.openai_schema import ScoreAnswer as OpenAIScore
from cascade.errors import CascadeError, UnknownModel, ValidationFailed
from cascade.gateway import Outcome
from cascade.questions import render_text
from cascade.request.validation import (
    check_request_text,
    check_state,
    decode_at,
    parse_questions,
)
from cascade.schema import (
    LIMITS,
    Asset,
    ChoiceAnswer,
    Limits,
    NoulAnswer,
    RequestEnvelope,
    ScoreAnswer,
)

MAX_QUESTIONS = LIMITS.max_decision_questions
MIN_CHOICES = 2
Loc = list[str | int]


class Asked(msgspec.Struct, frozen=True, kw_only=True):
    """One question as the client asked it: what its answer needs besides the probabilities."""

    qid: str  # its System One id
    name: str | None
    type: Literal["predicate", "choice", "score"]
    values: tuple[str | bool, ...] = ()  # choice: the typed values, in order
    keys: tuple[str, ...] = ()  # choice: their System One labels, same order
    labels: tuple[str, ...] = ()  # score: the level labels, lowest first


class _Images:
    """The request's images as System One ``assets``, with the OpenAI field of each."""

    def __init__(self) -> None:
        self.assets: dict[str, Asset] = {}
        self.fields: dict[str, Loc] = {}

    def add(self, part: InputImage, loc: Loc) -> str:
        placeholder = f"<image:{len(self.assets) + 1}>"
        self.assets[placeholder] = Asset(data_base64=part.image_url)
        self.fields[placeholder] = [*loc, "image_url"]
        return placeholder


# ---------------------------------------------------------------- request


def _render(content: str | Sequence[Any], images: _Images, loc: Loc) -> str:
    if isinstance(content, str):
        return content
    out = []
    for j, part in enumerate(content):
        if isinstance(part, InputImage):
            out.append(images.add(part, [*loc, j]))
        elif isinstance(part, InputJSON):
            out.append(render_text(part.data))
        elif isinstance(part, RefusalText):
            out.append(part.refusal)
        else:
            out.append(part.text)
    return "".join(out)


def _item(raw: msgspec.Raw, i: int, images: _Images, calls: set[tuple[str, str]]) -> dict[str, Any]:
    """One ``input`` item as a conversation entry (see the module docstring)."""
    loc: Loc = ["input", i]
    kind = decode_at(peek_decoder, raw, loc).type
    if kind not in TOOL_TYPES:
        message = decode_at(message_decoder, raw, loc)
        role = message.__struct_config__.tag
        return {"role": role, "content": _render(message.content, images, [*loc, "content"])}
    item = decode_at(tool_decoder, raw, loc)
    entry: dict[str, Any] = {"type": kind, "call_id": item.call_id}
    if isinstance(item, FunctionCall | CustomToolCall):
        calls.add((kind, item.call_id))
        entry["name"] = item.name
        if isinstance(item, FunctionCall):
            entry["arguments"] = item.arguments
        else:
            entry["input"] = item.input
        if item.namespace is not None:
            entry["namespace"] = item.namespace
        return entry
    if (kind.removesuffix("_output"), item.call_id) not in calls:
        raise ValidationFailed.at(
            [*loc, "call_id"],
            f"no earlier {kind.removesuffix('_output')} item has call_id {item.call_id!r}",
        )
    entry["output"] = _render(item.output, images, [*loc, "output"])
    return entry


def _choice_keys(question: Choice, i: int) -> tuple[str, ...]:
    """Distinct System One labels for the typed values (module docstring)."""
    seen: set[tuple[type, str | bool]] = set()
    for j, option in enumerate(question.choices):
        typed = (type(option.value), option.value)
        if typed in seen:
            raise ValidationFailed.at(
                ["questions", i, "choices", j, "value"],
                f"choice values must be unique; {option.value!r} repeats",
            )
        seen.add(typed)
    booleans = {
        "true" if o.value else "false" for o in question.choices if isinstance(o.value, bool)
    }
    return tuple(
        ("true" if o.value else "false")
        if isinstance(o.value, bool)
        else msgspec.json.encode(o.value).decode()
        if o.value in booleans
        else o.value
        for o in question.choices
    )


def _question(
    raw: msgspec.Raw, i: int, images: _Images, used: set[str]
) -> tuple[Asked, dict[str, Any]]:
    """One question as ``Asked`` and its System One form."""
    loc: Loc = ["questions", i]
    peek = decode_at(peek_decoder, raw, loc)
    if peek.type not in QUESTION_TYPES:
        named = f" ({peek.name!r})" if isinstance(peek.name, str) else ""
        raise ValidationFailed.at(
            [*loc, "type"],
            f"question {i}{named} has type {peek.type!r}; /v1/decisions answers "
            "predicate, choice and score questions",
            "unsupported_question_type",
        )
    question = decode_at(question_decoder, raw, loc)
    name = question.name
    qid = name if name and name not in used else f"question_{i}"
    while qid in used:
        qid += "_"
    used.add(qid)
    body: dict[str, Any] = {
        "instructions": _render(question.instructions, images, [*loc, "instructions"])
    }
    if isinstance(question, Predicate):
        return Asked(qid=qid, name=name, type="predicate"), {**body, "type": "noul"}
    if isinstance(question, Choice):
        if len(question.choices) < MIN_CHOICES:
            raise ValidationFailed.at([*loc, "choices"], "a choice needs at least 2 choices")
        keys = _choice_keys(question, i)
        criteria = {k: o.description for k, o in zip(keys, question.choices, strict=True)}
        asked = Asked(
            qid=qid,
            name=name,
            type="choice",
            keys=keys,
            values=tuple(o.value for o in question.choices),
        )
        return asked, {**body, "type": "choice", "criteria": criteria}
    assert isinstance(question, Score)
    levels = [
        f"{lv.label}: {lv.description}" if lv.description else lv.label for lv in question.levels
    ]
    asked = Asked(
        qid=qid, name=name, type="score", labels=tuple(lv.label for lv in question.levels)
    )
    return asked, {**body, "type": "score", "criteria": levels}


class Decoded(msgspec.Struct, kw_only=True):
    """A ``/v1/decisions`` body, validated: the questions as asked, the System One envelope
    (its ``assets`` hold the images, for ``collect_images``), the call without its images, and
    the OpenAI field of each image (for ``relocate``)."""

    asked: list[Asked]
    envelope: RequestEnvelope
    call: EngineCall
    image_fields: dict[str, Loc]


def decision_call(body: bytes, request_id: str, limits: Limits = LIMITS) -> Decoded:
    """The validated call of a ``/v1/decisions`` body, without images. Every
    ``ValidationFailed`` names the OpenAI field (``["body", "questions", 2, ...]``)."""
    if not body.strip():
        raise ValidationFailed.at([], "Field required", "missing")
    request = decode_at(request_decoder, body, [])
    if not 1 <= len(request.questions) <= MAX_QUESTIONS:
        raise ValidationFailed.at(
            ["questions"], f"send 1 to {MAX_QUESTIONS} questions, got {len(request.questions)}"
        )
    images = _Images()
    if isinstance(request.input, str):
        state: str | list[Any] = request.input
    else:
        if not request.input:
            raise ValidationFailed.at(["input"], "input must be a string or a non-empty list")
        calls: set[tuple[str, str]] = set()
        state = [_item(raw, i, images, calls) for i, raw in enumerate(request.input)]
    used: set[str] = set()
    converted = [_question(raw, i, images, used) for i, raw in enumerate(request.questions)]
    asked = [a for a, _ in converted]
    env = RequestEnvelope(
        model=request.model,
        state=state,
        questions={a.qid: msgspec.Raw(msgspec.json.encode(q)) for a, q in converted},
        assets=images.assets or None,
    )
    limits = msgspec.structs.replace(limits, max_questions=MAX_QUESTIONS)
    try:
        chars = check_state(state, ["state"], limits)
        questions, question_chars = parse_questions(env, limits)
        check_request_text(chars + question_chars, limits)
    except ValidationFailed as exc:
        raise relocate(exc, asked, images.fields) from None
    call = EngineCall(state=state, questions=questions, model=request.model, request_id=request_id)
    return Decoded(asked=asked, envelope=env, call=call, image_fields=images.fields)


def relocate(
    exc: ValidationFailed, asked: Sequence[Asked], images: dict[str, Loc] | None = None
) -> ValidationFailed:
    """``exc`` with each System One ``loc`` turned into the OpenAI field it came from."""
    index = {a.qid: i for i, a in enumerate(asked)}
    items = []
    for item in exc.items:
        loc = list(item["loc"][1:])
        if loc[:1] in (["state"], ["images"]) or loc == ["assets"]:
            where: Loc = ["input"]
        elif loc[:1] == ["assets"] and images is not None:
            where = images.get(str(loc[1]), ["input"])
        elif loc[:1] == ["questions"] and len(loc) > 1 and loc[1] in index:
            i = index[str(loc[1])]
            where = ["questions", i, *_question_field(asked[i], loc[2:])]
        else:
            where = loc
        items.append({**item, "loc": ["body", *where]})
    return ValidationFailed(items, exc.message)


def _question_field(asked: Asked, rest: Loc) -> Loc:
    if rest[:1] != ["criteria"]:
        return rest[:1]
    field = "choices" if asked.type == "choice" else "levels"
    if len(rest) < 2:
        return [field]
    at = rest[1]
    if isinstance(at, str) and at in asked.keys:  # a description, named by its label
        return [field, asked.keys.index(at), "description"]
    return [field, at] if isinstance(at, int) else [field]


def param(loc: Sequence[str | int]) -> str | None:
    """A ``loc`` after ``"body"`` as OpenAI writes a field: ``questions[2].choices[1].value``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or None


# ---------------------------------------------------------------- answers


def _answer(asked: Asked, answer: Any) -> DecisionAnswer:
    if isinstance(answer, NoulAnswer):
        return PredicateAnswer(name=asked.name, probability=answer.noul)
    if isinstance(answer, ChoiceAnswer):
        probabilities = [
            ChoiceProbability(value=value, probability=answer.probabilities[key])
            for key, value in zip(asked.keys, asked.values, strict=True)
        ]
        return OpenAIChoice(
            name=asked.name,
            choice=asked.values[asked.keys.index(answer.choice)],
            confidence=answer.confidence,
            probabilities=probabilities,
        )
    assert isinstance(answer, ScoreAnswer)
    levels = [
        ScoreProbability(value=i, label=label, probability=answer.probabilities[str(i)])
        for i, label in enumerate(asked.labels)
    ]
    return OpenAIScore(
        name=asked.name, score=answer.score, confidence=answer.confidence, probabilities=levels
    )


def decision(asked: Sequence[Asked], outcome: Outcome) -> Decision:
    """The OpenAI answer from the gateway's outcome (``Gateway.decide(partial=True)``), in
    question order: a ``refusal`` for each question the outcome refused."""
    response = outcome.response
    answered = [
        Refusal(name=a.name) if a.qid in outcome.refused else _answer(a, response.answers[a.qid])
        for a in asked
    ]
    tokens = response.usage.input_tokens
    usage = DecisionUsage(
        input_tokens=tokens,
        output_tokens=0,
        total_tokens=tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=outcome.cached_tokens, cache_write_tokens=0
        ),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
    )
    x_cascade: dict[str, Any] | None = None
    if response.x_cascade is not None:
        x_cascade = {key: response.x_cascade[key] for key in ("tiers", "reasons", "degraded")}
        x_cascade["refused"] = list(outcome.refused)
    return Decision(model=response.model, answers=answered, usage=usage, x_cascade=x_cascade)


# ---------------------------------------------------------------- errors


def error_body(exc: CascadeError) -> OpenAIError:
    """``exc`` in OpenAI's error shape; a validation error names its first field."""
    if isinstance(exc, ValidationFailed) and is_unparsed(exc):
        detail = OpenAIErrorDetail(
            message=exc.message,
            type="invalid_request_error",
            param=None,
            code=str(exc.items[0]["type"]),
        )
    elif isinstance(exc, ValidationFailed) and exc.items:
        item = exc.items[0]
        detail = OpenAIErrorDetail(
            message=str(item["msg"]),
            type="invalid_request_error",
            param=param(item["loc"][1:]),
            code=str(item["type"]),
        )
    elif isinstance(exc, UnknownModel):
        detail = OpenAIErrorDetail(
            message=exc.message, type="invalid_request_error", param="model", code="model_not_found"
        )
    else:
        detail = OpenAIErrorDetail(
            message=exc.message, type=exc.error_type, param=None, code=exc.error_type
        )
    return OpenAIError(error=detail)


def is_unparsed(exc: CascadeError) -> bool:
    """Whether ``exc`` says the body is not JSON at all (OpenAI answers those with 400)."""
    return isinstance(exc, ValidationFailed) and any(
        i["type"] == "json_invalid" or i["loc"] == ["body"] for i in exc.items
    )
