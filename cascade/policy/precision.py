"""The flip gate: a Laya tier serves int8 only with a passing flip report for its weights.

``[tiers.laya] precision = "int8"`` asks for the int8 export (``cascade.laya.int8``). At boot
``check_precision`` finds, per checkpoint, the int8 export in the cache and its flip report
(``flip_report``, else ``flip-report.json`` next to the export) and refuses to start
(``FlipGateRefused``, naming both hashes) unless the report is stamped with this checkpoint's
content hash and this int8 model's sha256 and its flip rate is at most the tier's
``max_flip_rate``: the same refusal as a calibration fitted for other weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from cascade.laya.export import MODEL_FILE
from cascade.laya.flip_report import FlipReportError, read_report
from cascade.laya.int8 import REPORT_FILE, cached_int8, model_hash
from cascade.policy.model import LayaTier, Policy


class FlipGateRefused(SystemExit):
    """int8 was asked for without a passing flip report made for these weights."""


def report_path(tier: LayaTier, export_dir: Path) -> Path:
    """Where the tier's flip report for the int8 export in ``export_dir`` is read from."""
    return Path(tier.flip_report) if tier.flip_report else export_dir / REPORT_FILE


def check_precision(
    policy: Policy,
    resolve: Callable[[str], Path],
    hashes: Mapping[str, Mapping[str, str]],
    cache: Path | None = None,
) -> None:
    """Raise ``FlipGateRefused`` unless every int8 checkpoint has a passing report for its
    weights. ``resolve`` turns a checkpoint reference into its directory; ``hashes`` holds the
    content hash of each checkpoint by tier and checkpoint name."""
    wrong: list[str] = []
    for name, tier in policy.tiers.items():
        if not isinstance(tier, LayaTier) or tier.precision != "int8":
            continue
        for ck, ref in tier.checkpoints.named().items():
            problem = _problem(tier, resolve(ref), hashes[name][ck], cache)
            if problem:
                wrong.append(f"tier `{name}` checkpoint `{ck}` ({ref}): {problem}")
    if wrong:
        raise FlipGateRefused(
            "int8 needs a passing flip report for the served weights; refusing to start:\n  "
            + "\n  ".join(wrong)
            + "\nrun `cascade export laya CHECKPOINT --precision int8 "
            "--check DATA.jsonl` (your own requests) for these weights, or serve "
            'precision = "fp32"'
        )


def _problem(tier: LayaTier, path: Path, digest: str, cache: Path | None) -> str | None:
    export_dir = cached_int8(path, cache, digest)
    if export_dir is None:
        return f"no int8 export of fp32 {digest} in the cache"
    have = model_hash(export_dir / MODEL_FILE)
    where = report_path(tier, export_dir)
    if not where.exists():
        return f"no flip report at {where} (fp32 {digest}, int8 {have})"
    try:
        report = read_report(where)
    except FlipReportError as exc:
        return str(exc)
    if report.questions == 0:
        return f"flip report {where} checked no question"
    if (report.fp32_hash, report.int8_hash) != (digest, have):
        return (
            f"flip report {where} was made for fp32 {report.fp32_hash} / int8 "
            f"{report.int8_hash}, the configured weights are fp32 {digest} / int8 {have}"
        )
    if report.flip_rate > tier.max_flip_rate:
        return (
            f"flip report {where} (fp32 {digest}, int8 {have}) changed {report.flips} of "
            f"{report.questions} answers: flip rate {report.flip_rate:.4f} is above "
            f"max_flip_rate {tier.max_flip_rate}"
        )
    return None
