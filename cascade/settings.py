"""Settings: one frozen Struct, built once from ``CASCADE_*`` environment variables and flags.

Nothing reads the environment at import time; ``create_app(settings)`` receives it explicitly.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from cascade.overrides import msgspec as messages
from cascade.schema import LIMITS

ADMISSION_DEADLINE_S = 8.0  # under the 10 s timeout of the official SDKs


LogLevel = Literal["debug", "info", "warning", "error"]

# The ranges of numeric settings (docs/configuration.md), checked by ``from_env`` before anything
# loads: a setting that cannot work stops the boot instead of serving 503 to every request.
DAY_S = 86400.0
Count = Annotated[int, msgspec.Meta(ge=1)]  # a limit, a size or a pool: at least one
Seconds = Annotated[float, msgspec.Meta(gt=0, le=DAY_S)]  # a timeout or a window: finite, > 0
Wait = Annotated[float, msgspec.Meta(ge=0, le=DAY_S)]  # a wait that may be none
Rate = Annotated[float, msgspec.Meta(gt=0, le=float(1 << 40))]  # per second: finite, > 0


class SettingsError(ValueError):
    """A setting that cannot be used; the message names its environment variable or flag."""


class Secret(str):
    """A string that never prints (repr and str of containers show ``'***'``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    # Laya's default, so Laya clients switch by base URL only.
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8000
    # A policy file (policies/*.toml). Without one: --upstream, --laya or --demo build a policy.
    policy: str | None = None
    # One-tier policy forwarding to any /v1/systemone server.
    upstream: str | None = None
    upstream_model: str | None = None
    upstream_api_key: str | None = None
    # In-process Laya checkpoint directories (name -> dir); "english" when given a bare path.
    laya: dict[str, str] = {}
    # In-process Clef release directory.
    clef: str | None = None
    clef_overlong: Literal["reject", "truncate"] = "reject"
    clef_max_length: Count = 16384
    # Tiny random checkpoints of both tiers; labelled as a demo everywhere.
    demo: bool = False
    demo_dir: str = ".cache/demo"
    # Confidence profile of responses: "laya" (default, Laya extras) or "jev" (exact Jev shape).
    profile: Literal["laya", "jev"] = "laya"
    # Bearer keys; empty means auth off (any Authorization header is then accepted). The file
    # holds [[tenant]] tables (cascade.tenants: hashed keys, limits, a policy), or one key per
    # line (# comments); cascade.tenants.files reads both.
    api_keys: tuple[str, ...] = ()
    api_keys_file: str | None = None
    # With keys configured, /metrics needs an admin key and /docs a client key, unless made
    # public here (for a Prometheus without credentials, or a public API reference).
    public_metrics: bool = False
    public_docs: bool = False
    # Admission: requests in flight before new ones get 503 + Retry-After.
    max_inflight: Count = 256
    # Admission by expected wait: a request the tiers' measured work ahead would keep waiting
    # longer than this (seconds) gets 503 + Retry-After at once; accepted work runs to the end.
    admission_deadline_s: Seconds = ADMISSION_DEADLINE_S
    max_body_bytes: Count = 16 * 1024 * 1024
    body_read_timeout_s: Seconds = 10.0
    # Client texts besides the state (characters; structured JSON: serialized), checked before
    # any tier tokenizes: one label, one question's instructions, one option text, all question
    # texts together, and the state(s) with them (422 at the text, 413 for the totals). A batch
    # whose answers could pass max_batch_answer_bytes is refused (413) before any work.
    max_label_chars: Count = LIMITS.max_label_chars
    max_instructions_chars: Count = LIMITS.max_instructions_chars
    max_option_chars: Count = LIMITS.max_option_chars
    max_question_text_chars: Count = LIMITS.max_question_text_chars
    max_request_text_chars: Count = LIMITS.max_request_text_chars
    max_batch_answer_bytes: Count = LIMITS.max_batch_answer_bytes
    # Bodies are read before admission, under a budget of their own (cascade.http.reading): a
    # body not complete at its first read takes one of max_body_reads slots, at most
    # max_body_reads_per_client per client address (over them: 503 / 429 + Retry-After), and
    # must arrive at min_body_rate bytes/s on average once body_rate_grace_s has passed (408).
    max_body_reads: Count = 128
    max_body_reads_per_client: Count = 16
    min_body_rate: Rate = 1024.0
    body_rate_grace_s: Wait = 2.0
    # A client that reads nothing of its answer for send_timeout_s while the answer waits in
    # the server's write buffer (over the transport's high-water mark) is disconnected.
    send_timeout_s: Seconds = 30.0
    # Threads that decode and validate bodies and images (apart from the engines' threads), and
    # how many bodies may wait for one before new ones get 503 + Retry-After.
    decode_threads: Count = 2
    decode_queue: Annotated[int, msgspec.Meta(ge=0)] = 32
    # The request head (request line and header fields): over either limit is 431. A connection
    # that has not sent a whole head this long after opening (or after its next request's
    # first byte) is closed; an idle keep-alive connection is closed after keep_alive_s.
    max_header_bytes: Count = 64 * 1024
    max_headers: Count = 128
    header_timeout_s: Seconds = 10.0
    keep_alive_s: Seconds = 5.0
    # SIGTERM: /ready answers 503 for drain_s while requests are still served, then in-flight
    # requests get grace_s to finish before the process exits.
    drain_s: Wait = 5.0
    grace_s: Wait = 20.0
    log_level: LogLevel = "info"
    # text: "TIME LEVEL LOGGER: message" lines; json: one object per line (cascade.http.logs).
    log_format: Literal["text", "json"] = "text"
    # A calibration file from ``cascade calibrate`` (overrides the policy's [calibration] file).
    calibration: str | None = None
    # The decision log, one row per answered question (overrides [decision_log] file): a SQLite
    # file's path, or a postgresql:// URL shared by every replica (cascade.store).
    decision_log: str | None = None
    # PostgreSQL only: the local spool of batches the database cannot take now (default:
    # cascade-spool-REPLICA in the temporary directory; one per replica).
    decision_spool: str | None = None
    # PostgreSQL only: a file holding the database password (a mounted Secret), when neither the
    # URL nor PGPASSWORD has it; offline readers (cascade usage, eval, ...) read it too.
    decision_log_password_file: str | None = None
    # This gateway's name in the rows it writes (default: the hostname).
    replica: str | None = None
    # Repeated log lines: the first log_repeat_burst of each kind per log_repeat_interval_s pass;
    # the rest are counted and reported with the next line of that kind.
    log_repeat_burst: Count = 5
    log_repeat_interval_s: Seconds = 10.0
    # Admin keys (POST /admin/reload, cascade.http.admin): never client keys, and client keys
    # never open /admin; with none configured the admin routes answer 403. The file in the
    # api_keys_file's formats, each key named (cascade.tenants.admins). A reload (SIGHUP,
    # /admin/reload) reads both key files again.
    admin_keys: tuple[str, ...] = ()
    admin_keys_file: str | None = None
    # Watch the policy, calibration and key files every watch_s seconds (0: off) and reload
    # once a change has held still for one more look; a Kubernetes ConfigMap's symlink swap
    # counts (cascade.fleet.watch).
    watch_s: Wait = 0.0
    # The Redis replicas meet on (cascade.fleet): each writes a heartbeat every
    # fleet_heartbeat_s, seen for fleet_seen_s (GET /admin/fleet), and answers a fleet reload
    # (POST /admin/reload?scope=fleet) on pub/sub; the caller waits fleet_reply_s for answers.
    # Unset: the [limits] or [cache] Redis when either is on Redis, else no fleet.
    fleet_redis: Annotated[str, msgspec.Meta(pattern=r"^(redis|rediss|unix)://")] | None = None
    fleet_heartbeat_s: Seconds = 10.0
    fleet_seen_s: Seconds = 60.0
    fleet_reply_s: Seconds = 5.0
    # Precision of the Laya tier --laya builds: "int8" serves the int8 export, only with a
    # passing flip report for its weights (a policy file sets [tiers.laya] precision itself).
    laya_precision: Literal["fp32", "int8"] = "fp32"

    def __repr__(self) -> str:
        fields = msgspec.structs.asdict(self)
        fields["api_keys"] = tuple(Secret(k) for k in self.api_keys)
        fields["upstream_api_key"] = Secret(self.upstream_api_key or "")
        fields["admin_keys"] = tuple(Secret(k) for k in self.admin_keys)
        return "Settings(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def key_file_text(
    path: str, variable: str, *, what: str = "keys file", create: str = "one key per line"
) -> str:
    """The text of the keys file at ``path``; ``SettingsError`` naming ``variable`` (and how to
    ``create`` it) when it cannot be read or is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError(
            f"{variable}={path}: {what} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    except OSError as exc:
        raise SettingsError(
            f"{variable}={path}: {exc.strerror}; create it ({create}) or unset the variable"
        ) from None


_LISTS = {"api_keys", "admin_keys"}
_SECRETS = {"api_keys", "upstream_api_key", "admin_keys"}
_MAPS = {"laya"}
# Flags whose name is not the field's (``cascade serve``), so an error names what was typed.
_FLAGS = {
    "admission_deadline_s": "--admission-deadline",
    "clef_max_length": "--max-length",
    "clef_overlong": "--overlong",
}


def is_database_url(target: str | Path) -> bool:
    """Whether a decision-log setting names a PostgreSQL database (else a SQLite file's path)."""
    return str(target).startswith(("postgresql://", "postgres://"))


def env_value(field: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The raw ``CASCADE_<FIELD>`` value, for the few choices made before ``Settings`` can be
    built (whether an error keeps its traceback; a command's own default port)."""
    return (os.environ if environ is None else environ).get(f"CASCADE_{field.upper()}")


def otel_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``OTEL_*`` variables, which configure tracing (``cascade.tracing.config``)."""
    found = os.environ if environ is None else environ
    return {name: value for name, value in found.items() if name.startswith("OTEL_")}


def under_make(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``make`` started this process (it sets ``MAKELEVEL``): hints then name make's
    variables (``make serve PORT=N``) rather than flags."""
    return "MAKELEVEL" in (os.environ if environ is None else environ)


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where cascade keeps what it derives from weights (ONNX exports, distill runs):
    ``$CASCADE_CACHE``, else ``~/.cache/cascade``."""
    base = (os.environ if environ is None else environ).get("CASCADE_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "cascade"


def env_secret(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The credential in the environment variable ``name`` a policy points to (an upstream
    tier's ``api_key_env``): read when the tier is built, never stored in ``Settings``."""
    return (os.environ if environ is None else environ).get(name)


def from_env(environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Settings from ``CASCADE_<FIELD>`` variables, then ``overrides`` (flags) on top.

    Lists are comma-separated (``CASCADE_API_KEYS=a,b``); maps are ``name=dir`` pairs, comma
    separated (``CASCADE_LAYA=english=/ckpt/en,multilingual=/ckpt/ml``).
    """
    environ = os.environ if environ is None else environ
    raw: dict[str, object] = {}
    sources: dict[str, str] = {}
    for field in msgspec.structs.fields(Settings):
        value = environ.get(f"CASCADE_{field.name.upper()}")
        if value is None:
            continue
        shown = "***" if field.name in _SECRETS else value
        sources[field.name] = f"CASCADE_{field.name.upper()}={shown}"
        if field.name == "log_level":
            value = value.lower()
        if field.name in _LISTS:
            raw[field.name] = [v.strip() for v in value.split(",") if v.strip()]
        elif field.name in _MAPS:
            raw[field.name] = parse_map(value)
        else:
            raw[field.name] = value
    flags = {k: v for k, v in overrides.items() if v is not None}
    raw.update(flags)
    sources.update(
        {k: f"{_FLAGS.get(k, '--' + k.replace('_', '-'))} {v}" for k, v in flags.items()}
    )
    try:
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(_named(str(exc), sources)) from None


def _named(message: str, sources: Mapping[str, str]) -> str:
    """msgspec's ``Expected `int`, got `str` - at `$.port``` as ``CASCADE_PORT=abc: expected
    `int`, got `str```: the variable (or flag) the user wrote, not a JSON path."""
    reason, loc = messages.split(message)
    if not loc or not isinstance(loc[0], str):
        return message
    field = loc[0]
    choices = typing.get_args(typing.get_type_hints(Settings).get(field))
    if reason.startswith("Invalid enum value") and choices:
        reason += f" (one of: {', '.join(choices)})"
    return f"{sources.get(field, field)}: {reason[:1].lower()}{reason[1:]}"


def parse_map(value: str) -> dict[str, str]:
    """``name=dir,name=dir`` (a bare ``dir`` means ``english=dir``)."""
    out: dict[str, str] = {}
    for item in filter(None, (v.strip() for v in value.split(","))):
        name, sep, path = item.partition("=")
        if sep:
            out[name.strip()] = path.strip()
        else:
            out["english"] = name
    return out


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with ``extra`` on top, for a child process cascade starts
    (``cascade bench control`` runs a demo gateway of its own)."""
    return {**os.environ, **extra}
