"""Flip reports: what the int8 export of a checkpoint changes on a user's own requests.

``cascade export laya DIR --precision int8 --check DATA.jsonl`` (``cascade.eval.flips``) runs
the fp32 and the int8 export on the same requests and writes one as JSON, stamped with both
models' hashes: the checkpoint's content hash (what the fp32 export is made from) and the
sha256 of the int8 model file. By default it lies next to the int8 export
(``<int8 export>/flip-report.json``); a policy can name another (``[tiers.laya] flip_report``).
The gateway serves int8 only with a report for the same two hashes whose flip rate is within
the tier's ``max_flip_rate`` (``cascade.policy.precision``).

A flip is a question whose answer (the argmax, caller's order) differs between the two.
"""

from __future__ import annotations

from pathlib import Path

import msgspec


class FlipReportError(ValueError):
    """An unreadable or invalid flip report."""


class FlipCell(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One (question type x option band) cell."""

    questions: int
    flips: int
    max_dp: float  # largest |Δp| of any option of any question in the cell


class Accuracy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Accuracy of each precision on the questions with a gold label."""

    labelled: int
    fp32: float
    int8: float


class Speed(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Rows per second of each precision on the data, ``clients`` concurrent requests."""

    clients: int
    threads: int
    fp32_rows_per_s: float
    int8_rows_per_s: float
    speedup: float


class FlipGate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The flips seen through the policy's confidence gate (its thresholds, calibration
    temperatures included). ``applied`` is false when the policy has no strong tier."""

    policy: str  # the policy file, or "default"
    policy_hash: str
    applied: bool
    decisions_changed: int  # questions one precision escalates and the other keeps
    flips_served: int  # flipped answers the int8 gate keeps: the changes clients would see
    flips_escalated: int  # flipped answers the int8 gate escalates to the strong tier


class FlipReport(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int = 1
    checkpoint: str  # the checkpoint directory checked (informational)
    fp32_hash: str  # content hash of the checkpoint's weights
    int8_hash: str  # sha256 of the int8 model file
    recipe: str  # cascade.laya.int8.recipe_id()
    data: str  # where the requests came from
    items: int  # requests run
    questions: int  # questions answered by both
    skipped: int  # requests the cheap tier could not answer (left out)
    flips: int
    flip_rate: float  # flips / questions
    max_flip_rate: float  # the bound this report was checked against
    passed: bool
    max_dp: float
    cells: dict[str, FlipCell]  # "choice:3-5" -> cell
    accuracy: Accuracy | None  # None: no gold labels in the data
    speed: Speed
    gate: FlipGate


def write_report(path: Path, report: FlipReport) -> None:
    """Write ``report`` as indented JSON (``read_report`` reads it back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=2) + b"\n")


def read_report(path: Path) -> FlipReport:
    """Read a flip report; ``FlipReportError`` names the file."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=FlipReport)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FlipReportError(f"{path}: not a cascade flip report ({exc})") from exc
