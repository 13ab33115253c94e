"""Calibration files (``cascade calibrate`` writes them; policies and ``--calibration`` read them)
and the temperatures they put on the cheap tier's probabilities.

A calibration file (TOML) holds per (question type x option band) confidence thresholds and
temperatures, a ``[stamp]``: the content hash of each tier's weights it was fitted with, the
data's size and the target, and a ``[snapshot]``: per cell, the fitted data's gate confidences
(tempered) counted on fixed bin edges, the reference ``cascade.control.drift`` compares live
traffic with (files written before it have none and still read), and, when fitted, a
``[novelty]`` table naming the novelty gate's reference set (``cascade.novelty.reference``) and
its SHA-256. ``apply_calibration`` puts it
into a policy: its thresholds replace the policy's confidence and margin thresholds (the fit
owns the gate), and its temperatures, hashes and snapshot go to ``policy.calibration``.
``check_checkpoints`` refuses weights other than the stamped ones (the gateway calls it at boot).

Temperatures are relative to the probabilities the cheap tier returns (Laya's own checkpoint
temperatures already applied): ``p_i ∝ p_i^(1/T)``, the same as dividing Laya's logits by a
further T. ``gate_view`` is what the confidence gate reads (always tempered when a temperature is
set); ``returned_results`` tempers the answers returned to clients only when
``[calibration] apply = "probabilities"``.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from cascade.calls import QuestionResult
from cascade.policy.model import (
    Calibration,
    ConfidenceHistogram,
    Policy,
    Reference,
    Thresholds,
    TypeBands,
)
from cascade.questions import option_band
from cascade.schema import QuestionType

QTYPES: tuple[QuestionType, ...] = ("choice", "score", "noul")


class CalibrationError(ValueError):
    """An unreadable or invalid calibration file."""


class CalibrationMismatch(SystemExit):
    """The calibration was fitted for other weights than the ones configured."""


class CalibrationStamp(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    checkpoints: dict[str, str]  # {tier name: content hash of its weights}
    items: int  # data items (requests) fitted on
    questions: int  # questions fitted on (those that reached the confidence gate)
    target: Literal["escalation", "accuracy"]
    value: float  # the target: escalation share, or accuracy
    teacher: Literal["gold", "strong"] = "gold"  # strong: shadow rows of a decision log
    min_cell: int = 30  # fewer questions than this in a (type x band): the pooled fit applies
    data: str = ""  # where the data came from (informational)


class CellFit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Diagnostics of one (type x band) fit, as measured on the fitting data."""

    n: int
    pooled: bool  # the cell had too little data: the pooled fit applies
    temperature: float
    threshold: float | None
    escalation: float  # share of the cell's questions below the threshold
    accepted_accuracy: float | None = None  # accuracy of the answers kept (labels needed)
    lower_bound: float | None = None  # one-sided 95 % Clopper-Pearson bound of that accuracy


class CalibrationFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int = 1
    stamp: CalibrationStamp
    thresholds: TypeBands  # confidence thresholds (escalate when max p is below)
    temperatures: TypeBands
    fit: dict[str, CellFit] = msgspec.field(default_factory=dict)  # "choice:3-5" -> diagnostics
    # "choice:3-5" -> the fitted data's gate confidences (cascade.control.drift's reference)
    snapshot: dict[str, ConfidenceHistogram] = msgspec.field(default_factory=dict)
    # the novelty gate's reference set (its file relative to this one), when it was fitted
    novelty: Reference | None = None


def read_calibration(path: str | Path) -> CalibrationFile:
    """Read and check a calibration file; raises ``CalibrationError`` naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CalibrationError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    except OSError as exc:
        raise CalibrationError(f"{path}: not a cascade calibration file ({exc})") from exc
    return parse_calibration(text, str(path))


def parse_calibration(text: str, path: str) -> CalibrationFile:
    """``read_calibration`` of a file's text, named ``path`` in its errors."""
    try:
        cal = msgspec.convert(tomllib.loads(text), CalibrationFile)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise CalibrationError(f"{path}: not a cascade calibration file ({exc})") from exc
    for qtype in QTYPES:
        for band, value in cal.thresholds.of(qtype).items():
            if not 0.0 <= value <= 1.0:
                raise CalibrationError(
                    f"{path}: threshold {qtype} {band} = {value} is outside [0, 1]"
                )
        for band, value in cal.temperatures.of(qtype).items():
            if not (value > 0 and math.isfinite(value)):
                raise CalibrationError(
                    f"{path}: temperature {qtype} {band} = {value} is not a finite number > 0"
                )
    for cell, hist in cal.snapshot.items():
        if problem := histogram_problem(hist):
            raise CalibrationError(f"{path}: snapshot {cell}: {problem}")
    return cal


def histogram_problem(hist: ConfidenceHistogram) -> str | None:
    """What is wrong with a snapshot's histogram, or None."""
    edges = hist.edges
    if not all(map(math.isfinite, edges)) or any(a >= b for a, b in itertools.pairwise(edges)):
        return "edges must be finite and strictly ascending"
    if len(hist.counts) != len(edges) + 1:
        return f"{len(edges)} edges need {len(edges) + 1} counts, not {len(hist.counts)}"
    if any(c < 0 for c in hist.counts):
        return "counts must be >= 0"
    return None


def write_calibration(path: str | Path, cal: CalibrationFile, header: str = "") -> None:
    """Write ``cal`` as TOML (``read_calibration`` reads it back unchanged)."""
    out = [f"# {line}" for line in header.splitlines()]
    out += ["version = 1", "", "[stamp]"]
    stamp = msgspec.to_builtins(cal.stamp)
    checkpoints = stamp.pop("checkpoints")
    out += [f"{key} = {_toml(value)}" for key, value in stamp.items()]
    out += ["", "[stamp.checkpoints]"]
    out += [f"{_toml(tier)} = {_toml(digest)}" for tier, digest in checkpoints.items()]
    for table, typebands in (("thresholds", cal.thresholds), ("temperatures", cal.temperatures)):
        for qtype in QTYPES:
            cells = list(typebands.of(qtype).items())
            if cells:
                out += ["", f"[{table}.{qtype}]"]
                out += [f"{_toml(band)} = {value!r}" for band, value in cells]
    for cell, fit in cal.fit.items():
        out += ["", f"[fit.{_toml(cell)}]"]
        out += [
            f"{k} = {_toml(v)}" for k, v in msgspec.to_builtins(fit).items() if v is not None
        ]  # TOML has no null: an absent key reads back as None
    for cell, hist in cal.snapshot.items():
        out += [
            "",
            f"[snapshot.{_toml(cell)}]",
            f"edges = {hist.edges!r}",
            f"counts = {hist.counts!r}",
        ]
    if cal.novelty is not None:
        out += [
            "",
            "[novelty]",
            f"file = {_toml(cal.novelty.file)}",
            f"sha256 = {_toml(cal.novelty.sha256)}",
        ]
    Path(path).write_text("\n".join(out) + "\n", encoding="utf-8")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()  # a TOML basic string is JSON-compatible
    return repr(value)


def apply_calibration(
    policy: Policy,
    cal: CalibrationFile,
    *,
    file: str,
    apply: Literal["gate", "probabilities"] | None = None,
) -> Policy:
    """``policy`` with ``cal``'s thresholds (confidence; margins cleared) and temperatures."""
    thresholds = msgspec.structs.replace(
        policy.thresholds, confidence=cal.thresholds, margin=Thresholds().margin
    )
    reference = cal.novelty and Reference(
        file=str(Path(file).parent / cal.novelty.file), sha256=cal.novelty.sha256
    )
    calibration = Calibration(
        file=file,
        apply=apply or policy.calibration.apply,
        temperatures=cal.temperatures,
        checkpoints=dict(cal.stamp.checkpoints),
        snapshot=dict(cal.snapshot),
        reference=reference,
    )
    return msgspec.structs.replace(policy, thresholds=thresholds, calibration=calibration)


def weight_mismatches(policy: Policy, found: Mapping[str, str]) -> list[str]:
    """One line per tier whose weights (``found``: {tier: content hash}) are not the stamped
    ones; empty when the calibration fits them."""
    return [
        f"tier `{tier}`: the calibration was made for {want}, the configured weights are {have}"
        for tier, want in policy.calibration.checkpoints.items()
        if (have := found.get(tier)) is not None and have != want
    ]


def check_checkpoints(policy: Policy, found: Mapping[str, str]) -> None:
    """Raise ``CalibrationMismatch`` when a configured tier's weights are not the stamped ones."""
    cal = policy.calibration
    wrong = weight_mismatches(policy, found)
    if wrong:
        raise CalibrationMismatch(
            f"calibration {cal.file} was fitted for other weights; refusing to start:\n  "
            + "\n  ".join(wrong)
            + "\nrefit it with `cascade calibrate` for these weights"
        )


# ---------------------------------------------------------------- temperatures


def temper(probabilities: Sequence[float], temperature: float) -> list[float]:
    """``p_i^(1/T)`` renormalized (computed in log space; zeros stay zero)."""
    if temperature == 1.0:
        return list(probabilities)
    logs = [math.log(p) / temperature if p > 0 else -math.inf for p in probabilities]
    top = max(logs)
    exps = [math.exp(x - top) for x in logs]
    total = sum(exps)
    return [x / total for x in exps]


def temperature_of(policy: Policy, qtype: QuestionType, n_options: int) -> float:
    """The calibration temperature of a (type x band) cell; 1.0 when none is set."""
    value = policy.calibration.temperatures.of(qtype).get(option_band(n_options))
    return 1.0 if value is None else value


def gate_view(policy: Policy, result: QuestionResult) -> QuestionResult:
    """The cheap answer as the confidence gate reads it: tempered by the calibration."""
    t = temperature_of(policy, result.type, len(result.probabilities))
    if t == 1.0:
        return result
    return msgspec.structs.replace(result, probabilities=temper(result.probabilities, t))


def returned_results(
    policy: Policy, results: Mapping[str, QuestionResult], tiers: Mapping[str, str]
) -> dict[str, QuestionResult]:
    """The results returned to clients: the cheap tier's tempered only when the policy's
    ``[calibration] apply = "probabilities"``; otherwise unchanged (answers stay Laya's)."""
    cheap = policy.route.cheap
    if policy.calibration.apply != "probabilities":
        return dict(results)
    return {q: gate_view(policy, r) if tiers.get(q) == cheap else r for q, r in results.items()}


def bands_of(values: Mapping[tuple[str, str], float]) -> TypeBands:
    """A ``TypeBands`` from ``{(type, band): value}``."""
    tables: dict[str, dict[str, float]] = {qtype: {} for qtype in QTYPES}
    for (qtype, band), value in values.items():
        tables[qtype][band] = value
    return msgspec.convert(tables, TypeBands)


def with_calibration_file(
    policy: Policy, path: str | Path, apply: Literal["gate", "probabilities"] | None = None
) -> Policy:
    """``policy`` calibrated by the file at ``path`` (``read_calibration``'s errors)."""
    return apply_calibration(policy, read_calibration(path), file=str(path), apply=apply)
