"""The wire schema of ``POST /v1/systemone`` and friends: every Struct a client sees.

One module, one decoder per body type, built once. Conventions:

- ``Base`` uses ``kw_only=True`` (fields may be added in any order) and ``omit_defaults=True``
  (optional extras such as ``answer_confidence`` vanish from responses when unset).
- Requests are tolerant: unknown top-level fields and unknown keys inside a question are ignored,
  as Jev does (``forbid_unknown_fields`` stays off on the wire). Internal files (policies) are
  strict instead.
- Limits live in ``LIMITS`` (checked by ``cascade.request.validation``) and docs/api.md's "Limits"
  table. They are chosen so that no Laya or Jev client regresses: 1-64 questions, choice up to
  255 options, score up to 32 levels (Laya's cap; Jev documents 10).
- Requests are decoded in two steps (``RequestEnvelope`` with raw questions, then one question at a
  time) so that a validation error names the question id in its ``loc``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Request limits. Violations are answered with 413 (size) or 422 (shape)."""

    max_questions: int = 64  # Laya, Ollama, Cloudflare
    max_decision_questions: int = 400  # OpenAI's /v1/decisions
    max_choice_options: int = 255  # Jev docs, Cloudflare
    max_score_levels: int = 32  # Laya (Jev documents 10)
    max_total_options: int = 2048
    max_state_chars: int = 1_000_000  # the serialized state; tiers apply their own token limits
    max_json_depth: int = 64
    max_question_id_chars: int = 256
    # Client texts besides the state (structured JSON counts as its serialized length). All are
    # checked before any tier tokenizes anything; the ones below are settings (CASCADE_*).
    max_name_chars: int = 256  # model, task, lang, lang_guess, asset format and part (fixed)
    max_label_chars: int = 256  # a choice label (criteria key or list item), a noul label
    max_instructions_chars: int = 100_000  # one question's instructions
    max_option_chars: int = 10_000  # one choice description, score level or noul criterion
    max_question_text_chars: int = 1_000_000  # every question's ids and texts together
    max_request_text_chars: int = 4_000_000  # the state(s) and the question texts together
    # Upper bound of a batch's answers (``validation.answer_bytes`` x states), refused past it:
    # each result repeats the labels, so a batch's answer can be a large multiple of its body.
    max_batch_answer_bytes: int = 8 * 1024 * 1024
    max_images: int = 4  # Cloudflare's cap
    max_image_bytes: int = 4 * 1024 * 1024
    max_image_pixels: int = 16_000_000
    # All of a request's images together, checked from their headers before any is decoded.
    max_request_pixels: int = 64_000_000
    # Longest side / shortest side: Qwen's image processor (Clef) refuses more than 200.
    max_image_aspect: float = 200.0
    # Scans (SOS markers) in a JPEG: decoding passes over the whole image once per scan, however
    # few bytes the scan has. libjpeg's progressive script writes 10 (6 in grayscale); libjpeg
    # leaves a limit to the application (djpeg -maxscans). 100 is 10x that script and bounds a
    # 16 MP image's decode to about 100 scan passes.
    max_jpeg_scans: int = 100
    max_batch_states: int = 64  # Laya's /v1/systemone/batch
    max_token_budget: int = 8192  # Laya's LAYA_MAX_TOKEN_BUDGET for max_len / head_max_len


LIMITS = Limits()
# The most questions one request may ask, on any route: a feedback call takes as many labels.
MAX_ASKED = max(LIMITS.max_questions, LIMITS.max_decision_questions)
# A request id feedback names: a client's x-request-id (at most 128 characters, as
# ``cascade.http.app.request_id`` takes it), and a batch's ``ID/63`` for its states.
FEEDBACK_ID_CHARS = 128 + len(f"/{LIMITS.max_batch_states - 1}")
FEEDBACK_ID = r"^[^\x00-\x1f\x7f]+$"  # no control characters (x-request-id is printable)
Name = Annotated[str, Meta(max_length=LIMITS.max_name_chars)]
DRY_RUN_TEXT = 1 << 20  # characters of a dry run's policy or calibration text (1 MiB)


class Base(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of every wire Struct (see the module docstring)."""


# ---------------------------------------------------------------- request

Text = str | dict[str, Any] | list[Any] | bool | int | float
"""Instructions and descriptions: a string, or structured JSON rendered by each engine."""

OptionKey = str | int | float | bool
"""A choice option as a criteria list names it (a JSON scalar; compared as given)."""
QuestionType = Literal["choice", "score", "noul"]


class NoulLabels(Base, kw_only=True):
    """Laya's ``labels``: the option words the model sees for false / true."""

    false: str
    true: str


class _QuestionBase(Base, tag_field="type", kw_only=True):
    instructions: Text | None = None
    # Laya: slot s shows option option_order[s]; probabilities come back in caller order.
    option_order: list[int] | None = None

    @property
    def type(self) -> QuestionType:
        """The wire ``type`` tag (``choice``, ``score`` or ``noul``)."""
        return self.__struct_config__.tag  # type: ignore[return-value]


class ChoiceQuestion(_QuestionBase, tag="choice", kw_only=True):
    # An object label -> description (Jev), or a list of labels (Laya).
    criteria: dict[str, Text | None] | list[OptionKey]


class ScoreQuestion(_QuestionBase, tag="score", kw_only=True):
    # Ordered levels, lowest first. The pre-0.6 object form is rejected (422).
    criteria: list[Text]


class NoulQuestion(_QuestionBase, tag="noul", kw_only=True):
    criteria: dict[str, Text | None] | None = None
    labels: NoulLabels | None = None


Question = ChoiceQuestion | ScoreQuestion | NoulQuestion


class Asset(Base, kw_only=True):
    """A TypeSafe asset: inline base64 data, or a multipart part name (``asset-N``)."""

    type: Literal["image"] = "image"
    format: Name | None = None
    data_base64: str | None = None
    part: Name | None = None


Unit = Annotated[float, Meta(ge=0, le=1)]
MinConfidence = Unit | dict[Name, Unit]
TokenBudget = Annotated[int, Meta(ge=1, le=LIMITS.max_token_budget)]


class Controls(Base, kw_only=True):
    """Laya's body controls, accepted on every request and ignored by tiers that lack them."""

    max_len: TokenBudget | None = None
    head_max_len: TokenBudget | None = None
    task: Name | None = None
    lang: Name | None = None
    lang_guess: Name | None = None
    min_confidence: MinConfidence | None = None


class SystemOneRequest(Controls, kw_only=True):
    model: Name = "jev-latest"
    state: str | dict[str, Any] | list[Any]
    questions: dict[str, Question]
    # Ollama / Cloudflare: base64 strings or data: URLs; Cloudflare's {content_type, base64} too.
    images: list[str | dict[str, str]] | None = None
    assets: dict[str, Asset] | None = None


class RequestEnvelope(Controls, kw_only=True):
    """``SystemOneRequest`` with its questions still undecoded (first decoding step)."""

    model: Name = "jev-latest"
    state: str | dict[str, Any] | list[Any] | None = None
    states: list[str | dict[str, Any] | list[Any]] | None = None
    questions: dict[str, msgspec.Raw]
    images: list[str | dict[str, str]] | None = None
    assets: dict[str, Asset] | None = None


class BatchRequest(Controls, kw_only=True):
    """Laya's ``/v1/systemone/batch`` body (documentation: it decodes as ``RequestEnvelope``)."""

    model: Name = "jev-latest"
    states: list[str | dict[str, Any] | list[Any]]
    questions: dict[str, Question]


# ---------------------------------------------------------------- response


class Action(Base, kw_only=True):
    act_probability: float


class _AnswerBase(Base, tag_field="type", kw_only=True):
    # Laya extras (profile "laya"); absent under the "jev" profile.
    answer_confidence: float | None = None
    action: Action | None = None
    abstention: Literal["passed", "abstained", "unevaluated"] | None = None
    abstention_threshold: float | None = None
    low_confidence: bool | None = None


class ChoiceAnswer(_AnswerBase, tag="choice", kw_only=True):
    choice: str
    probabilities: dict[str, float]
    confidence: float
    x_jev_confidence: float | None = None


class ScoreAnswer(_AnswerBase, tag="score", kw_only=True):
    score: float
    legend: dict[str, str]
    probabilities: dict[str, float]
    confidence: float
    x_jev_confidence: float | None = None


class NoulAnswer(_AnswerBase, tag="noul", kw_only=True):
    noul: float
    confidence: float | None = None  # Laya extra: max(p, 1 - p)


Answer = ChoiceAnswer | ScoreAnswer | NoulAnswer


class OptionSpans(Base, kw_only=True):
    """Reported when option spans collapsed to identical tokens (Laya's ``usage.options``)."""

    total: int
    distinct: int
    tokens_per_option: int | None = None


class Usage(Base, kw_only=True):
    input_tokens: int
    output_tokens: int  # always present (the official SDK requires integer counts); 0 here
    # Laya extras (profile "laya").
    state_tokens: int | None = None
    state_tokens_dropped: int | None = None
    truncated: bool | None = None
    truncated_questions: list[str] | None = None
    options: dict[str, OptionSpans] | None = None
    cached_tokens: int | None = None  # of input_tokens, from the decision cache (when any)


class SystemOneResponse(Base, kw_only=True):
    model: str
    answers: dict[str, Answer]
    usage: Usage
    x_cascade: dict[str, Any] | None = None


class TotalUsage(Base, kw_only=True):
    input_tokens: int
    output_tokens: int


class BatchResponse(Base, kw_only=True):
    results: list[SystemOneResponse]
    total_usage: TotalUsage


class ModelCard(Base, kw_only=True):
    name: str
    description: str
    release_date: str


class ModelList(Base, kw_only=True):
    models: list[ModelCard]


# ---------------------------------------------------------------- health


class Health(Base, kw_only=True):
    """``GET /health``: ``status`` always; ``loaded`` and ``revisions`` (what Laya's remote
    client reads) with a client key; every detail with an admin key, or when no key of either
    kind is configured."""

    status: Literal["ok"] = "ok"
    demo: bool | None = None
    warning: str | None = None
    ready: bool | None = None
    loaded: list[str] | None = None  # what Laya's remote client reads
    revisions: dict[str, str | None] | None = None
    route: dict[str, str | None] | None = None
    tiers: dict[str, dict[str, Any]] | None = None  # each engine's own health, and its breaker
    decision_log: dict[str, Any] | None = None  # the writer's counts and last failure, if on
    config: dict[str, Any] | None = None  # the hashes serving and the last reload (ConfigState)


class TierUsage(Base, kw_only=True):
    """One tier's share of a tenant's usage: ``requests`` it ran for (a batch counts its
    states), ``questions`` whose returned answer was its, the ``input_tokens`` it read (those
    answered from the decision cache at ``[cache] charge_cached`` of a token) and their ``cost``
    (``[cost]``: price per 1000 input tokens, ``cascade eval``'s units)."""

    requests: int
    questions: int
    input_tokens: int
    cost: float


class UsageFigures(Base, kw_only=True):
    """A tenant's usage over one UTC day (``date``, YYYY-MM-DD) or, without ``date``, over every
    retained day: ``requests`` decided, and the tiers' figures summed and by tier."""

    date: str | None = None
    requests: int
    questions: int
    input_tokens: int
    cost: float
    tiers: dict[str, TierUsage]


class UsageReport(Base, kw_only=True):
    """``GET /v1/usage``: the caller's own tenant's usage as this replica counted it since
    ``since`` (its start, or the oldest retained day), oldest day first."""

    tenant: str
    scope: Literal["replica"]
    retained_days: int
    since: str  # ISO 8601, UTC
    days: list[UsageFigures]
    total: UsageFigures


class Readiness(Base, kw_only=True):
    """``GET /ready``: 200 with ``ready: true``, or 503 with ``ready: false``."""

    ready: bool


# ---------------------------------------------------------------- errors


class ValidationItem(Base, kw_only=True):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorBody(Base, kw_only=True):
    """422, FastAPI's shape, which the official SDKs parse."""

    detail: list[ValidationItem]


class ErrorDetail(Base, kw_only=True):
    error_type: str
    message: str


class ErrorBody(Base, kw_only=True):
    """Every other client or server error."""

    detail: ErrorDetail


# ---------------------------------------------------------------- reload (cascade.http.admin)


class LastReload(Base, kw_only=True):
    at: float  # unix time
    outcome: Literal["applied", "unchanged", "rejected", "restart_needed"]
    errors: list[str] | None = None  # FILE[:LINE]: error: ... lines of a refused reload


class ConfigState(Base, kw_only=True):
    """``/health``'s ``config``: what serves now, and the last reload (None: none yet)."""

    policy_hash: str
    calibration_hash: str
    last_reload: LastReload | None = None


class ReloadReport(Base, kw_only=True):
    """``POST /admin/reload`` (200): what the reload did and what serves now."""

    outcome: Literal["applied", "unchanged"]
    policy_hash: str
    calibration_hash: str
    read: list[str]  # the files read again, as "what: FILE"
    note: str | None = None  # what a reload cannot read again here (no policy file)


class DryRunRequest(Base, kw_only=True):
    """``POST /admin/reload?dry_run=1``'s optional body: the candidate's files as text (none:
    the files on disk, as a reload reads them)."""

    policy: Annotated[str, Meta(max_length=DRY_RUN_TEXT)] | None = None  # the policy TOML
    calibration: Annotated[str, Meta(max_length=DRY_RUN_TEXT)] | None = None  # `calibrate`'s


dry_run_decoder = msgspec.json.Decoder(DryRunRequest)


# ---------------------------------------------------------------- audit (cascade.audit)

AuditOutcome = Literal["applied", "unchanged", "replayed", "refused", "failed"]


class AuditRecord(Base, kw_only=True):
    """One admin action (``cascade.audit``): append-only, never a key."""

    ts: float  # unix time (wall clock)
    action: str  # reload, dry_run, freeze, unfreeze, tenant_keys_added, rollout_start, ...
    actor: str  # the admin key's name; "signal" (SIGHUP), "watch" (file watch), "fleet"
    client: str | None = None  # the caller's address (X-Forwarded-For from trusted proxies)
    outcome: AuditOutcome
    message: str = ""
    replica: str = ""
    before: dict[str, str] = msgspec.field(default_factory=dict)  # policy/calibration/keys hashes
    after: dict[str, str] = msgspec.field(default_factory=dict)
    changed: list[str] = msgspec.field(default_factory=list)  # policy tables/keys, bounded
    detail: dict[str, Any] = msgspec.field(default_factory=dict)


class AuditPage(Base, kw_only=True):
    """``GET /admin/audit``: the newest records at or after ``since``, oldest first.
    ``stored`` false: no decision log is configured, records go to the log only."""

    stored: bool
    records: list[AuditRecord]
    note: str | None = None


class ConfigErrorDetail(ErrorDetail, kw_only=True):
    lines: list[str]  # FILE[:LINE]: error: ... (message holds them too, one per line)


class ConfigErrorBody(Base, kw_only=True):
    """``POST /admin/reload`` refused: 422 (a file fails its checks), 409 (restart needed)."""

    detail: ConfigErrorDetail


# ---------------------------------------------------------------- fleet (cascade.fleet)

ReloadOutcome = Literal["applied", "unchanged", "rejected", "restart_needed"]


class ReplicaReload(Base, kw_only=True):
    """One replica's answer to a fleet reload: its outcome and what it serves after it."""

    replica: str
    outcome: ReloadOutcome
    policy_hash: str
    calibration_hash: str
    errors: list[str] | None = None  # FILE[:LINE]: error: ... of a refused reload


class FleetReloadReport(Base, kw_only=True):
    """``POST /admin/reload?scope=fleet`` (200): every replica's outcome. ``refused``: the
    replicas that keep their version (rejected or restart needed); ``not_answered``: replicas
    seen (heartbeat) that sent no outcome within ``CASCADE_FLEET_REPLY_S``."""

    replicas: list[ReplicaReload]
    refused: list[str]
    not_answered: list[str]


class ReplicaSeen(Base, kw_only=True):
    """A replica's last heartbeat (``cascade.fleet.registry``)."""

    replica: str
    policy_hash: str
    calibration_hash: str
    version: str
    uptime_s: float  # when it beat last
    strong_share: float | None = None  # over [control] window_s; None before any answer
    age_s: float = 0.0  # since that heartbeat (Redis's clock)


class FleetView(Base, kw_only=True):
    """``GET /admin/fleet``: the replicas seen within ``CASCADE_FLEET_SEEN_S``, the
    (policy, calibration) hashes most of them serve, and ``skew``: how many serve another."""

    replicas: list[ReplicaSeen]
    policy_hash: str | None
    calibration_hash: str | None
    skew: int
    skewed: list[str]


# ---------------------------------------------------------------- codecs

envelope_decoder = msgspec.json.Decoder(RequestEnvelope)
question_decoder = msgspec.json.Decoder(Question)
encoder = msgspec.json.Encoder()


# ---------------------------------------------------------------- feedback

# The one label type (eval data, feedback, the store, control): a choice key, a noul's
# true/false, a score's level
Label = str | bool | int


class FeedbackRequest(Base, kw_only=True):
    """``POST /v1/feedback``: what the answers of an earlier request should have been."""

    request_id: Annotated[
        str, Meta(min_length=1, max_length=FEEDBACK_ID_CHARS, pattern=FEEDBACK_ID)
    ]  # x-request-id
    labels: Annotated[dict[Name, Label], Meta(min_length=1, max_length=MAX_ASKED)]


class FeedbackResponse(Base, kw_only=True):
    """The labels stored: ``stored`` of them, ``relabelled`` the questions labelled before (the
    latest label wins)."""

    request_id: str
    stored: int
    relabelled: list[str]


class FeedbackEnvelope(Base, kw_only=True):
    """``FeedbackRequest`` with its labels still undecoded (a wrong one's ``loc`` names it)."""

    request_id: Annotated[
        str, Meta(min_length=1, max_length=FEEDBACK_ID_CHARS, pattern=FEEDBACK_ID)
    ]
    labels: Annotated[dict[Name, msgspec.Raw], Meta(min_length=1, max_length=MAX_ASKED)]


feedback_decoder = msgspec.json.Decoder(FeedbackEnvelope)
label_decoder = msgspec.json.Decoder(Label)
