"""Every Prometheus metric cascade exports: names, units, buckets and label sets, in one place.

Conventions: one ``cascade_`` prefix, seconds, ``_total`` counters, and bounded labels only:
``route`` (the URL template), ``outcome``, ``status`` (HTTP code), ``hop``, ``tier`` (a configured
tier name), ``type`` (choice/score/noul), ``band`` (2, 3-5, 6-10, 11+), ``reason`` (a fixed code
from ``cascade.policy.routing``), ``state``. Never question ids, model names from clients, or
free text.

The registry is the process default, except for the gauges that read one gateway at scrape
time (``GatewayGauges``, ``ControlGauges``, ``CacheGauges``, ``DriftGauges``, ``ConfigInfo``):
each app registers its own gateway's (``cascade.http.gauges``). cascade runs
as one worker process per container: the engines live in process (one ONNX session and one GPU
model per process), so more workers would mean more model copies; scale out with more
containers, each scraped on its own ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import prometheus_client
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from cascade.overrides.prometheus_client import Remembered


class Counter(Remembered, prometheus_client.Counter):
    pass


class Gauge(Remembered, prometheus_client.Gauge):
    pass


class Histogram(Remembered, prometheus_client.Histogram):
    pass


LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
FAST_BUCKETS = (0.0001, 0.00025, 0.0005, *LATENCY_BUCKETS)
CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DELTA_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)

REQUESTS = Counter(
    "cascade_requests_total",
    "HTTP requests by route, outcome (ok, degraded, client_error, overloaded, error, cancelled: "
    "the client went away) and status.",
    ["route", "outcome", "status"],
)
REQUEST_DURATION = Histogram(
    "cascade_request_duration_seconds",
    "Whole request time in the gateway, by route.",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
HOP_DURATION = Histogram(
    "cascade_hop_duration_seconds",
    "Time per gateway hop: decode, validate, pre_route, merge, encode.",
    ["hop"],
    buckets=FAST_BUCKETS,
)
TIER_DURATION = Histogram(
    "cascade_tier_duration_seconds",
    "Time of one call to a tier (queue wait included), by tier and outcome.",
    ["tier", "outcome"],
    buckets=LATENCY_BUCKETS,
)
QUESTIONS = Counter(
    "cascade_questions_total",
    "Questions answered, by the tier whose answer was returned, and type.",
    ["tier", "type"],
)
ESCALATIONS = Counter(
    "cascade_escalations_total",
    "Questions sent to the strong tier, by reason (pre-routing and post-rules) and type.",
    ["reason", "type"],
)
NOVELTY_FLAGS = Counter(
    "cascade_novelty_flags_total",
    "Cheap answers the novelty gate judged unlike its calibration data (escalated as novel "
    "unless another rule already had, or a budgeted gate was cut), by type and option band.",
    ["type", "band"],
)
DEGRADED = Counter(
    "cascade_degraded_answers_total",
    "Cheap-tier answers returned marked degraded because the strong tier failed, by reason.",
    ["reason", "type"],
)
CONFIDENCE = Histogram(
    "cascade_answer_confidence",
    "answer_confidence (max probability) of returned answers, by tier and type.",
    ["tier", "type"],
    buckets=CONFIDENCE_BUCKETS,
)
TOKENS = Counter("cascade_tokens_total", "Input tokens processed, by tier.", ["tier"])
BATCH_SIZE = Histogram(
    "cascade_batch_size", "Rows per batch a tier ran.", ["tier"], buckets=BATCH_BUCKETS
)
BATCH_DURATION = Histogram(
    "cascade_batch_duration_seconds",
    "Compute time per batch, by tier.",
    ["tier"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_DEPTH = Gauge("cascade_queue_depth", "Items waiting in a tier's queue.", ["tier"])
QUEUE_WAIT = Histogram(
    "cascade_queue_wait_seconds",
    "Time items waited in a tier's queue before their batch started.",
    ["tier"],
    buckets=FAST_BUCKETS,
)
SHADOW = Counter(
    "cascade_shadow_requests_total",
    "Shadow calls to the strong tier: sent, skipped_busy, failed.",
    ["outcome"],
)
SHADOW_AGREEMENT = Counter(
    "cascade_shadow_choice_agreement_total",
    "Shadowed choice questions by type/band and whether the top-1 answers agreed.",
    ["type", "band", "agree"],
)
SHADOW_DELTA = Histogram(
    "cascade_shadow_delta",
    "Shadowed |Δ| between tiers: noul |Δp|, score |Δ expected level|, by type and band.",
    ["type", "band"],
    buckets=DELTA_BUCKETS,
)
SHADOW_TVD = Histogram(
    "cascade_shadow_tvd",
    "Shadowed total variation distance between the tiers' distributions, by type and band.",
    ["type", "band"],
    buckets=DELTA_BUCKETS[:-2],  # a distance in [0, 1]
)
DECISION_LOG_ROWS = Counter(
    "cascade_decision_log_rows_total",
    "Decision log rows (one per answered question) by outcome: written; dropped (the writer's "
    "queue was full, the request was not slowed); failed (the database refused the write; "
    "not retried; PostgreSQL: the spool was full or failed too); spooled (PostgreSQL was "
    "unreachable: kept in the local spool); replayed (from the spool into PostgreSQL).",
    ["outcome"],
)
DECISION_STORE_REACHABLE = Gauge(
    "cascade_decision_store_reachable",
    "1 while the PostgreSQL decision store took the last write, 0 while it is unreachable "
    "(rows go to the local spool).",
)
DECISION_STORE_SPOOL_BYTES = Gauge(
    "cascade_decision_store_spool_bytes",
    "Bytes of batches waiting in the local spool for PostgreSQL (0: not behind).",
)
DECISION_LOG_ERRORS = Counter(
    "cascade_decision_log_errors_total",
    "Decision log writer failures by stage: write (a batch's transaction, or reopening the file "
    "for it; its rows count as failed; PostgreSQL: spooled), rotate (checkpoint, rename or "
    "reopen at the size cap; tried again after the next batch), spool (the local spool could "
    "not take a batch), prune (PostgreSQL retention). The writer carries on after each.",
    ["stage"],
)
# exported at 0 from the start, so rate() reads a series
for _stage in ("write", "rotate", "spool", "prune"):
    DECISION_LOG_ERRORS.labels(stage=_stage)
# ---- feedback (POST /v1/feedback)
FEEDBACK = Counter(
    "cascade_feedback_total",
    "Feedback labels by outcome: stored (a question's first label), relabelled (a later label "
    "replaced it: the latest wins), invalid (the call was refused 422: a label that does not fit, "
    "a question the request did not ask, a body that does not decode counts one), "
    "unknown_request (404), log_off (409: no decision log), failed (503: the log did not take "
    "them in time).",
    ["outcome"],
)
for _outcome in ("stored", "relabelled", "invalid", "unknown_request", "log_off", "failed"):
    FEEDBACK.labels(outcome=_outcome)  # exported at 0 from the start, so rate() reads a series
SEND_TIMEOUTS = Counter(
    "cascade_send_timeouts_total",
    "Connections aborted because their client read under 64 KiB of its answer in "
    "CASCADE_SEND_TIMEOUT_S.",
)

# ---------------------------------------------------------------- live control (cascade.control)
BUDGET_FLAGGED = Counter(
    "cascade_budget_flagged_total",
    "Questions the gate's thresholds would have escalated but the live gate kept on the cheap "
    "tier (reason budget: the budget or capacity binds, or escalate=False), by type.",
    ["type"],
)
CONTROL_CONFLICTS = Counter(
    "cascade_control_conflicts_total",
    "Times the strong tier's budget and the accuracy target conflicted, by which won "
    "([control] prefer).",
    ["winner"],
)
GATE_CHANGES = Counter(
    "cascade_gate_changes_total",
    "Threshold changes of the live gate, by source: refit (labels), budget (the pacer binding "
    "or relaxing).",
    ["source"],
)
FLEET_SHARE = Gauge(
    "cascade_fleet_strong_share",
    "[control] scope = \"fleet\": share of the fleet's answered questions (every replica's, "
    "from Redis) the strong tier answered over window_s.",
)
FLEET_CONNECTED = Gauge(
    "cascade_fleet_connected",
    '[control] scope = "fleet": 1 while the last sync with the fleet\'s Redis succeeded; 0 '
    "while this replica paces on its own counts and keeps its last gate.",
)
FLEET_SYNC_ERRORS = Counter(
    "cascade_fleet_sync_errors_total",
    "[control] scope = \"fleet\": syncs of the live gate's counts and gates with the fleet's "
    "Redis that failed or timed out.",
)
FLEET_REFIT_ERRORS = Counter(
    "cascade_fleet_refit_errors_total",
    '[control] scope = "fleet" with a PostgreSQL decision store: steps of the fleet\'s refit '
    "that failed or timed out, by stage: lease (taking or renewing it on Redis), read (the "
    "store's labelled rows), publish (the refit gate), adopt (reading it back). The replica "
    "keeps the last gate it adopted.",
    ["stage"],
)
for _type in ("choice", "score", "noul"):  # exported at 0 from the start, as above
    BUDGET_FLAGGED.labels(type=_type)
for _label in ("lease", "read", "publish", "adopt"):
    FLEET_REFIT_ERRORS.labels(stage=_label)
for _label in ("budget", "accuracy"):
    CONTROL_CONFLICTS.labels(winner=_label)
for _label in ("refit", "budget"):
    GATE_CHANGES.labels(source=_label)


# ---- decision cache (cascade.cache): lookups count questions on tiers that answer each
# question alone (Laya), whole calls on joint tiers (Clef, upstreams).
CACHE_HITS = Counter(
    "cascade_cache_hits_total",
    "Tier answers served from the decision cache, by tier (questions, or joint calls).",
    ["tier"],
)
CACHE_MISSES = Counter(
    "cascade_cache_misses_total",
    "Tier answers the decision cache did not hold (computed, or awaited from an identical call "
    "in flight), by tier.",
    ["tier"],
)
CACHE_PARTIAL = Counter(
    "cascade_cache_partial_total",
    "Tier calls answered partly from the cache: only their other questions were run, by tier.",
    ["tier"],
)
CACHE_COALESCED = Counter(
    "cascade_cache_coalesced_total",
    "Misses that waited for an identical call already in flight instead of running it, by tier.",
    ["tier"],
)
CACHE_BYPASS = Counter(
    "cascade_cache_bypass_total",
    "Requests that skipped the cache (cache-control: no-cache or no-store).",
)
CACHE_EVICTIONS = Counter(
    "cascade_cache_evictions_total",
    "Entries dropped from the in-memory decision cache: size (least recently used, over "
    "max_bytes) or ttl (expired).",
    ["reason"],
)
CACHE_ERRORS = Counter(
    "cascade_cache_errors_total",
    "Redis cache operations that failed or timed out (treated as misses), by operation.",
    ["op"],
)
for _reason in ("size", "ttl"):
    CACHE_EVICTIONS.labels(reason=_reason)
for _op in ("get", "put"):
    CACHE_ERRORS.labels(op=_op)


# ---------------------------------------------------------------- tenants (cascade.tenants)
# ``tenant``: a name from the keys file ("" for unnamed keys and with auth off), so bounded.
TENANT_REQUESTS = Counter(
    "cascade_tenant_requests_total",
    "Answered requests by tenant and each tier that ran for them (a batch counts its states).",
    ["tenant", "tier"],
)
TENANT_QUESTIONS = Counter(
    "cascade_tenant_questions_total",
    "Answered questions by tenant and the tier whose answer was returned.",
    ["tenant", "tier"],
)
TENANT_TOKENS = Counter(
    "cascade_tenant_input_tokens_total",
    "Input tokens each tier processed for a tenant (cached ones at [cache] charge_cached).",
    ["tenant", "tier"],
)
TENANT_COST = Counter(
    "cascade_tenant_cost_total",
    "What a tenant's requests cost on each tier, in the cost model of `cascade eval` ([cost]: "
    "price per 1000 input tokens; relative units by default, Laya 1, Clef or upstream 20).",
    ["tenant", "tier"],
)
TENANT_LIMITED = Counter(
    "cascade_tenant_rate_limited_total",
    "Requests refused with 429 because their tenant was over a limit, by tenant and limit.",
    ["tenant", "limit"],
)
LIMITS_BACKEND_ERRORS = Counter(
    "cascade_limits_backend_errors_total",
    "Calls to the tenants' limits backend (Redis) that failed or timed out; answered as [limits] "
    "on_error says (open: admitted, closed: 503).",
    ["backend"],
)
LIMITS_BACKEND_ERRORS.labels(backend="redis")  # exported at 0, so rate() reads a series


class GatewayGauges(Collector):
    """The gauges of one gateway, read at scrape time: ``cascade_tier_ready`` (an upstream going
    down, or a cooldown ending without any traffic, shows at once), ``cascade_breaker_state``
    and ``cascade_build_info`` (None until the gateway started)."""

    def __init__(
        self,
        ready: Callable[[], Mapping[str, bool]],
        breakers: Callable[[], Mapping[str, int]],
        build: Callable[[], Mapping[str, str] | None],
    ) -> None:
        self._ready, self._breakers, self._build = ready, breakers, build

    def collect(self) -> Iterator[Metric]:
        breaker = GaugeMetricFamily(
            "cascade_breaker_state",
            "Circuit breaker per tier: 0 closed, 1 half-open, 2 open.",
            labels=["tier"],
        )
        for tier, code in self._breakers().items():
            breaker.add_metric([tier], code)
        ready = GaugeMetricFamily(
            "cascade_tier_ready",
            "1 when a tier can serve now (loaded and warmed up; an upstream with a URL up).",
            labels=["tier"],
        )
        for tier, up in self._ready().items():
            ready.add_metric([tier], 1.0 if up else 0.0)
        yield from (breaker, ready)
        build = self._build()
        if build is not None:
            yield InfoMetricFamily(
                "cascade_build",
                "Version, tiers, checkpoints, revisions and whether this is a demo.",
                value=dict(build),
            )


# ---------------------------------------------------------------- reload (cascade.http.reload)

CONFIG_RELOADS = Counter(
    "cascade_config_reloads_total",
    "Reloads (SIGHUP, POST /admin/reload) by outcome: applied, unchanged (the files say what "
    "is serving), rejected (a file fails its checks: nothing changed), restart_needed (the "
    "change needs new engines: nothing changed).",
    ["outcome"],
)
for _outcome in ("applied", "unchanged", "rejected", "restart_needed"):
    CONFIG_RELOADS.labels(outcome=_outcome)


# ---------------------------------------------------------------- audit (cascade.audit)

AUDIT_RECORDS = Counter(
    "cascade_audit_records_total",
    "Admin audit records by outcome: stored (in the decision store), failed (the store write "
    "failed; the record is still logged), log_only (no decision log configured).",
    ["outcome"],
)
for _outcome in ("stored", "failed", "log_only"):
    AUDIT_RECORDS.labels(outcome=_outcome)


# ---------------------------------------------------------------- rollout (cascade.rollout)
# ``arm`` is current or candidate; ``policy_hash`` only ever the two arms' of the running rollout
# (a rollout that ends removes its old hash's series).

ROLLOUT_SHARE = Gauge(
    "cascade_rollout_share", "The candidate's share of requests now (0: no rollout runs)."
)
ROLLOUT_REQUESTS = Counter(
    "cascade_rollout_requests_total",
    "Requests (each state of a batch) decided while a rollout runs, by arm, its policy hash and "
    "outcome: ok, degraded (a question degraded or refused), error (no answer).",
    ["arm", "policy_hash", "outcome"],
)
ROLLOUT_QUESTIONS = Counter(
    "cascade_rollout_questions_total",
    "Questions answered while a rollout runs, by arm, its policy hash and the answering tier.",
    ["arm", "policy_hash", "tier"],
)
ROLLOUT_SECONDS = Histogram(
    "cascade_rollout_request_seconds",
    "Time to decide a request while a rollout runs, by arm and its policy hash.",
    ["arm", "policy_hash"],
    buckets=LATENCY_BUCKETS,
)
ROLLOUT_DECISIONS = Counter(
    "cascade_rollout_decisions_total",
    "Rollout decisions by outcome: started, stepped (to the next share), promoted, rolled_back "
    "(by the guards), aborted (by an admin).",
    ["outcome"],
)
for _outcome in ("started", "stepped", "promoted", "rolled_back", "aborted"):
    ROLLOUT_DECISIONS.labels(outcome=_outcome)


class ControlGauges(Collector):
    """``cascade_gate_threshold{type,band}`` and ``cascade_strong_share``: one gateway's live
    gate (``cascade.control.live``), read at scrape time."""

    def __init__(
        self, thresholds: Callable[[], Mapping[tuple[str, str], float]], share: Callable[[], float]
    ) -> None:
        self._thresholds, self._share = thresholds, share

    def collect(self) -> Iterator[Metric]:
        gate = GaugeMetricFamily(
            "cascade_gate_threshold",
            "The confidence threshold the gate applies now, by type and band: the configured (or "
            "refit) one, lowered where the strong tier's budget or capacity binds.",
            labels=["type", "band"],
        )
        for (qtype, band), value in self._thresholds().items():
            gate.add_metric([qtype, band], value)
        yield gate
        yield GaugeMetricFamily(
            "cascade_strong_share",
            "Share of the answered questions the strong tier answered over [control] window_s.",
            value=self._share(),
        )


class CacheGauges(Collector):
    """``cascade_cache_bytes`` and ``cascade_cache_entries``: one gateway's in-memory decision
    cache (``cascade.cache.store.MemoryStore``; 0 without one), read at scrape time."""

    def __init__(self, sizes: Callable[[], tuple[int, int]]) -> None:
        self._sizes = sizes

    def collect(self) -> Iterator[Metric]:
        size, entries = self._sizes()
        yield GaugeMetricFamily(
            "cascade_cache_bytes",
            "Bytes the in-memory decision cache accounts for (keys, values "
            "and a fixed overhead per entry).",
            value=size,
        )
        yield GaugeMetricFamily(
            "cascade_cache_entries", "Entries in the in-memory decision cache.", value=entries
        )


class ConfigInfo(Collector):
    """``cascade_config_info{policy_hash,calibration_hash}`` (1): what one gateway serves, read
    at scrape time, so a swap leaves no series of the old version behind."""

    def __init__(self, hashes: Callable[[], tuple[str, str]]) -> None:
        self._hashes = hashes

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "cascade_config_info",
            "1 for the policy and calibration serving now (content "
            "hashes, cascade.policy.fingerprint).",
            labels=["policy_hash", "calibration_hash"],
        )
        info.add_metric(list(self._hashes()), 1.0)
        yield info


# ---------------------------------------------------------------- fleet (cascade.fleet)
class InflightGauge(Collector):
    """``cascade_inflight_requests``: one app's in-flight permits taken now, read at scrape
    time (an autoscaler's signal beside the queue wait: KEDA's ScaledObject in deploy/k8s)."""

    def __init__(self, inflight: Callable[[], int]) -> None:
        self._inflight = inflight

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "cascade_inflight_requests",
            "Requests in flight now, holding the gateway's "
            "in-flight permits (a batch holds one per state; CASCADE_MAX_INFLIGHT of them).",
            value=self._inflight(),
        )


FLEET_CONFIG_SKEW = Gauge(
    "cascade_fleet_config_skew",
    "Replicas seen (heartbeat within CASCADE_FLEET_SEEN_S) serving another policy or calibration "
    "hash than most replicas do, as this replica read the fleet at its last heartbeat.",
)
FLEET_REPLICAS = Gauge(
    "cascade_fleet_replicas",
    "Replicas seen (heartbeat within CASCADE_FLEET_SEEN_S) at this replica's last heartbeat.",
)
FLEET_ERRORS = Counter(
    "cascade_fleet_errors_total",
    "Heartbeats (write and fleet read) that failed or timed out on the fleet's Redis.",
)

# ---------------------------------------------------------------- drift (cascade.control.drift)

UPSTREAM_MODEL_CHANGES = Counter(
    "cascade_upstream_model_changes_total",
    "Times a remote tier's answers or /health reported another model or revision than before "
    "(each change is logged, old -> new), by tier.",
    ["tier"],
)


class DriftGauges(Collector):
    """``cascade_confidence_psi{type,band}`` and ``cascade_fleet_confidence_psi{type,band}``,
    one gateway's drift monitor read at scrape time (registered per app beside
    ``GatewayGauges``); a cell without enough data has no series."""

    def __init__(
        self,
        psi: Callable[[], Mapping[tuple[str, str], float]],
        fleet: Callable[[], Mapping[tuple[str, str], float]],
    ) -> None:
        self._psi, self._fleet = psi, fleet

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "cascade_confidence_psi",
            "Population stability index of the cheap tier's gate confidences over the [drift] "
            "window against its reference (the calibration's snapshot, or the first hour after "
            "boot), by type and band. Over 0.25: a large shift.",
            labels=["type", "band"],
        )
        for (qtype, band), value in self._psi().items():
            family.add_metric([qtype, band], value)
        yield family
        fleet = GaugeMetricFamily(
            "cascade_fleet_confidence_psi",
            '[control] scope = "fleet": the same PSI over the whole fleet\'s confidences (every '
            "replica's counts on the calibration snapshot's bins, merged in Redis), by type and "
            "band; the same on every replica. No series without a snapshot; the last value kept "
            "while Redis is down, dropped once older than the [drift] window.",
            labels=["type", "band"],
        )
        for (qtype, band), value in self._fleet().items():
            fleet.add_metric([qtype, band], value)
        yield fleet
