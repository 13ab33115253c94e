"""Reading and checking policy files: every finding at once, each with its key's line.

``check_text`` decodes and validates a policy's TOML text; ``load_policy`` reads a file and
raises ``PolicyError`` (``FILE:LINE: error: ...`` lines) when it cannot be used;
``cascade policy check`` prints the same findings, warnings included.
"""

from __future__ import annotations

import math
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from cascade.errors import UnknownModel
from cascade.overrides import msgspec as messages
from cascade.policy.calibration import (
    CalibrationError,
    histogram_problem,
    with_calibration_file,
)
from cascade.policy.model import (
    Bands,
    Cache,
    Checkpoints,
    ClefTier,
    LayaTier,
    Policy,
    Thresholds,
    Tier,
    UpstreamTier,
)
from cascade.policy.routing import resolve_model
from cascade.policy.stats import lower_bound
from cascade.policy.toml_keys import KeyPath, key_lines, locate
from cascade.questions import BAND_MAX_OPTIONS, Band
from cascade.schema import QuestionType
from cascade.settings import is_database_url


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
    elif isinstance(value, dict) and (table := _struct_in_union(tp)) is not None:
        yield from _shape_struct(value, table, path)  # ``[control]``, a per-type target table
    elif tp == Tier:
        kinds = {c.__struct_config__.tag: c for c in typing.get_args(Tier)}
        kind = value.get("kind") if isinstance(value, dict) else None
        if kind not in kinds:
            yield _err((*path, "kind"), f"tier `{path[-1]}`: kind must be one of {sorted(kinds)}")
            return
        yield from _shape_struct(value, kinds[kind], path)
    elif _non_finite(value):
        yield _err(path, f"`{'.'.join(path)}` must be a finite number, not {value}")
    else:  # the type, and the bounds policy.model declares (msgspec.Meta)
        try:
            msgspec.convert(value, tp)
        except msgspec.ValidationError as exc:
            what = messages.split(str(exc))[0]
            yield _err(path, f"`{'.'.join(path)}`: {what}")


def _struct_in_union(tp: Any) -> type[msgspec.Struct] | None:
    """The one Struct of a union such as ``Control | None`` (None: not such a union)."""
    tables = [
        t for t in typing.get_args(tp) if isinstance(t, type) and issubclass(t, msgspec.Struct)
    ]
    return tables[0] if len(tables) == 1 and typing.get_origin(tp) is not dict else None


def _non_finite(value: Any) -> bool:
    """TOML has ``nan`` and ``inf``; no policy number (timeouts, windows, costs) may be either."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list | tuple):
        return any(_non_finite(v) for v in value)
    return False


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


def _threshold_findings(th: Thresholds) -> Iterator[Finding]:
    for qtype in typing.get_args(QuestionType):
        for kind in ("confidence", "margin"):
            bands: Bands = getattr(th, kind).of(qtype)
            for band, value in bands.items():
                path = ("thresholds", kind, qtype, band)
                if qtype == "noul" and band != "2":
                    yield _err(
                        path, f'noul questions are always band "2"; band {band!r} never applies'
                    )
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
            yield _warn(
                path,
                f"confidence threshold {value} can never be undercut in band "
                f"{band} (max p >= {floor:.3g} there): it never escalates",
            )


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
    found += _model_findings(policy)
    found += _threshold_findings(policy.thresholds)
    for qtype in typing.get_args(QuestionType):
        for band, value in policy.calibration.temperatures.of(qtype).items():
            if not value > 0:
                found.append(
                    _err(
                        ("calibration", "temperatures", qtype, band),
                        f"temperature {value} must be > 0",
                    )
                )
    for cell, hist in policy.calibration.snapshot.items():
        if problem := histogram_problem(hist):
            found.append(_err(("calibration", "snapshot", cell), f"snapshot {cell}: {problem}"))
    for name in policy.cost:
        if name not in tiers:
            found.append(_err(("cost", name), f"cost for an undefined tier `{name}`"))
    found += _control_findings(policy)
    found += _cache_findings(policy.cache)
    found += _rollout_findings(policy)
    return sorted(found, key=lambda f: f.severity != "error")


def _cache_findings(cache: Cache) -> Iterator[Finding]:
    if cache.backend == "redis" and not cache.url:
        yield _err(
            ("cache", "url"), 'cache.backend = "redis" needs cache.url (redis://host:port/db)'
        )
    elif cache.url is not None and not cache.url.startswith(("redis://", "rediss://", "unix://")):
        yield _err(("cache", "url"), f"`{cache.url}` is not a redis://, rediss:// or unix:// URL")
    if cache.backend == "memory" and cache.url is not None:
        yield _warn(("cache", "url"), 'cache.url is used only with backend = "redis"')


def _rollout_findings(policy: Policy) -> Iterator[Finding]:
    rollout = policy.rollout
    if rollout is None:
        return
    shares = [rollout.share, *rollout.steps]
    if any(b <= a for a, b in zip(shares, shares[1:], strict=False)):
        yield _err(("rollout", "steps"), "rollout.steps must ascend, each above rollout.share")


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
                yield _err(
                    ("thresholds", kind, qtype),
                    f"thresholds.{kind}.{qtype} needs a strong tier to escalate to",
                )
    if policy.shadow.fraction > 0:
        yield _err(("shadow", "fraction"), "shadow sampling needs a strong tier")


def _control_findings(policy: Policy) -> Iterator[Finding]:
    """``[control]``: the tiers and evidence its keys need (its bounds are declared)."""
    control = policy.control
    if control is None:
        return
    if policy.route.cheap is None or policy.route.strong is None:
        yield _err(
            ("control",),
            "[control] moves the gate between a cheap and a strong tier; route needs both",
        )
    if control.scope == "fleet" and not control.url:
        yield _err(("control", "url"), 'scope = "fleet" needs url, the Redis the replicas share')
    if control.scope == "replica" and control.url:
        yield _warn(("control", "url"), 'url without scope = "fleet": each replica paces alone')
    if control.min_threshold > control.max_threshold:
        yield _err(("control", "max_threshold"), "control.max_threshold must be >= min_threshold")
    targets = {qtype: control.target(qtype) for qtype in typing.get_args(QuestionType)}
    certifiable = lower_bound(control.min_labels, control.min_labels)
    highest = max((t for t in targets.values() if t is not None and t < 1.0), default=0.0)
    if certifiable < highest:
        yield _warn(
            ("control", "min_labels"),
            f"{control.min_labels} labels, all right, "
            f"certify only {certifiable:.3f} at 95 %: a cell fitted on so few for "
            f"{highest} escalates everything",
        )
    if control.prefer == "accuracy" and not any(t is not None for t in targets.values()):
        yield _warn(
            ("control", "prefer"),
            'prefer = "accuracy" without a target_accuracy: the budget always wins',
        )
    if control.teacher == "feedback+shadow" and policy.shadow.fraction <= 0:
        yield _warn(
            ("control", "teacher"),
            'teacher = "feedback+shadow" with shadow.fraction = 0: no shadow answers to learn from',
        )


def _tier_findings(name: str, tier: Tier) -> Iterator[Finding]:
    base = ("tiers", name)
    if isinstance(tier, LayaTier):
        named = tier.checkpoints.named()
        if not named:
            yield _err((*base, "checkpoints"), "a laya tier needs at least one checkpoint")
        elif tier.default_checkpoint not in named:
            yield _err(
                (*base, "default_checkpoint"),
                f"default_checkpoint `{tier.default_checkpoint}` is not in checkpoints",
            )
        if tier.flip_report is not None and len(named) > 1:
            yield _err(
                (*base, "flip_report"),
                "flip_report names one report: with several "
                "checkpoints, leave it out (each report lies next to its int8 export)",
            )
    elif isinstance(tier, UpstreamTier):
        if not tier.urls:
            yield _err((*base, "urls"), "an upstream tier needs at least one URL")
        for url in tier.urls:
            if not url.startswith(("http://", "https://")):
                yield _err((*base, "urls"), f"`{url}` is not an http(s) URL")


def _model_findings(policy: Policy) -> Iterator[Finding]:
    seen: dict[str, str] = {}
    for mode in ("cascade", "cheap_only", "strong_only"):
        for alias in getattr(policy.models, mode):
            key = alias.strip().lower()  # names match in any case
            if key in seen:
                yield _err(
                    ("models", mode),
                    f"model `{alias}` is listed in both models.{seen[key]} and models.{mode}",
                )
            seen[key] = mode
    if policy.models.cheap_only and policy.route.cheap is None:
        yield _err(("models", "cheap_only"), "models.cheap_only needs a cheap tier")
    try:
        resolve_model(policy, "jev-latest")
    except UnknownModel:
        yield _warn(("models",), "`jev-latest` (the SDKs' default model) is not accepted")


# ---------------------------------------------------------------- loading


def check_text(text: str) -> tuple[Policy | None, list[Finding]]:
    """Decode and validate a policy's TOML text. The policy is None when it has errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return None, [_err((), f"invalid TOML: {exc}")]
    return check_data(data)


def check_data(data: dict[str, Any]) -> tuple[Policy | None, list[Finding]]:
    """``check_text`` of a decoded document (a tenant's overlay merged onto its base policy)."""
    found = list(_shape(data, Policy, ()))
    if found and not all(messages.out_of_bounds(f.message) for f in found):
        return None, found
    # Values out of their declared bounds are reported with what the rest of the policy gets
    # wrong: the cross-checks run as if those keys were left at their defaults.
    try:
        policy = msgspec.convert(_without(data, [f.path for f in found]), Policy)
    except msgspec.ValidationError as exc:  # a constraint _shape does not model
        return None, [*found, _err((), str(exc))]
    found = sorted([*found, *validate(policy)], key=lambda f: f.severity != "error")
    if any(f.severity == "error" for f in found):
        return None, found
    return policy, found


def _without(data: dict[str, Any], paths: list[KeyPath]) -> dict[str, Any]:
    """``data`` without the keys at ``paths`` (copied where it changes)."""
    data = dict(data)
    for path in paths:
        table = data
        for key in path[:-1]:
            table[key] = table = dict(table[key])
        table.pop(path[-1], None)
    return data


def format_finding(filename: str, text: str, finding: Finding) -> str:
    """``FILE:LINE: severity: message``; LINE is that of the key, or of its nearest parent."""
    line = locate(key_lines(text), finding.path)
    if finding.message.startswith("invalid TOML"):
        line = _toml_error_line(finding.message) or line
    return f"{filename}:{line}: {finding.severity}: {finding.message}"


def load_policy(path: str | Path) -> Policy:
    """Read, decode and validate ``path``. Raises ``PolicyError`` listing every error.

    Relative local paths of checkpoints, releases, the calibration and the decision log come
    back absolute, anchored at the policy file's directory, so a policy means the same from any
    working directory. A ``[calibration] file`` is read and applied here.
    """
    path = Path(path)
    return policy_of_text(read_policy_text(path), str(path), path.parent.resolve())


def policy_of_text(text: str, filename: str, base: Path) -> Policy:
    """``load_policy`` of a policy's text, named ``filename`` in its errors, its relative paths
    anchored at ``base`` (``POST /admin/reload?dry_run=1`` sends the text in its body)."""
    policy, found = check_text(text)
    if policy is None:
        raise PolicyError(
            [format_finding(filename, text, f) for f in found if f.severity == "error"]
        )
    policy = _anchored(policy, base)
    if policy.calibration.file is not None:
        try:
            policy = with_calibration_file(policy, policy.calibration.file)
        except CalibrationError as exc:
            finding = _err(("calibration", "file"), str(exc))
            raise PolicyError([format_finding(filename, text, finding)]) from exc
    return policy


def read_policy_text(path: Path) -> str:
    """The file's UTF-8 text; ``PolicyError`` (``FILE[:LINE]: error: ...``) when unreadable."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError([f"{path}: error: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise PolicyError(
            [f"{path}:{line}: error: not UTF-8 text (byte {exc.start}: {exc.reason})"]
        ) from exc


def _anchored(policy: Policy, base: Path) -> Policy:
    def local(ref: str) -> str:
        if ref.startswith("~"):
            return str(Path(ref).expanduser())
        if ref.startswith(("./", "../")):
            return str((base / ref).resolve())
        return ref

    def local_path(ref: str) -> str:  # a file, never a hub id: any relative path is local
        return str((base / Path(ref).expanduser()).resolve())

    tiers: dict[str, Tier] = {}
    for name, tier in policy.tiers.items():
        if isinstance(tier, LayaTier):
            named = {ck: local(ref) for ck, ref in tier.checkpoints.named().items()}
            report = tier.flip_report and local_path(tier.flip_report)
            tiers[name] = msgspec.structs.replace(
                tier, checkpoints=Checkpoints.of(named), flip_report=report
            )
        elif isinstance(tier, ClefTier):
            tiers[name] = msgspec.structs.replace(tier, release=local(tier.release))
        else:
            tiers[name] = tier
    files: dict[str, Any] = {
        "calibration": policy.calibration.file
        and msgspec.structs.replace(policy.calibration, file=local_path(policy.calibration.file)),
        "decision_log": policy.decision_log.file
        and not is_database_url(policy.decision_log.file)
        and msgspec.structs.replace(policy.decision_log, file=local_path(policy.decision_log.file)),
    }
    if policy.rollout is not None:
        files["rollout"] = msgspec.structs.replace(
            policy.rollout, candidate=local_path(policy.rollout.candidate)
        )
    return msgspec.structs.replace(policy, tiers=tiers, **{k: v for k, v in files.items() if v})


def _toml_error_line(message: str) -> int | None:
    # tomllib: "... (at line 3, column 7)"
    marker = "(at line "
    if marker not in message:
        return None
    return int(message.split(marker, 1)[1].split(",", 1)[0].rstrip(")"))
