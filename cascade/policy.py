"""Routing policies: frozen Structs decoded from ``policies/*.toml``, and their validation.

A policy is data only. It names its tiers (``[tiers.NAME]``, tagged by ``kind``), which request
``model`` names mean the cascade or one tier (``[models]``), the pre-routing rules (``[route]``),
the escalation thresholds (``[thresholds]``), per-tier breakers (``[breaker.NAME]``), shadow
sampling (``[shadow]``) and degradation (``[degrade]``). The decisions live in
``cascade.routing``; nothing here does I/O except ``load_policy`` reading its one file.

Decoding is strict (``forbid_unknown_fields``): a typo fails at boot. ``check_text`` reports
every problem of a file at once, each with the line of the key it concerns, because ``tomllib``
keeps no positions; ``load_policy`` raises ``PolicyError`` carrying the same findings.
"""

from __future__ import annotations

import tomllib
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import field

from cascade.schema import QuestionType

Band = Literal["2", "3-5", "6-10", "11+"]
BANDS: tuple[Band, ...] = ("2", "3-5", "6-10", "11+")
# The largest option count of each band. max p >= 1/n, so a confidence threshold at or below
# 1/n_max can never be undercut by any question of that band.
BAND_MAX_OPTIONS: dict[Band, int | None] = {"2": 2, "3-5": 5, "6-10": 10, "11+": None}
Mode = Literal["cascade", "cheap_only", "strong_only"]
Checkpoint = Literal["english", "multilingual", "typed-decisions"]


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every policy Struct: immutable, keyword-only, unknown keys rejected."""


# ---------------------------------------------------------------- tiers


class Checkpoints(_Strict):
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
    def of(cls, named: Mapping[str, str | Path]) -> Checkpoints:
        """The inverse of ``named``: checkpoints from policy names to references."""
        return cls(**{name.replace("-", "_"): str(ref) for name, ref in named.items()})


class _Tier(_Strict, kw_only=True, tag_field="kind"):
    timeout_s: float = 5.0  # the whole call, queue wait included; then EngineTimeout
    max_queue: int = 256  # waiting calls beyond this are refused with Overloaded


class LayaTier(_Tier, kw_only=True, tag="laya"):
    """Laya in process on ONNX Runtime (CPU)."""

    checkpoints: Checkpoints
    default_checkpoint: Checkpoint = "english"  # the one previewed and run first
    max_batch_size: int = 32  # rows per ONNX run
    max_wait_s: float = 0.002  # how long a partial batch waits for more rows
    intra_op_threads: int = 1


class ClefTier(_Tier, kw_only=True, tag="clef"):
    """Clef-flash in process on torch."""

    release: str = "Cloudflare/clef-flash"  # hub id, or a local path as in Checkpoints
    max_length: int = 16384  # tokens, media included
    overlong: Literal["reject", "truncate"] = "reject"
    device: str = "cuda"
    max_batch_size: int = 8


class UpstreamTier(_Tier, kw_only=True, tag="upstream"):
    """Another ``/v1/systemone`` server. Several URLs are load-balanced with health checks."""

    urls: list[str]
    model: str | None = None  # forwarded as the request's model; None keeps the caller's
    api_key_env: str | None = None  # name of the env variable holding the bearer token
    connect_timeout_s: float = 1.0
    read_timeout_s: float = 10.0
    health_path: str = "/health"
    health_interval_s: float = 5.0


Tier = LayaTier | ClefTier | UpstreamTier


# ---------------------------------------------------------------- rules


class Models(_Strict):
    """Which request ``model`` names mean the cascade, the cheap tier only, or the strong only."""

    cascade: list[str] = field(default_factory=lambda: ["jev-latest", "jev-preview", "jev-1.13.0"])
    cheap_only: list[str] = field(default_factory=list)
    strong_only: list[str] = field(default_factory=list)
    unknown: Literal["reject", "cascade"] = "reject"  # reject: 400 api_usage_error


class Route(_Strict):
    """Pre-routing: which tier runs each question first."""

    cheap: str | None = None
    strong: str | None = None
    # Laya's option spans collapse beyond about head_max_len/4 options (192/4 for English).
    max_choice_options: int = 48
    strong_types: list[QuestionType] = field(default_factory=list)
    # questions: only the escalated questions go to the strong tier, in one call;
    # request: any escalation sends the whole request there, for joint consistency.
    escalate: Literal["questions", "request"] = "questions"
    # Text the cheap checkpoint cannot read: the multilingual checkpoint if configured, or strong.
    unreadable: Literal["multilingual", "strong"] = "multilingual"


_BAND_FIELD: dict[Band, str] = {
    "2": "two", "3-5": "three_five", "6-10": "six_ten", "11+": "eleven_plus"
}


class Bands(_Strict):
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


class TypeBands(_Strict):
    choice: Bands = field(default_factory=Bands)
    score: Bands = field(default_factory=Bands)
    noul: Bands = field(default_factory=Bands)

    def of(self, qtype: QuestionType) -> Bands:
        return {"choice": self.choice, "score": self.score, "noul": self.noul}[qtype]


class Thresholds(_Strict):
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


class BreakerConfig(_Strict):
    """Open when ``failure_ratio`` of at least ``min_calls`` calls in ``window_s`` failed."""

    window_s: float = 30.0
    min_calls: int = 5
    failure_ratio: float = 0.5
    cooldown_s: float = 10.0  # open -> half-open
    half_open_probes: int = 1  # successes needed to close; also the concurrent probe limit


class Shadow(_Strict):
    """Mirror ``fraction`` of cheap-final requests to the strong tier, off the response path."""

    fraction: float = 0.0
    max_concurrent: int = 2  # beyond this a sampled request is skipped, never queued
    seed: int = 0


class Degrade(_Strict):
    """When the strong tier is down: return cheap answers marked degraded, or refuse."""

    cheap_answers: bool = True
    retry_after_s: float = 5.0


class Policy(_Strict, kw_only=True):
    description: str = ""
    tiers: dict[str, Tier]
    models: Models = field(default_factory=Models)
    route: Route = field(default_factory=Route)
    thresholds: Thresholds = field(default_factory=Thresholds)
    breaker: dict[str, BreakerConfig] = field(default_factory=dict)
    shadow: Shadow = field(default_factory=Shadow)
    degrade: Degrade = field(default_factory=Degrade)

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


# ---------------------------------------------------------------- validation

KeyPath = tuple[str, ...]


class Finding(msgspec.Struct, frozen=True):
    """One problem in a policy; ``path`` is the TOML key path it concerns."""

    severity: Literal["error", "warning"]
    path: KeyPath
    message: str


class PolicyError(ValueError):
    """A policy file that cannot be used; ``messages`` are ``FILE:LINE: error: ...`` lines."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


def _err(path: KeyPath, message: str) -> Finding:
    return Finding("error", path, message)


def _warn(path: KeyPath, message: str) -> Finding:
    return Finding("warning", path, message)


def _shape(value: Any, tp: Any, path: KeyPath) -> Iterator[Finding]:
    """Every unknown key and wrong-typed value, with the exact key path (msgspec stops at one)."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        yield from _shape_struct(value, tp, path)
    elif typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            yield _err(path, f"`{'.'.join(path)}` must be a table")
            return
        for key, item in value.items():
            yield from _shape(item, typing.get_args(tp)[1], (*path, key))
    elif tp == Tier:
        kinds = {c.__struct_config__.tag: c for c in typing.get_args(Tier)}
        kind = value.get("kind") if isinstance(value, dict) else None
        if kind not in kinds:
            yield _err((*path, "kind"), f"tier `{path[-1]}`: kind must be one of {sorted(kinds)}")
            return
        yield from _shape_struct(value, kinds[kind], path)
    else:
        try:
            msgspec.convert(value, tp)
        except msgspec.ValidationError as exc:
            what = str(exc).split(" - at ")[0]
            yield _err(path, f"`{'.'.join(path)}`: {what}")


def _shape_struct(value: Any, cls: type[msgspec.Struct], path: KeyPath) -> Iterator[Finding]:
    if not isinstance(value, dict):
        yield _err(path, f"`{'.'.join(path) or 'policy'}` must be a table")
        return
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    tag_field = cls.__struct_config__.tag_field
    known = ", ".join(sorted([*fields, *([tag_field] if tag_field else [])]))
    for key, item in value.items():
        if key == tag_field:
            continue
        if key not in fields:
            yield _err((*path, key), f"unknown key `{key}` (known: {known})")
            continue
        yield from _shape(item, fields[key].type, (*path, key))
    for name, info in fields.items():
        required = info.default is msgspec.NODEFAULT and info.default_factory is msgspec.NODEFAULT
        if required and name not in value:
            yield _err(path, f"`{'.'.join(path) or 'policy'}` is missing the key `{name}`")


def _unit(path: KeyPath, value: float) -> Iterator[Finding]:
    if not 0.0 <= value <= 1.0:
        yield _err(path, f"`{'.'.join(path)}` = {value} is outside [0, 1]")


def _threshold_findings(th: Thresholds) -> Iterator[Finding]:
    for qtype in typing.get_args(QuestionType):
        for kind in ("confidence", "margin"):
            bands: Bands = getattr(th, kind).of(qtype)
            for band, value in bands.items():
                path = ("thresholds", kind, qtype, band)
                if qtype == "noul" and band != "2":
                    yield _err(path, f"noul questions are always band \"2\"; band {band!r} "
                               "never applies")
                    continue
                if not 0.0 <= value <= 1.0:
                    yield _err(path, f"{kind} threshold {value} is outside [0, 1]")
                    continue
                yield from _threshold_effect(path, kind, band, value)


def _threshold_effect(path: KeyPath, kind: str, band: Band, value: float) -> Iterator[Finding]:
    if value >= 1.0:
        yield _warn(path, f"{kind} threshold {value} escalates every question of band {band}")
    elif kind == "margin" and value <= 0.0:
        yield _warn(path, "margin threshold 0 never escalates (a margin is never below 0)")
    elif kind == "confidence":
        # max p >= 1/n; with more options allowed in the band, 1/n only gets smaller.
        widest = BAND_MAX_OPTIONS[band]
        floor = 0.0 if widest is None else 1.0 / widest
        if value <= floor:
            yield _warn(path, f"confidence threshold {value} can never be undercut in band "
                        f"{band} (max p >= {floor:.3g} there): it never escalates")


def validate(policy: Policy) -> list[Finding]:
    """Cross-references and thresholds of a decoded policy: errors first, then warnings."""
    found: list[Finding] = []
    route, tiers = policy.route, policy.tiers
    if not tiers:
        found.append(_err(("tiers",), "a policy needs at least one tier"))
    for slot in ("cheap", "strong"):
        name = getattr(route, slot)
        if name is not None and name not in tiers:
            found.append(_err(("route", slot), f"route.{slot} names an undefined tier `{name}`"))
    if route.cheap is None and route.strong is None:
        found.append(_err(("route",), "route needs a cheap or a strong tier"))
    if route.cheap is not None and route.cheap == route.strong:
        found.append(_err(("route", "strong"), "cheap and strong must be different tiers"))
    found += _strong_needed(policy)
    for name, tier in tiers.items():
        found += _tier_findings(name, tier)
        if name not in (route.cheap, route.strong):
            found.append(_warn(("tiers", name), f"tier `{name}` is not used by [route]"))
    for name in policy.breaker:
        if name not in tiers:
            found.append(_err(("breaker", name), f"breaker for an undefined tier `{name}`"))
    for name, config in policy.breaker.items():
        found += _breaker_findings(name, config)
    found += _model_findings(policy)
    found += _threshold_findings(policy.thresholds)
    if route.max_choice_options < 2:
        found.append(_err(("route", "max_choice_options"), "max_choice_options must be >= 2"))
    found += _unit(("shadow", "fraction"), policy.shadow.fraction)
    if policy.shadow.max_concurrent < 1:
        found.append(_err(("shadow", "max_concurrent"), "max_concurrent must be >= 1"))
    if policy.degrade.retry_after_s <= 0:
        found.append(_err(("degrade", "retry_after_s"), "retry_after_s must be > 0"))
    return sorted(found, key=lambda f: f.severity != "error")


def _strong_needed(policy: Policy) -> Iterator[Finding]:
    """Rules that send questions to the strong tier need one."""
    if policy.route.strong is not None:
        return
    th = policy.thresholds
    needs: list[tuple[KeyPath, str]] = [
        (("route", "strong_types"), "route.strong_types"),
        (("models", "strong_only"), "models.strong_only"),
    ]
    for path, label in needs:
        if getattr(policy.route if path[0] == "route" else policy.models, path[1]):
            yield _err(path, f"{label} needs a strong tier, but route.strong is not set")
    for kind in ("confidence", "margin"):
        for qtype in typing.get_args(QuestionType):
            if any(True for _ in getattr(th, kind).of(qtype).items()):
                yield _err(("thresholds", kind, qtype),
                           f"thresholds.{kind}.{qtype} needs a strong tier to escalate to")
    if policy.shadow.fraction > 0:
        yield _err(("shadow", "fraction"), "shadow sampling needs a strong tier")


def _tier_findings(name: str, tier: Tier) -> Iterator[Finding]:
    base = ("tiers", name)
    if tier.timeout_s <= 0:
        yield _err((*base, "timeout_s"), "timeout_s must be > 0")
    if tier.max_queue < 1:
        yield _err((*base, "max_queue"), "max_queue must be >= 1")
    if isinstance(tier, LayaTier):
        named = tier.checkpoints.named()
        if not named:
            yield _err((*base, "checkpoints"), "a laya tier needs at least one checkpoint")
        elif tier.default_checkpoint not in named:
            yield _err((*base, "default_checkpoint"),
                       f"default_checkpoint `{tier.default_checkpoint}` is not in checkpoints")
    elif isinstance(tier, ClefTier):
        if tier.max_length < 1:
            yield _err((*base, "max_length"), "max_length must be >= 1")
    else:
        if not tier.urls:
            yield _err((*base, "urls"), "an upstream tier needs at least one URL")
        for url in tier.urls:
            if not url.startswith(("http://", "https://")):
                yield _err((*base, "urls"), f"`{url}` is not an http(s) URL")
        if tier.connect_timeout_s <= 0 or tier.read_timeout_s <= 0:
            yield _err((*base, "read_timeout_s"), "connect/read timeouts must be > 0")


def _breaker_findings(name: str, config: BreakerConfig) -> Iterator[Finding]:
    base = ("breaker", name)
    if not 0.0 < config.failure_ratio <= 1.0:
        yield _err((*base, "failure_ratio"), "failure_ratio must be in (0, 1]")
    for key in ("window_s", "cooldown_s"):
        if getattr(config, key) <= 0:
            yield _err((*base, key), f"{key} must be > 0")
    for key in ("min_calls", "half_open_probes"):
        if getattr(config, key) < 1:
            yield _err((*base, key), f"{key} must be >= 1")


def _model_findings(policy: Policy) -> Iterator[Finding]:
    seen: dict[str, str] = {}
    for mode in ("cascade", "cheap_only", "strong_only"):
        for alias in getattr(policy.models, mode):
            if alias in seen:
                yield _err(("models", mode), f"model `{alias}` is listed in both "
                           f"models.{seen[alias]} and models.{mode}")
            seen[alias] = mode
    if policy.models.cheap_only and policy.route.cheap is None:
        yield _err(("models", "cheap_only"), "models.cheap_only needs a cheap tier")
    if "jev-latest" not in seen and policy.models.unknown == "reject":
        yield _warn(("models",), "`jev-latest` (the SDKs' default model) is not accepted")


# ---------------------------------------------------------------- loading


def check_text(text: str) -> tuple[Policy | None, list[Finding]]:
    """Decode and validate a policy's TOML text. The policy is None when it has errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return None, [_err((), f"invalid TOML: {exc}")]
    found = list(_shape(data, Policy, ()))
    if found:
        return None, found
    try:
        policy = msgspec.convert(data, Policy)
    except msgspec.ValidationError as exc:  # a constraint _shape does not model
        return None, [_err((), str(exc))]
    found = validate(policy)
    if any(f.severity == "error" for f in found):
        return None, found
    return policy, found


def format_finding(filename: str, text: str, finding: Finding) -> str:
    """``FILE:LINE: severity: message``; LINE is that of the key, or of its nearest parent."""
    line = locate(key_lines(text), finding.path)
    if finding.message.startswith("invalid TOML"):
        line = _toml_error_line(finding.message) or line
    return f"{filename}:{line}: {finding.severity}: {finding.message}"


def load_policy(path: str | Path) -> Policy:
    """Read, decode and validate ``path``. Raises ``PolicyError`` listing every error.

    Relative local paths of checkpoints and releases come back absolute, anchored at the
    policy file's directory, so a policy means the same from any working directory.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    policy, found = check_text(text)
    if policy is None:
        raise PolicyError([format_finding(str(path), text, f) for f in found
                           if f.severity == "error"])
    return _anchored(policy, path.parent.resolve())


def _anchored(policy: Policy, base: Path) -> Policy:
    def local(ref: str) -> str:
        if ref.startswith("~"):
            return str(Path(ref).expanduser())
        if ref.startswith(("./", "../")):
            return str((base / ref).resolve())
        return ref

    tiers: dict[str, Tier] = {}
    for name, tier in policy.tiers.items():
        if isinstance(tier, LayaTier):
            named = {ck: local(ref) for ck, ref in tier.checkpoints.named().items()}
            tiers[name] = msgspec.structs.replace(tier, checkpoints=Checkpoints.of(named))
        elif isinstance(tier, ClefTier):
            tiers[name] = msgspec.structs.replace(tier, release=local(tier.release))
        else:
            tiers[name] = tier
    return msgspec.structs.replace(policy, tiers=tiers)


def _toml_error_line(message: str) -> int | None:
    # tomllib: "... (at line 3, column 7)"
    marker = "(at line "
    if marker not in message:
        return None
    return int(message.split(marker, 1)[1].split(",", 1)[0].rstrip(")"))


# ---------------------------------------------------------------- key positions


def locate(lines: dict[KeyPath, int], path: KeyPath) -> int:
    """The line of ``path``, or of its longest prefix that has one (1 when none has)."""
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return 1


def key_lines(text: str) -> dict[KeyPath, int]:
    """Map every key path of a TOML document to the line it is written on (first wins).

    Handles table headers, dotted and quoted keys, one-line inline tables, multi-line arrays
    and multi-line strings; enough to point at keys, not a TOML parser.
    """
    out: dict[KeyPath, int] = {}
    table: KeyPath = ()
    depth = 0  # open brackets of a value spanning lines
    fence: str | None = None  # the open multi-line string delimiter
    for lineno, raw in enumerate(text.splitlines(), 1):
        if fence is not None:
            if raw.count(fence) % 2 == 1:
                fence = None
            continue
        line = _strip_comment(raw).strip()
        if depth > 0:
            depth = max(0, depth + _bracket_balance(line))
            continue
        if not line:
            continue
        if line.startswith("["):
            inner = line.strip("[]")
            table = _split_key(inner)
            out.setdefault(table, lineno)
            continue
        key, eq, value = _partition_top(line, "=")
        if not eq:
            continue
        path = (*table, *_split_key(key))
        out.setdefault(path, lineno)
        value = value.strip()
        if value.startswith("{"):
            _inline_keys(value, path, lineno, out)
        for delim in ('"""', "'''"):
            if value.startswith(delim) and value.count(delim) == 1:
                fence = delim
        depth = max(0, _bracket_balance(value)) if fence is None else 0
    return out


def _inline_keys(value: str, prefix: KeyPath, lineno: int, out: dict[KeyPath, int]) -> None:
    body = value[1:value.rindex("}")] if "}" in value else value[1:]
    for item in _split_top(body, ","):
        key, eq, sub = _partition_top(item, "=")
        if not eq:
            continue
        path = (*prefix, *_split_key(key))
        out.setdefault(path, lineno)
        if sub.strip().startswith("{"):
            _inline_keys(sub.strip(), path, lineno, out)


def _scan(text: str) -> Iterator[tuple[int, str, int]]:
    """Yield (index, char, nesting depth) for characters outside strings."""
    quote: str | None = None
    depth = 0
    escaped = False
    for i, ch in enumerate(text):
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
            continue
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        yield i, ch, depth


def _split_top(text: str, sep: str) -> list[str]:
    parts, start = [], 0
    for i, ch, depth in _scan(text):
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _partition_top(text: str, sep: str) -> tuple[str, str, str]:
    for i, ch, depth in _scan(text):
        if ch == sep and depth == 0:
            return text[:i], sep, text[i + 1:]
    return text, "", ""


def _split_key(key: str) -> KeyPath:
    return tuple(part.strip().strip("\"'") for part in _split_top(key.strip(), "."))


def _strip_comment(line: str) -> str:
    for i, ch, _ in _scan(line):
        if ch == "#":
            return line[:i]
    return line


def _bracket_balance(text: str) -> int:
    """Brackets opened minus brackets closed, outside strings."""
    last = 0
    for _, _, depth in _scan(text):
        last = depth
    return last

