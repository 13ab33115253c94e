"""The wire schema of OpenAI's ``POST /v1/decisions`` (the ``openai`` 3.51.0 SDK's request and
response types, as cascade reads and writes them), in ``cascade.schema``'s style.

Requests are tolerant like System One's: unknown fields are ignored. ``input`` items are decoded
one at a time (``message_decoder`` by ``role``, ``tool_decoder`` by ``type``: messages may omit
their ``type``), so a validation error names the item's index. Responses keep ``name: null`` on
unnamed questions and every usage count, as the SDK's models require them.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from cascade.schema import Base, Name

# ---------------------------------------------------------------- request: parts


class CacheBreakpoint(Base, kw_only=True):
    mode: Literal["explicit"]


class InputText(Base, tag="input_text", tag_field="type", kw_only=True):
    text: str
    prompt_cache_breakpoint: CacheBreakpoint | None = None  # accepted, ignored


class InputImage(Base, tag="input_image", tag_field="type", kw_only=True):
    """A ``data:image/...;base64,`` URL (remote URLs are refused: cascade never fetches)."""

    image_url: str
    detail: Literal["low", "high", "auto", "original"] | None = None  # accepted, ignored
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputJSON(Base, tag="input_json", tag_field="type", kw_only=True):
    data: dict[str, Any] | list[dict[str, Any]]


class OutputText(Base, tag="output_text", tag_field="type", kw_only=True):
    text: str


class RefusalText(Base, tag="refusal", tag_field="type", kw_only=True):
    refusal: str


Part = InputText | InputImage | InputJSON
ToolOutputPart = InputText | InputImage
AssistantPart = OutputText | RefusalText

# ---------------------------------------------------------------- request: input items


class _Message(Base, tag_field="role", kw_only=True):
    type: Literal["message"] = "message"


class UserMessage(_Message, tag="user", kw_only=True):
    content: str | list[Part]


class DeveloperMessage(_Message, tag="developer", kw_only=True):
    content: str | list[InputText]


class SystemMessage(_Message, tag="system", kw_only=True):
    content: str | list[InputText]


class AssistantMessage(_Message, tag="assistant", kw_only=True):
    content: str | list[AssistantPart]
    phase: Literal["commentary", "final_answer"] | None = None


Message = UserMessage | DeveloperMessage | SystemMessage | AssistantMessage
Status = Literal["in_progress", "completed", "incomplete"]


class _ToolItem(Base, tag_field="type", kw_only=True):
    call_id: str
    id: str | None = None
    status: Status | None = None


class FunctionCall(_ToolItem, tag="function_call", kw_only=True):
    name: str
    arguments: str
    namespace: str | None = None


class FunctionCallOutput(_ToolItem, tag="function_call_output", kw_only=True):
    output: str | list[ToolOutputPart]


class CustomToolCall(_ToolItem, tag="custom_tool_call", kw_only=True):
    name: str
    input: str
    namespace: str | None = None


class CustomToolCallOutput(_ToolItem, tag="custom_tool_call_output", kw_only=True):
    output: str | list[ToolOutputPart]


ToolItem = FunctionCall | FunctionCallOutput | CustomToolCall | CustomToolCallOutput
TOOL_TYPES = frozenset(
    ("function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output")
)

# ---------------------------------------------------------------- request: questions

Instructions = str | list[Part]


class _Question(Base, tag_field="type", kw_only=True):
    instructions: Instructions
    name: str | None = None


class Predicate(_Question, tag="predicate", kw_only=True):
    """Estimate how likely a statement about the input is true (System One's ``noul``)."""


class ChoiceOption(Base, kw_only=True):
    value: str | bool  # typed: "true" and true are distinct values
    description: str | None = None


class Choice(_Question, tag="choice", kw_only=True):
    choices: list[ChoiceOption]


class Level(Base, kw_only=True):
    label: str
    description: str | None = None


class Score(_Question, tag="score", kw_only=True):
    levels: list[Level]  # ordered, lowest first


DecisionQuestion = Predicate | Choice | Score
QUESTION_TYPES = ("predicate", "choice", "score")


class PromptCacheOptions(Base, kw_only=True):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] = "30m"


class DecisionRequest(Base, kw_only=True):
    """The body; ``input`` items and ``questions`` are decoded one at a time (see above)."""

    model: Name
    input: str | list[msgspec.Raw]
    questions: list[msgspec.Raw]
    prompt_cache_key: str | None = None  # accepted, ignored (cascade has no prompt cache)
    prompt_cache_options: PromptCacheOptions | None = None  # accepted, ignored
    safety_identifier: str | None = None  # accepted, ignored (never logged)


class DecisionCreate(Base, kw_only=True):
    """``DecisionRequest`` as documented in OpenAPI: its questions typed; its ``input`` items
    are messages or tool items (``cascade.http.openapi`` fills in their schemas)."""

    model: Name
    input: str | list[dict[str, Any]]
    questions: list[DecisionQuestion]
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: str | None = None


class _Peek(msgspec.Struct):
    """The tags of an input item or a question, read before its own decoder runs."""

    type: str | None = None
    role: str | None = None
    name: Any = None


# ---------------------------------------------------------------- response
# No defaults below: every field is on the wire, ``null`` included.


class PredicateAnswer(Base, tag="predicate", tag_field="type", kw_only=True):
    name: str | None
    probability: float


class ChoiceProbability(Base, kw_only=True):
    value: str | bool
    probability: float


class ChoiceAnswer(Base, tag="choice", tag_field="type", kw_only=True):
    name: str | None
    choice: str | bool
    confidence: float
    probabilities: list[ChoiceProbability]


class ScoreProbability(Base, kw_only=True):
    value: int
    label: str
    probability: float


class ScoreAnswer(Base, tag="score", tag_field="type", kw_only=True):
    name: str | None
    score: float
    confidence: float
    probabilities: list[ScoreProbability]


class Refusal(Base, tag="refusal", tag_field="type", kw_only=True):
    """A question the cascade could not answer while it answered others."""

    name: str | None


DecisionAnswer = PredicateAnswer | ChoiceAnswer | ScoreAnswer | Refusal


class InputTokensDetails(Base, kw_only=True):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(Base, kw_only=True):
    reasoning_tokens: int


class DecisionUsage(Base, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class Decision(Base, kw_only=True):
    model: str
    answers: list[DecisionAnswer]  # in question order
    usage: DecisionUsage
    x_cascade: dict[str, Any] | None = None  # laya profile: tiers, reasons, degraded, refused


# ---------------------------------------------------------------- errors


class OpenAIErrorDetail(Base, kw_only=True):
    message: str
    type: str
    param: str | None  # the offending field, e.g. ``questions[2].choices[1].value``
    code: str | None


class OpenAIError(Base, kw_only=True):
    """Every error on ``/v1/decisions``: the SDK reads ``error.message``/``type``/``param``/
    ``code`` and picks its exception class from the status."""

    error: OpenAIErrorDetail


# ---------------------------------------------------------------- codecs

request_decoder = msgspec.json.Decoder(DecisionRequest)
peek_decoder = msgspec.json.Decoder(_Peek)
message_decoder = msgspec.json.Decoder(Message)
tool_decoder = msgspec.json.Decoder(ToolItem)
question_decoder = msgspec.json.Decoder(DecisionQuestion)
