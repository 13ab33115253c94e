"""The novelty gate: a cheap answer whose row is unlike the calibration data escalates
(``novel``), whatever its confidence.

Pure functions of the policy, the loaded reference set (``cascade.novelty.reference``) and the
cheap answer's per-question vectors. A question is judged when it was answered by the cheap
tier with a vector and its cell (checkpoint x type x band) has a reference; its score is its
novelty over the cell's threshold (above 1: novel). A question the post-rules already escalated
keeps its reason; one the live budget kept (``budget``) or none escalated goes ``novel``. The
budget cuts ``novel`` as it cuts a low confidence only with ``[novelty] budgeted = true``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from cascade.calls import EngineAnswer, QuestionResult
from cascade.novelty.reference import ReferenceError, ReferenceSet, cell_of, load
from cascade.policy.calibration import CalibrationError, CalibrationMismatch, gate_view
from cascade.policy.model import Policy
from cascade.policy.routing import Gate, PreRoute, Reason, answer_confidence
from cascade.questions import option_band

log = logging.getLogger("cascade")


def judge(
    policy: Policy,
    reference: ReferenceSet | None,
    gate: Gate,
    pre: PreRoute,
    cheap: EngineAnswer,
    gated: Mapping[str, Reason],
) -> tuple[dict[str, Reason], dict[str, float]]:
    """The escalations the gate adds (``novel``, or ``budget`` where a budgeted gate is cut) and
    each judged question's score (novelty / threshold)."""
    route = policy.route
    if (
        reference is None
        or not policy.novelty.enabled
        or pre.mode != "cascade"
        or route.strong is None
    ):
        return {}, {}
    escalated: dict[str, Reason] = {}
    scores: dict[str, float] = {}
    for qid, r in pre.questions.items():
        result = cheap.results.get(qid)
        if r.tier != route.cheap or result is None or result.vector is None:
            continue
        cell = cell_of(pre.cheap_checkpoint, result.type, option_band(len(result.probabilities)))
        distance = reference.novelty(cell, result.vector)
        threshold = reference.thresholds.get(cell)
        if distance is None or threshold is None:
            continue
        scores[qid] = distance / threshold if threshold > 0 else float("inf")
        if scores[qid] > 1 and gated.get(qid, "budget") == "budget":
            escalated[qid] = _cut(policy, gate, result) if policy.novelty.budgeted else "novel"
    return escalated, scores


def _cut(policy: Policy, gate: Gate, result: QuestionResult) -> Reason:
    """``novel``, or ``budget`` where the gate's budget cut keeps the answer."""
    confidence = answer_confidence(gate_view(policy, result))
    cut = gate.budget.of(result.type).get(option_band(len(result.probabilities)))
    if not gate.escalate or (cut is not None and confidence >= cut):
        return "budget"
    return "novel"


def load_reference(policy: Policy) -> ReferenceSet | None:
    """The policy's reference set (None: the gate is off, or its calibration has none).
    Raises ``CalibrationError`` for an unreadable or altered file."""
    ref = policy.calibration.reference
    if ref is None or not policy.novelty.enabled:
        return None
    try:
        return load(Path(ref.file), ref.sha256)
    except ReferenceError as exc:
        raise CalibrationError(str(exc)) from exc


def check_reference(
    policy: Policy, reference: ReferenceSet | None, found: Mapping[str, str]
) -> None:
    """Raise ``CalibrationMismatch`` (both hashes) when ``reference`` was made with other cheap
    weights than ``found``'s; log which cells the gate covers."""
    cheap = policy.route.cheap
    if reference is None:
        if policy.novelty.enabled and policy.calibration.file and cheap is not None:
            log.warning(
                "novelty gate off: calibration %s has no reference set (refit it with "
                "`cascade calibrate` on a Laya tier)",
                policy.calibration.file,
            )
        return
    have = found.get(cheap or "")
    if have is not None and have != reference.weights:
        file = policy.calibration.reference.file if policy.calibration.reference else ""
        raise CalibrationMismatch(
            f"novelty reference set {file} was made for {reference.weights}, the configured "
            f"weights of tier `{cheap}` are {have}; refusing to start\nrefit it with `cascade "
            "calibrate` for these weights"
        )
    log.info(
        "novelty gate on for %d cells (%d bytes of reference vectors): %s",
        len(reference.cells),
        reference.nbytes,
        ", ".join(sorted(reference.cells)),
    )
