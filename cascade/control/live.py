"""The live gate of one gateway: the pacer and the refit behind one object the gateway drives.

The gateway asks ``gate()`` for each request's ``Gate`` (``cascade.policy.routing``) and tells
``decided`` each decided request and ``shadowed`` each shadow answer of the strong tier; the
feedback route hands labelled answers to ``observe`` (the ``Learner``). Without ``[control]``
the gate is the policy's own and nothing moves (budget flags of ``escalate=False`` are still
counted). With it, on the injected clock:

- every ``refit_interval_s`` the refit (``cascade.control.refit``) replaces the threshold of
  each cell with enough labels for its accuracy target;
- about once a second the pacer (``cascade.control.pacer``) cuts cells below those thresholds
  where the strong tier's budget or capacity binds, and lifts the cuts when it no longer does.
  With ``prefer = "accuracy"`` cells with a refit are not cut; with ``"budget"`` they are. Either
  way the conflict is logged and counted once each time it starts.

Every change is logged with its evidence (cell, old -> new, labels and bound, or the share and
the aim); ``thresholds()`` and ``strong_share`` are what the gateway's registry exports
(``cascade_gate_threshold``, ``cascade_strong_share``). ``frozen`` (the
policy's, or ``freeze()``) holds every threshold where it is; observations still accrue.
``rebase`` takes a reloaded policy and keeps the observations, except confidences and labels
read under calibration temperatures no longer in force.

With ``scope = "fleet"`` the pacer paces against the fleet's counts (``shared``, handed over by
``cascade.control.fleet``, which also takes this replica's ``tally``) while they are fresh, and
on its own otherwise. Before any history the pacer's cuts are the ``prior``
(``cascade.control.prior``): the fleet's published gate (``adopt``) or the snapshot's. With
the decision store shared as well (``shared_store``: PostgreSQL) the refit is the fleet's
(``cascade.control.fleetrefit``): this replica does not refit on its own labels but adopts the
thresholds one replica fitted on the fleet's (``adopt_refit``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from cascade import metrics
from cascade.calls import EngineAnswer, EngineCall, QuestionResult
from cascade.control.evidence import Labelled
from cascade.control.pacer import BINS, Pace, Pacer
from cascade.control.prior import snapshot_cuts
from cascade.control.refit import Fitted, Refit
from cascade.engines.base import Waiting
from cascade.errors import Overloaded
from cascade.fleet.counters import AnswerTally, Counts
from cascade.policy.calibration import QTYPES, bands_of, gate_view
from cascade.policy.flow import Decision, ShadowCall
from cascade.policy.model import ClefTier, LayaTier, Policy
from cascade.policy.routing import Gate, answer_confidence
from cascade.policy.shadow import compare
from cascade.policy.stats import Cell
from cascade.questions import BANDS, Band, option_band
from cascade.schema import QuestionType
from cascade.settings import ADMISSION_DEADLINE_S

log = logging.getLogger("cascade.control")

CELLS: tuple[tuple[QuestionType, Band], ...] = tuple(
    (t, b) for t in QTYPES for b in BANDS if t != "noul" or b == "2"
)


class LiveControl:
    """See the module docstring. ``engines``: the strong one's predicted wait (``Waiting``) is
    the capacity signal; ``deadline_s``: the gateway's admission deadline it is measured
    against."""

    def __init__(
        self,
        policy: Policy,
        engines: Mapping[str, object] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        deadline_s: float = ADMISSION_DEADLINE_S,
    ) -> None:
        self.clock, self.wall, self.deadline_s = clock, wall, deadline_s
        self.policy = policy
        self._held = False  # freeze()
        self.pacer: Pacer | None = None
        self.refit: Refit | None = None
        self._fitted: dict[Cell, Fitted] = {}
        self._pace = Pace({}, None, None, False, False)
        self._cut_fitted: set[Cell] = set()  # refit cells the budget cuts (prefer = "budget")
        self._target_won = False  # the budget could not be met (prefer = "accuracy")
        self._wait: Callable[[], float] | None = None
        self.strong_share = 0.0  # the last share the pacer measured (``cascade_strong_share``)
        self.tally: AnswerTally | None = None  # scope = "fleet": answered, not synced yet
        self._fleet: Counts | None = None
        self._fleet_at = -math.inf  # when ``_fleet`` was read (clock)
        self.shared_store = False  # the decision store is the fleet's (PostgreSQL)
        self._plan(policy, engines or {}, old=None)()

    # ------------------------------------------------------------ what the gateway asks

    def gate(self, *, escalate: bool = True) -> Gate:
        """The gate for a request now; ``escalate=False``: no confidence escalation at all."""
        self._tick()
        return self._gate if escalate else msgspec.structs.replace(self._gate, escalate=False)

    def decided(self, call: EngineCall, decision: Decision) -> None:
        """What one decided request tells: budget flags (counted), and to the pacer the answers,
        the strong ones, the forced ones (strong without the gate's reading) and the
        confidence of each question that reached the gate (``Decision.gate``)."""
        types = {q: v.type for q, v in call.questions.items()}
        strong = self.policy.route.strong
        n_strong = forced = 0
        gated: list[tuple[Cell, float]] = []
        for qid, route in decision.routes.items():
            if route.reason == "budget":
                metrics.BUDGET_FLAGGED.labels(type=types[qid]).inc()
            hard = route.tier == strong
            n_strong += hard
            read = decision.gate.get(qid)
            if read is not None:
                gated.append((read.cell, read.confidence))
            else:
                forced += hard
        if self.pacer is None:
            return
        now = self.clock()
        if self.tally is not None:
            self.tally.add(now, answered=len(decision.routes), strong=n_strong)
        self.pacer.record(
            now, answered=len(decision.routes), strong=n_strong, forced=forced, gated=gated
        )
        if "strong_overloaded" in decision.degraded.values() or any(
            isinstance(e, Overloaded) for e in decision.refused.values()
        ):
            self.pacer.overloaded(now)

    def shadowed(self, shadow: ShadowCall, strong: EngineAnswer) -> None:
        """A shadow answer of the strong tier: the agreement metrics, and with ``teacher =
        "feedback+shadow"`` the strong tier's verdict on each cheap answer, as labels."""
        found = compare(shadow.cheap, strong)
        for agreement in found.values():
            cell = {"type": agreement.type, "band": agreement.band}
            metrics.SHADOW_TVD.labels(**cell).observe(agreement.tvd)
            if agreement.metric == "top1":
                agree = "true" if agreement.value >= 1.0 else "false"
                metrics.SHADOW_AGREEMENT.labels(**cell, agree=agree).inc()
            else:
                metrics.SHADOW_DELTA.labels(**cell).observe(agreement.value)
        if self.refit is None or self.refit.control.teacher != "feedback+shadow":
            return
        ts, labels = self.wall(), []
        for qid, result in shadow.cheap.results.items():
            if qid in found:
                qtype, band, confidence = self._seen(result)
                labels.append(
                    Labelled(
                        type=qtype,
                        band=band,
                        confidence=confidence,
                        ts=ts,
                        correct=_top(result) == _top(strong.results[qid]),
                        source="shadow",
                    )
                )
        self.observe(labels)

    def observe(self, answers: Sequence[Labelled]) -> None:
        """Labelled cheap answers (the ``Learner`` of ``cascade.control.evidence``)."""
        if self.refit is not None:
            self.refit.observe(answers)

    # ------------------------------------------------------------ what the fleet tells

    def shared(self, counts: Counts) -> None:
        """The fleet's counts, read now (``cascade.control.fleet``)."""
        self._fleet, self._fleet_at = counts, self.clock()
        if counts.answered:
            metrics.FLEET_SHARE.set(counts.strong / counts.answered)

    def adopt(self, cuts: Mapping[Cell, float]) -> None:
        """The fleet's published cuts, as the pacer's prior while it has no history."""
        if self.pacer is not None and not self.pacer.has_history and cuts:
            self.pacer.prior = dict(cuts)

    def published(self) -> dict[Cell, float] | None:
        """The cuts this replica paces with, for replicas without history (None: it has
        none of its own yet)."""
        if self.pacer is None or not self.pacer.has_history:
            return None
        return dict(self._pace.cuts)

    def refits_on_fleet(self) -> bool:
        """Whether the fleet refits for this replica (scope ``fleet``, a Redis URL, a shared
        decision store): its own refit does not run."""
        control = self.policy.control
        return (
            self.shared_store
            and control is not None
            and control.scope == "fleet"
            and control.url is not None
        )

    def adopt_refit(self, fitted: Sequence[Fitted], replica: str) -> None:
        """The fleet's refit, fitted by ``replica``: its cells' thresholds replace every refit
        threshold (a cell it left out keeps its configured one), logged and counted as a refit
        of this replica's own; held while frozen."""
        if self.frozen or self.policy.control is None:
            return
        wanted, before = self._thresholds(), self._fitted
        self._fitted = {f.cell: f for f in fitted}
        for f in fitted:
            self._changed(f, wanted.get(f.cell), f"fleet refit by {replica}")
        for cell in sorted(set(before) - set(self._fitted)):
            metrics.GATE_CHANGES.labels(source="refit").inc()
            log.info(
                "gate %s:%s %.4f -> %s (fleet refit by %s: no fit)",
                *cell,
                before[cell].threshold,
                _fmt(self._configured.get(cell)),
                replica,
            )
        self._publish()

    def pacing_on_fleet(self) -> bool:
        """Whether the last pace read the fleet's counts (fresh: within three syncs)."""
        control = self.policy.control
        return (
            control is not None
            and control.scope == "fleet"
            and self._fleet is not None
            and self.clock() - self._fleet_at <= 3 * control.sync_s
        )

    # ------------------------------------------------------------ what an operator asks

    @property
    def frozen(self) -> bool:
        control = self.policy.control
        return self._held or (control is not None and control.frozen)

    def freeze(self) -> None:
        """Hold every threshold where it is until ``unfreeze`` (the policy may freeze too)."""
        self._held = True
        log.info("gate frozen: thresholds held where they are")

    def unfreeze(self) -> None:
        self._held = False
        log.info("gate unfrozen%s", " (the policy still freezes it)" if self.frozen else "")

    def rebase(self, policy: Policy, engines: Mapping[str, object] | None = None) -> None:
        """Serve ``policy`` (a reload): its thresholds and ``[control]``; the observations stay,
        except confidences and labels read under other calibration temperatures. ``engines``:
        new engines, when the reload brought some."""
        self.prepare(policy, engines)()

    def prepare(
        self, policy: Policy, engines: Mapping[str, object] | None = None
    ) -> Callable[[], None]:
        """``rebase`` in two steps: what ``policy`` needs, computed now from it alone (nothing
        changes; a reload runs this before its swap), and the step that applies it."""
        return self._plan(policy, engines, old=self.policy)

    def _plan(
        self, policy: Policy, engines: Mapping[str, object] | None, old: Policy | None
    ) -> Callable[[], None]:
        control, wait = policy.control, self._wait
        if engines is not None:
            strong = engines.get(policy.route.strong or "")
            wait = strong.expected_wait if isinstance(strong, Waiting) else None
        tier = policy.tiers.get(policy.route.strong or "")
        wait_limit = (
            min(self.deadline_s, tier.timeout_s)
            if isinstance(tier, LayaTier | ClefTier)
            else self.deadline_s
        )
        retempered = old is not None and (
            old.calibration.temperatures != policy.calibration.temperatures
        )
        configured: dict[Cell, float] = {
            (qtype, band): value
            for qtype in QTYPES
            for band, value in policy.thresholds.confidence.of(qtype).items()
        }
        bands_of(configured)  # the gate's thresholds as bands: this policy's must make one
        pacer = refit = tally = None
        if control is not None:
            pacer = self.pacer or Pacer(
                control.max_strong_share, control.window_s, control.capacity
            )
            refit = self.refit or Refit(control)
            if control.scope == "fleet":
                same = self.tally is not None and self.tally.window_s == control.window_s
                tally = self.tally if same else AnswerTally(control.window_s)

        def apply() -> None:
            self.policy, self._wait, self._wait_limit = policy, wait, wait_limit
            self.pacer, self.refit, self.tally = pacer, refit, tally
            if control is not None:
                assert pacer is not None and refit is not None
                pacer.budget, pacer.window_s = control.max_strong_share, control.window_s
                pacer.capacity = control.capacity
                refit.control = control
                if retempered:
                    pacer.forget_samples()
                    refit.forget()
            self._fitted = {} if retempered or control is None else self._fitted
            self._configured = configured
            if pacer is not None and control is not None and not pacer.has_history:
                budget = control.max_strong_share
                pacer.prior = (
                    {}
                    if budget is None
                    else snapshot_cuts(policy.calibration.snapshot, self._thresholds(), budget)
                )
            self._next_refit = -math.inf  # refit at the next request
            self._next_pace = -math.inf
            self._pace = Pace({}, self._pace.share, None, False, False)
            self._publish()

        return apply

    def status(self) -> dict[str, Any]:
        """For an admin view: what the gate applies now and why."""
        pace = self._pace
        control = self.policy.control
        return {
            "scope": control.scope if control is not None else None,
            "pacing": "fleet" if self.pacing_on_fleet() else "replica",
            "frozen": self.frozen,
            "strong_share": pace.share,
            "aim": pace.aim,
            "capacity_binds": pace.capped,
            "thresholds": {f"{t}:{b}": live for (t, b), live in self.thresholds().items()},
            "refit": {
                f"{f.cell[0]}:{f.cell[1]}": {
                    "threshold": f.threshold,
                    "n": f.n,
                    "bound": f.bound,
                    "source": f.sources,
                }
                for f in self._fitted.values()
            },
        }

    def thresholds(self) -> dict[Cell, float]:
        """The threshold the gate applies now in each cell that has one
        (``cascade_gate_threshold``)."""
        return {(t, b): live for t, b in CELLS if (live := self._gate.live(t, b)) is not None}

    # ------------------------------------------------------------ the schedule

    def _tick(self) -> None:
        control = self.policy.control
        if control is None or self.frozen:
            return
        now = self.clock()
        if now >= self._next_refit:
            self._next_refit = now + control.refit_interval_s
            if self.refit is not None and not self.refits_on_fleet():
                self._refit()
        if now >= self._next_pace and self.pacer is not None:
            self._next_pace = now + control.window_s / BINS
            self._repace(now)

    def _thresholds(self) -> dict[Cell, float]:
        """What each cell wants without the budget: the configured threshold, or the refit."""
        return {**self._configured, **{c: f.threshold for c, f in self._fitted.items()}}

    def _refit(self) -> None:
        assert self.refit is not None
        wanted = self._thresholds()
        for fitted in self.refit.fit():
            self._fitted[fitted.cell] = fitted
            self._changed(fitted, wanted.get(fitted.cell), "refit")
        self._publish()

    def _changed(self, fitted: Fitted, before: float | None, why: str) -> None:
        """Log and count a refit that moves its cell's threshold."""
        if before is not None and abs(before - fitted.threshold) <= 1e-9:
            return
        control = self.policy.control
        assert control is not None
        metrics.GATE_CHANGES.labels(source="refit").inc()
        log.info(
            "gate %s:%s %s -> %.4f (%s: n=%d kept=%d bound=%.4f target=%s pooled=%s source=%s)",
            *fitted.cell,
            _fmt(before),
            fitted.threshold,
            why,
            fitted.n,
            fitted.kept,
            fitted.bound,
            control.target(fitted.cell[0]),
            fitted.pooled,
            fitted.sources,
        )

    def _repace(self, now: float) -> None:
        assert self.pacer is not None and self.policy.control is not None
        control = self.policy.control
        wanted = self._thresholds()
        protected = set(self._fitted) if control.prefer == "accuracy" else set()
        wait = self._wait() if self._wait is not None else None
        pace = self.pacer.pace(
            now,
            wanted,
            protected=protected,
            pressure=None if wait is None else wait / self._wait_limit,
            fleet=self._fleet if self.pacing_on_fleet() else None,
        )
        before, self._pace = self._pace, pace
        for cell in sorted(set(before.cuts) | set(pace.cuts)):
            old = before.cuts.get(cell, wanted.get(cell))
            new = pace.cuts.get(cell, wanted.get(cell))
            why = (
                f"budget: share {_fmt(pace.share)} of {_fmt(control.max_strong_share)} over "
                f"{control.window_s:g} s, aim {_fmt(pace.aim)}, capacity binds: {pace.capped}"
            )
            if (cell in before.cuts) != (cell in pace.cuts):
                metrics.GATE_CHANGES.labels(source="budget").inc()
                log.info(
                    "gate %s:%s %s -> %s (%s; %s)",
                    *cell,
                    _fmt(old),
                    _fmt(new),
                    why,
                    "binds" if cell in pace.cuts else "relaxed",
                )
            elif old != new:
                log.debug("gate %s:%s %s -> %s (%s)", *cell, _fmt(old), _fmt(new), why)
        self._conflict(pace, protected)
        if pace.share is not None:
            self.strong_share = pace.share
        self._publish()

    def _conflict(self, pace: Pace, protected: set[Cell]) -> None:
        """Count and log a conflict between the budget and the target when it starts."""
        if pace.conflict and not self._target_won:  # prefer = "accuracy": refit cells kept
            metrics.CONTROL_CONFLICTS.labels(winner="accuracy").inc()
            log.warning(
                "gate: the accuracy target wins over the budget (share %s, aim %s): "
                "cells %s keep their refit thresholds",
                _fmt(pace.share),
                _fmt(pace.aim),
                ", ".join(f"{t}:{b}" for t, b in sorted(protected)),
            )
        self._target_won = pace.conflict
        cut = {
            c for c, v in pace.cuts.items() if c in self._fitted and v < self._fitted[c].threshold
        }
        for cell in sorted(cut - self._cut_fitted):
            metrics.CONTROL_CONFLICTS.labels(winner="budget").inc()
            log.warning(
                "gate %s:%s: the budget wins over the accuracy target: cut to %.4f under "
                'its refit %.4f (prefer = "budget")',
                *cell,
                pace.cuts[cell],
                self._fitted[cell].threshold,
            )
        self._cut_fitted = cut

    def _publish(self) -> None:
        """Build the gate from the thresholds and cuts."""
        wanted = self._thresholds()
        margin = self.policy.thresholds.margin
        self._gate = Gate(
            confidence=bands_of(wanted), margin=margin, budget=bands_of(self._pace.cuts)
        )

    def _seen(self, result: QuestionResult) -> tuple[QuestionType, Band, float]:
        """A cheap answer's cell (type, band) and the confidence the gate read."""
        seen = gate_view(self.policy, result)
        return result.type, option_band(len(seen.probabilities)), answer_confidence(seen)


def _top(result: QuestionResult) -> int:
    p = result.probabilities
    return p.index(max(p))


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"
