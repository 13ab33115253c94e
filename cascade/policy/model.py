"""Routing policies: the frozen Structs ``policies/*.toml`` decode into.

A policy is data only. It names its tiers (``[tiers.NAME]``, tagged by ``kind``), which request
``model`` names mean the cascade or one tier (``[models]``), the pre-routing rules (``[route]``),
the escalation thresholds (``[thresholds]``), per-tier breakers (``[breaker.NAME]``), shadow
sampling (``[shadow]``), degradation (``[degrade]``), a fitted calibration (``[calibration]``),
the decision log (``[decision_log]``), live control of the gate (``[control]``), drift
monitoring (``[drift]``) and the decision cache (``[cache]``). The decisions live in
``cascade.policy.routing``; reading and checking files is ``cascade.policy.files``'s job.

Decoding is strict (``forbid_unknown_fields``): a typo fails at boot.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import date
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec
from msgspec import Meta, field

from cascade.questions import BANDS, Band
from cascade.schema import QuestionType, Unit
from cascade.settings import Count

Mode = Literal["cascade", "cheap_only", "strong_only"]
Checkpoint = Literal["english", "multilingual", "typed-decisions"]
# The checkpoint that reads text of any script: where unreadable text goes (``Route.unreadable``).
ANY_SCRIPT: Checkpoint = "multilingual"
_Name = TypeVar("_Name", bound=str)  # a checkpoint name, typed as Checkpoint or not yet checked
# Plain bounds, declared on the fields: msgspec checks them when a policy file is decoded, and
# cascade.policy.files reports each as a FILE:LINE error with the key's path.
Positive = Annotated[float, Meta(gt=0.0)]  # seconds and sizes that must be above 0
NonNegative = Annotated[float, Meta(ge=0.0)]
AccuracyTarget = Annotated[float, Meta(gt=0.0, lt=1.0)]  # 1.0 could never be certified


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every policy Struct: immutable, keyword-only, unknown keys rejected.

    Subclasses restate ``frozen=True``: msgspec inherits it, type checkers read only a class's
    own keywords."""


# ---------------------------------------------------------------- tiers


class Checkpoints(_Strict, frozen=True):
    """Laya checkpoints by name: a local path (``/``, ``./``, ``../`` or ``~``; relative to the
    policy file) or a hub id such as ``convaiinnovations/laya/multilingual``."""

    english: str | None = None
    multilingual: str | None = None
    typed_decisions: str | None = field(default=None, name="typed-decisions")

    def named(self) -> dict[Checkpoint, str]:
        """The configured checkpoints, by their policy name."""
        pairs: list[tuple[Checkpoint, str | None]] = [
            ("english", self.english),
            ("multilingual", self.multilingual),
            ("typed-decisions", self.typed_decisions),
        ]
        return {name: ref for name, ref in pairs if ref is not None}

    @classmethod
    def of(cls, named: Mapping[_Name, str | Path]) -> Checkpoints:
        """The inverse of ``named``: checkpoints from policy names to references (an unknown
        name is a TypeError)."""
        return cls(**{name.replace("-", "_"): str(ref) for name, ref in named.items()})


class _Tier(_Strict, frozen=True, kw_only=True, tag_field="kind"):
    # Upstream tiers: the whole call, then EngineTimeout (counted against the breaker).
    # In-process tiers (laya, clef): the longest queue wait they accept, predicted from the
    # measured cost of the work ahead at admission (within the request's own deadline, the
    # gateway's admission_deadline_s); a call predicted to wait longer is refused at once with
    # Overloaded, and accepted work is never cut off.
    timeout_s: Positive = 5.0
    # Waiting work of other requests beyond this is refused with Overloaded: question rows for
    # Laya, connections for an upstream, requests for Clef.
    max_queue: Count = 256


class LayaTier(_Tier, frozen=True, kw_only=True, tag="laya"):
    """Laya in process on ONNX Runtime (CPU)."""

    checkpoints: Checkpoints
    # In process: the longest predicted queue wait accepted (see _Tier). By default the
    # request's own admission deadline (CASCADE_ADMISSION_DEADLINE_S, 8 s) binds first.
    timeout_s: Positive = 10.0
    default_checkpoint: Checkpoint = "english"  # the one previewed and run first
    max_batch_size: Count = 32  # rows per ONNX run
    max_wait_s: NonNegative = 0.002  # how long a partial batch waits for more rows
    intra_op_threads: Count | None = None  # ONNX Runtime threads per session; None: all cores
    # "int8": serve the int8 export (cascade.laya.int8), and only with a flip report for these
    # weights whose flip rate is at most max_flip_rate (cascade.policy.precision).
    precision: Literal["fp32", "int8"] = "fp32"
    max_flip_rate: Unit = 0.005  # share of questions whose answer int8 may change
    flip_report: str | None = None  # the report (relative to the policy); None: next to the export

    def any_script(self) -> Checkpoint | None:
        """The configured checkpoint that reads every script (``ANY_SCRIPT``), or None."""
        return ANY_SCRIPT if ANY_SCRIPT in self.checkpoints.named() else None


class ClefTier(_Tier, frozen=True, kw_only=True, tag="clef"):
    """Clef-flash in process on torch."""

    release: str = "Cloudflare/clef-flash"  # hub id, or a local path as in Checkpoints
    timeout_s: Positive = 10.0  # as for LayaTier: the request's admission deadline binds first
    # A hub id not in the local hub cache is downloaded only when this is true (about 19 GB).
    download: bool = False
    max_length: Count = 16384  # tokens, media included
    overlong: Literal["reject", "truncate"] = "reject"
    device: str = "cuda"  # "auto": CUDA when present, else the CPU (fp32)
    max_batch_size: Count = 8  # requests per device batch
    max_batch_tokens: Count = 32768  # padded tokens per device batch
    # Refuse (413) a request whose estimated activations exceed this; None: 85 % of the GPU
    # memory free after loading.
    memory_budget_bytes: Count | None = None


class UpstreamTier(_Tier, frozen=True, kw_only=True, tag="upstream"):
    """Another ``/v1/systemone`` server. Several URLs are load-balanced with health checks."""

    urls: list[str]
    model: str | None = None  # forwarded as the request's model; None keeps the caller's
    api_key_env: str | None = None  # name of the env variable holding the bearer token
    connect_timeout_s: Positive = 1.0
    read_timeout_s: Positive = 10.0
    health_path: str = "/health"
    health_interval_s: Positive = 5.0


Tier = LayaTier | ClefTier | UpstreamTier


# ---------------------------------------------------------------- rules


class Models(_Strict, frozen=True):
    """Which request ``model`` names mean the cascade, the cheap tier only, or the strong only.

    Names match in any case; one with ``*`` or ``?`` is a pattern (``jev-*``). An exact name
    wins over a pattern (``cascade.policy.routing.resolve_model``). ``/v1/models`` lists the
    exact names.
    """

    cascade: list[str] = field(default_factory=lambda: ["jev-latest", "jev-*"])
    cheap_only: list[str] = field(default_factory=list)
    strong_only: list[str] = field(default_factory=list)
    unknown: Literal["reject", "cascade"] = "reject"  # reject: 400 api_usage_error
    release_date: date = date(2026, 11, 30)  # the ``release_date`` ``/v1/models`` lists


class Route(_Strict, frozen=True):
    """Pre-routing: which tier runs each question first."""

    cheap: str | None = None
    strong: str | None = None
    # Laya's option spans collapse beyond about head_max_len/4 options (192/4 for English).
    max_choice_options: Annotated[int, Meta(ge=2)] = 48
    strong_types: list[QuestionType] = field(default_factory=list)
    # questions: only the escalated questions go to the strong tier, in one call;
    # request: any escalation sends the whole request there, for joint consistency.
    escalate: Literal["questions", "request"] = "questions"
    # Text the cheap checkpoint cannot read: the multilingual checkpoint if configured, or strong.
    unreadable: Literal["multilingual", "strong"] = "multilingual"


_BAND_FIELD: dict[Band, str] = {
    "2": "two",
    "3-5": "three_five",
    "6-10": "six_ten",
    "11+": "eleven_plus",
}


class Bands(_Strict, frozen=True):
    """One threshold per option band; an absent band never escalates."""

    two: float | None = field(default=None, name="2")
    three_five: float | None = field(default=None, name="3-5")
    six_ten: float | None = field(default=None, name="6-10")
    eleven_plus: float | None = field(default=None, name="11+")

    def get(self, band: Band) -> float | None:
        return getattr(self, _BAND_FIELD[band])

    def items(self) -> Iterator[tuple[Band, float]]:
        for band in BANDS:
            value = self.get(band)
            if value is not None:
                yield band, value


class TypeBands(_Strict, frozen=True):
    choice: Bands = field(default_factory=Bands)
    score: Bands = field(default_factory=Bands)
    noul: Bands = field(default_factory=Bands)

    def of(self, qtype: QuestionType) -> Bands:
        return {"choice": self.choice, "score": self.score, "noul": self.noul}[qtype]


class Thresholds(_Strict, frozen=True):
    """Post-rules on the cheap answer: escalate when a signal fires.

    ``confidence``: escalate when ``answer_confidence`` (max p) is below the band's value.
    ``margin``: escalate when the top-two probability gap is below it.
    ``truncated`` / ``collapsed``: escalate on Laya's truncation and option-collapse signals
    (and pre-route on them when the preview already shows them).
    """

    confidence: TypeBands = field(default_factory=TypeBands)
    margin: TypeBands = field(default_factory=TypeBands)
    truncated: bool = True
    collapsed: bool = True


class BreakerConfig(_Strict, frozen=True):
    """Open when ``failure_ratio`` of at least ``min_calls`` calls in ``window_s`` failed."""

    window_s: Positive = 30.0
    min_calls: Count = 5
    failure_ratio: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.5
    cooldown_s: Positive = 10.0  # open -> half-open
    half_open_probes: Count = 1  # successes needed to close; also the concurrent probe limit


class Shadow(_Strict, frozen=True):
    """Mirror ``fraction`` of cheap-final requests to the strong tier, off the response path."""

    fraction: Unit = 0.0
    max_concurrent: Count = 2  # beyond this a sampled request is skipped, never queued
    seed: int = 0


class Degrade(_Strict, frozen=True):
    """When the strong tier is down: return cheap answers marked degraded, or refuse."""

    cheap_answers: bool = True
    retry_after_s: Positive = 5.0


class ConfidenceHistogram(_Strict, frozen=True):
    """Counts of values in fixed bins: ``edges`` are the interior boundaries, ascending; bin
    ``i`` holds ``edges[i-1] <= x < edges[i]`` (the first and last bins are open), so
    ``counts`` has one entry more than ``edges``."""

    edges: list[float]
    counts: list[int]


class Reference(_Strict, frozen=True):
    """A calibration's novelty reference set (``cascade.novelty.reference``): its file and the
    SHA-256 the calibration records for it."""

    file: str
    sha256: str


class Calibration(_Strict, frozen=True):
    """``[calibration]``: thresholds and temperatures fitted by ``cascade calibrate``.

    A policy names only ``file`` (relative to the policy) and ``apply``. Loading reads the file
    (``cascade.policy.calibration``): its confidence thresholds replace ``[thresholds]``'s
    confidence and margin ones, and ``temperatures`` and ``checkpoints`` come from it.
    ``apply``: ``gate`` (default) tempers the cheap tier's probabilities only where the
    confidence gate reads them, so answers stay Laya's; ``probabilities`` also returns them.
    """

    file: str | None = None
    apply: Literal["gate", "probabilities"] = "gate"
    temperatures: TypeBands = field(default_factory=TypeBands)  # from the file
    checkpoints: dict[str, str] = field(default_factory=dict)  # {tier: content hash} it fits
    # From the file: "choice:3-5" -> the fitted data's gate confidences (the drift reference).
    snapshot: dict[str, ConfidenceHistogram] = field(default_factory=dict)
    reference: Reference | None = None  # from the file: the novelty gate's reference set


class DecisionLog(_Strict, frozen=True):
    """``[decision_log]``: one row per answered question (``cascade.store``), in a SQLite file
    or a PostgreSQL database (``file`` a ``postgresql://`` URL)."""

    file: str | None = None  # relative to the policy file, or a URL; None: off (--decision-log)
    state: Literal["text", "hash", "none"] = "hash"  # how each row stores the request's state
    max_bytes: Count = 1 << 30  # SQLite: then the file rotates to FILE.1, FILE.2, ...
    keep: Count = 3  # SQLite: rotated files kept
    queue_size: Count = 10_000  # requests waiting for the writer; beyond, rows are dropped
    keep_days: Positive | None = None  # PostgreSQL: rows older are deleted (None: kept)
    required: bool = True  # PostgreSQL unreachable at boot: an error (false: warn and spool)
    spool_bytes: Count = 256 << 20  # PostgreSQL: the local spool's cap; beyond, rows are dropped


class Targets(_Strict, frozen=True):
    """Per-type accuracy targets; a type left out has none."""

    choice: AccuracyTarget | None = None
    score: AccuracyTarget | None = None
    noul: AccuracyTarget | None = None

    def of(self, qtype: str) -> float | None:
        return {"choice": self.choice, "score": self.score, "noul": self.noul}.get(qtype)


class Control(_Strict, frozen=True):
    """``[control]``: the gate moves while cascade serves (``cascade.control``).

    ``max_strong_share``: the most of the answered questions (over the last ``window_s``) the
    strong tier may answer; when it binds the pacer lowers cells' confidence thresholds so only
    the least confident escalate, the others answered cheap and flagged ``budget``. ``capacity``:
    tighten the same way when the strong tier's predicted queue wait nears the admission
    deadline or it reports overload. ``target_accuracy`` (one number, or per type): refit each
    cell's threshold every ``refit_interval_s`` from labelled answers, so the cheap answers kept
    meet it at the one-sided 95 % Clopper-Pearson bound, on cells with ``min_labels`` labels
    (``pool``: else their band's, ``all``: else everyone's), within ``[min_threshold,
    max_threshold]``. ``teacher``: what labels count (feedback; or also the strong tier's
    shadow answers). ``max_tenant_share``: the most of a cell's labels one tenant's may be (its
    oldest beyond it are left out of the fit). ``prefer``: which wins when the budget and the
    target conflict. ``frozen``: hold every threshold where it is.

    ``scope = "fleet"`` (with ``url``, a Redis URL): the budget counts every replica's answers
    and the replicas share one gate (``cascade.control.fleet``): those pointing at that Redis
    pace as one. Each Redis call is bounded by ``timeout_s`` and made off the request path,
    every ``sync_s``; without Redis a replica paces on its own counts until it returns.
    """

    max_strong_share: Unit | None = None
    window_s: Positive = 300.0
    capacity: bool = True
    target_accuracy: AccuracyTarget | Targets | None = None
    prefer: Literal["budget", "accuracy"] = "budget"
    refit_interval_s: Positive = 60.0
    min_labels: Count = 30
    pool: Literal["none", "band", "all"] = "none"
    teacher: Literal["feedback", "feedback+shadow"] = "feedback"
    max_tenant_share: Unit = 0.5
    min_threshold: Unit = 0.0
    max_threshold: Unit = 1.0
    frozen: bool = False
    scope: Literal["replica", "fleet"] = "replica"
    url: str | None = None  # redis://host:6379/0 (scope = "fleet" only)
    timeout_s: Positive = 0.25  # each Redis call of the fleet scope, connecting included
    sync_s: Positive = 1.0  # how often a replica trades its counts and gates with the fleet

    def target(self, qtype: str) -> float | None:
        """The accuracy target of ``qtype``'s cells (None: no target)."""
        t = self.target_accuracy
        return t.of(qtype) if isinstance(t, Targets) else t


class Drift(_Strict, frozen=True):
    """``[drift]``: the population stability index of the cheap tier's gate confidences per
    (type x band) over the last ``window_s``, against a reference (``cascade.control.drift``).

    The reference is the calibration file's ``[snapshot]`` when the policy has one (and
    ``reference = "calibration"``), else the first ``reference_s`` after boot (longer when a
    cell has not seen ``min_count`` questions by then), binned into ``bins`` equal-count bins.
    A cell with fewer than ``min_count`` questions in the window or the reference has no PSI.
    """

    window_s: Positive = 3600.0
    reference: Literal["calibration", "boot"] = "calibration"
    reference_s: Positive = 3600.0
    bins: Annotated[int, Meta(ge=2, le=100)] = 10
    min_count: Count = 300


class Cache(_Strict, frozen=True):
    """``[cache]``: the decision cache (``cascade.cache``). A ``[cache]`` table turns it on
    (``enabled = false`` keeps the table and turns it off). Entries live ``ttl_s`` and the
    in-memory store holds at most ``max_bytes`` (least recently used dropped first); the Redis
    store (``backend = "redis"``, ``url``) is shared by replicas and bounded by Redis's own
    ``maxmemory``. ``shared``: one namespace for every tenant instead of one per tenant.
    ``charge_cached``: what a tenant's ``input_tokens_per_min`` is charged for an input token
    answered from the cache, as a share of a computed one."""

    enabled: bool = True
    backend: Literal["memory", "redis"] = "memory"
    max_bytes: Count = 64 << 20
    ttl_s: Positive = 3600.0
    shared: bool = False
    url: str | None = None  # redis://host:6379/0 (backend = "redis" only)
    timeout_s: Positive = 0.05  # each Redis operation, connecting included; then a counted miss
    retry_s: Positive = 1.0  # after a Redis error, how long lookups skip Redis (misses, no wait)
    charge_cached: Unit = 0.0  # in [0, 1]: a cached input token counts this much of a token


class Novelty(_Strict, frozen=True):
    """``[novelty]``: the novelty gate (``cascade.policy.novelty``). A cheap answer whose pooled
    vector lies farther from its cell's reference set (the calibration's) than the cell's
    threshold escalates (``novel``) whatever its confidence; the budget cuts it only when
    ``budgeted``. ``cascade calibrate`` fits the reference sets: at most ``max_reference``
    vectors per cell (cells with fewer than ``min_rows``: none), projected to ``dims``, the
    threshold flagging ``max_flag_rate`` of them, distances to the ``k`` nearest."""

    enabled: bool = True
    max_flag_rate: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.02
    k: Count = 5
    dims: Count = 32
    # at most 20000: fitting holds every pair of a cell's vectors' distances
    max_reference: Annotated[int, Meta(ge=1, le=20_000)] = 2000
    min_rows: Count = 30
    budgeted: bool = False


class Consistency(_Strict, frozen=True):
    """``[consistency]``: the option-order check (``cascade.policy.consistency``). A choice or
    score answer the gate keeps by less than ``margin`` of confidence is asked again under
    ``orders`` other option orders (reversed, then shuffles seeded by ``seed``); a changed
    winner escalates it (``order_unstable``). At most ``max_extra_rows`` extra rows per request
    (and never more than the cheap tier's batch). A ``[consistency]`` table turns it on."""

    enabled: bool = True
    margin: Unit = 0.1
    orders: Count = 1
    max_extra_rows: Count = 8
    seed: int = 0


Share = Annotated[float, Meta(ge=0.0, le=1.0)]


class Guards(_Strict, frozen=True):
    """``[rollout.guards]``: what a candidate version must hold against the current one on the
    same traffic window (``cascade.rollout.verdict`` judges it with a sequential test, so looking
    every ``interval_s`` costs no extra false verdicts; ``alpha`` is spent over all the looks).
    ``max_strong_share_delta``: the candidate's strong share may exceed the current's by at most
    this; ``min_labelled_accuracy_delta``: its accuracy on labelled questions may fall below the
    current's by at most ``-`` this; ``max_error_rate``: the most of its questions that may be
    degraded. A guard set to none is not checked. The candidate is rolled back once a guard is
    broken with confidence; promoted once every guard holds with confidence on at least
    ``min_questions`` questions (and ``min_labels`` labelled ones, with the accuracy guard) per
    arm. ``auto = false``: the verdict is reported, and only an admin promotes or aborts."""

    max_strong_share_delta: Share | None = 0.05
    min_labelled_accuracy_delta: Annotated[float, Meta(ge=-1.0, le=1.0)] | None = -0.02
    max_error_rate: Share | None = 0.05
    min_questions: Count = 200
    min_labels: Count = 50
    alpha: Annotated[float, Meta(gt=0.0, lt=0.5)] = 0.05
    interval_s: Positive = 30.0
    auto: bool = True


class Policy(_Strict, frozen=True, kw_only=True):
    description: str = ""
    tiers: dict[str, Tier]
    models: Models = field(default_factory=Models)
    route: Route = field(default_factory=Route)
    thresholds: Thresholds = field(default_factory=Thresholds)
    breaker: dict[str, BreakerConfig] = field(default_factory=dict)
    shadow: Shadow = field(default_factory=Shadow)
    degrade: Degrade = field(default_factory=Degrade)
    calibration: Calibration = field(default_factory=Calibration)
    decision_log: DecisionLog = field(default_factory=DecisionLog)
    control: Control | None = None  # ``[control]``; absent: the gate is the configured one
    drift: Drift = field(default_factory=Drift)
    # ``[cost]``: what each tier costs per 1000 input tokens, by tier name, for ``cascade
    # eval``'s cost model; a tier not listed gets its kind's default (cascade.policy.costs).
    cost: dict[str, NonNegative] = field(default_factory=dict)
    cache: Cache = field(default_factory=lambda: Cache(enabled=False))  # off without [cache]
    consistency: Consistency = field(default_factory=lambda: Consistency(enabled=False))
    novelty: Novelty = field(default_factory=Novelty)

    @classmethod
    def single_tier(cls, tier_name: str, tier: Tier) -> Policy:
        """A one-tier policy: every model name is accepted and every question goes to ``tier``.

        A Laya tier fills the cheap slot, any other kind the strong slot.
        """
        route = Route(cheap=tier_name) if isinstance(tier, LayaTier) else Route(strong=tier_name)
        return cls(tiers={tier_name: tier}, route=route, models=Models(unknown="cascade"))

    def breaker_for(self, tier: str) -> BreakerConfig:
        """The tier's breaker settings, or the defaults."""
        return self.breaker.get(tier, BreakerConfig())

    def cheap_tier(self) -> Tier | None:
        return self.tiers[self.route.cheap] if self.route.cheap else None
