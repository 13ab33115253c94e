"""The budget pacer: how far each cell's confidence threshold must come down for the strong tier
to stay within its share of the answers and within its capacity.

Sans-IO: every method takes ``now`` (seconds on one monotonic clock); ``cascade.control.live``
feeds it each decided request and asks it for the cuts about once a second. Design:

- **What it holds.** The realised strong share: questions the strong tier answered over the
  questions answered, in the last ``window_s``, kept in 300 bins. Strong answers split into
  *forced* ones (pre-routed: images, long states, too many options; truncation; the cheap tier
  failing) that no threshold can avoid, and *gated* ones the confidence gate escalated.
- **Feed-forward from the allowance.** Looking one horizon ahead (a tenth of the window), the
  answers expected (the recent rate) and the bins that will have left the window by then give
  the strong answers the window can still take: ``aim = (B (N - out + new) - (S - s_out)) /
  new``, B a quarter of a point under the budget. Over budget, it aims under B until the window
  recovers; under budget, it may spend the saving. The share of the recent answers forced
  strong is subtracted, and what is left, over the recent share of gated questions, is the
  escalation rate the gate may have.
- **Water-filling over cells.** Each cell keeps its last 1000 gated confidences, so its
  escalation rate at any threshold is known. One common rate ``e*`` is found such that every
  cell escalating ``min(its rate at its own threshold, e*)`` (weighted by its share of the
  recent gated traffic) spends exactly the allowance; a cell over ``e*`` gets the cut at its
  ``e*`` quantile: only its least confident questions escalate. Cuts never rise above a cell's
  threshold; ``protected`` cells (an accuracy target that wins over the budget) are never cut,
  and when the others cannot absorb the allowance the result says so (a conflict).
- **Capacity (AIMD).** When the strong tier's predicted queue wait (``pressure``: the wait over
  the admission deadline) passes a half, or it answers with overload, a cap on the recent
  strong share is set to 0.7 of the share then (at most once per 2 s, so one burst of
  refusals is one step); below a quarter and with no overload, the cap rises two points a
  second and is lifted at 100 %. The aim is the lower of the budget's and the cap.
- **The fleet's counts.** Given ``fleet`` (``cascade.fleet.counters.Counts``: every replica's
  answers over the window), the allowance and the aim are the fleet's: each replica cuts its
  own cells so that its recent traffic escalates at the fleet's aim, and a replica whose
  traffic is forced strong beyond the budget is made up for by the others.
- **Before any history.** Until it has ``MIN_RECENT`` recent answers of its own, a pacer with
  a budget applies ``prior``: cuts from the fleet's published gate, or from the calibration
  snapshot's confidences (``cascade.control.prior``), never none.
- **Relaxing.** When the allowance covers what the thresholds escalate on their own (easier
  traffic, less of it forced, the window back under budget, capacity back), there are no cuts:
  the gate is the configured one again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from cascade.fleet.counters import Counts
from cascade.policy.stats import Cell, quantile_threshold

BINS = 300  # per window
HORIZON = 0.1  # of the window: the look-ahead, and what "recent" traffic is
GUARD = 0.0025  # aim this far under the budget
MIN_RECENT = 20  # fewer recent answers than this: too little traffic to pace on
SAMPLES = 1000  # gated confidences kept per cell
CAP_DOWN, CAP_EVERY_S, CAP_UP_PER_S = 0.7, 2.0, 0.02
HOT, COOL = 0.5, 0.25  # of the admission deadline: tighten above, relax below


@dataclass
class _Bin:
    start: float
    answered: int = 0
    strong: int = 0
    forced: int = 0
    gated: int = 0


@dataclass(frozen=True)
class Pace:
    """The pacer's verdict: ``cuts`` per binding cell (absent: its threshold stands)."""

    cuts: dict[Cell, float]
    share: float | None  # the realised strong share of the window (None: nothing answered)
    aim: float | None  # the strong share it aims the recent traffic at (None: unbounded)
    capped: bool  # the strong tier's capacity binds
    conflict: bool  # protected cells had to escalate more than the allowance left them


@dataclass
class Pacer:
    budget: float | None  # max_strong_share; None: capacity only
    window_s: float
    capacity: bool = True
    _bins: deque[_Bin] = field(default_factory=deque)
    _samples: dict[Cell, deque[tuple[float, float]]] = field(default_factory=dict)
    _started: float | None = None
    _cap: float | None = None
    _cap_moved: float = -math.inf
    _overloads: int = 0
    _last: float | None = None
    prior: dict[Cell, float] = field(default_factory=dict)  # cuts before any history
    _paced: bool = False  # had MIN_RECENT recent answers once

    def record(
        self,
        now: float,
        *,
        answered: int,
        strong: int,
        forced: int,
        gated: Sequence[tuple[Cell, float]],
    ) -> None:
        """One decided request: its answered questions, how many the strong tier answered and
        how many of those were forced there, and each gated question's cell and confidence."""
        if self._started is None:
            self._started = now
        width = self.window_s / BINS
        if not self._bins or now >= self._bins[-1].start + width:
            self._bins.append(_Bin(start=now - (now % width)))
        last = self._bins[-1]
        last.answered += answered
        last.strong += strong
        last.forced += forced
        last.gated += len(gated)
        for cell, confidence in gated:
            self._samples.setdefault(cell, deque(maxlen=SAMPLES)).append((now, confidence))

    @property
    def has_history(self) -> bool:
        """Whether it has paced on answers of its own (the ``prior`` no longer applies)."""
        return self._paced

    def overloaded(self, now: float) -> None:
        """The strong tier refused work for overload."""
        self._overloads += 1

    def forget_samples(self) -> None:
        """Drop the gated confidences (read on temperatures no longer in force)."""
        self._samples.clear()

    def pace(
        self,
        now: float,
        thresholds: Mapping[Cell, float],
        *,
        protected: Collection[Cell] = (),
        pressure: float | None = None,
        fleet: Counts | None = None,
    ) -> Pace:
        """The cuts now, for cells escalating below ``thresholds``; ``pressure``: the strong
        tier's predicted wait over its admission deadline (None: it predicts none); ``fleet``:
        every replica's counts, to pace against instead of this one's."""
        self._evict(now)
        window = list(self._bins)
        horizon = self.window_s * HORIZON
        recent = [b for b in window if b.start > now - horizon]
        n_r = sum(b.answered for b in recent)
        counts = fleet or self._counts(now, window, recent)
        # what the cut goes on: the recent traffic, or the window's when that is too little
        basis, since = (
            (recent, now - horizon) if n_r >= MIN_RECENT else (window, now - self.window_s)
        )
        n_b = sum(b.answered for b in basis)
        self._paced = self._paced or n_b >= MIN_RECENT
        share = counts.strong / counts.answered if counts.answered else None
        self._capacity(now, recent, pressure)
        aims = [self._cap] if self._cap is not None else []
        if self.budget is not None and counts.recent >= MIN_RECENT and counts.span > 0:
            new = counts.recent * horizon / counts.span
            allowed = (self.budget - GUARD) * (counts.answered - counts.leaving_answered + new) - (
                counts.strong - counts.leaving_strong
            )
            aims.append(min(1.0, max(0.0, allowed / new)))
        aim = min(aims) if aims else None
        gated = sum(b.gated for b in basis)
        if not self._paced and self.budget is not None:
            cuts = {
                c: min(v, thresholds[c])
                for c, v in self.prior.items()
                if c in thresholds and c not in protected
            }
            return Pace(cuts, share, aim, self._cap is not None, False)
        if aim is None or n_b < MIN_RECENT or not gated:
            return Pace({}, share, aim, self._cap is not None, False)
        forced = sum(b.forced for b in basis)
        rate = max(0.0, (aim * n_b - forced) / gated)
        cuts, conflict = self._fill(since, thresholds, protected, rate)
        return Pace(cuts, share, aim, self._cap is not None, conflict)

    def _counts(self, now: float, window: list[_Bin], recent: list[_Bin]) -> Counts:
        """This replica's own counts, as the fleet's read (``recent``: the whole window's when
        the last horizon has too few answers to give a rate)."""
        horizon = self.window_s * HORIZON
        leaving = [b for b in window if b.start < now - self.window_s + horizon]
        reach = horizon
        if sum(b.answered for b in recent) < MIN_RECENT:
            recent, reach = window, self.window_s
        span = min(reach, now - (self._started if self._started is not None else now))
        return Counts(
            sum(b.answered for b in window),
            sum(b.strong for b in window),
            sum(b.answered for b in leaving),
            sum(b.strong for b in leaving),
            sum(b.answered for b in recent),
            span,
        )

    def _evict(self, now: float) -> None:
        width = self.window_s / BINS
        while self._bins and self._bins[0].start + width <= now - self.window_s:
            self._bins.popleft()
        for samples in self._samples.values():
            while samples and samples[0][0] <= now - self.window_s:
                samples.popleft()

    def _capacity(self, now: float, recent: list[_Bin], pressure: float | None) -> None:
        """AIMD on the recent strong share when the strong tier runs hot (module docstring)."""
        elapsed = 0.0 if self._last is None else now - self._last
        self._last = now
        hot = self._overloads > 0 or (pressure is not None and pressure >= HOT)
        self._overloads = 0
        if not self.capacity:
            return
        if hot and now - self._cap_moved >= CAP_EVERY_S:
            answered = sum(b.answered for b in recent)
            base = (
                self._cap
                if self._cap is not None
                else (sum(b.strong for b in recent) / answered if answered else 1.0)
            )
            self._cap, self._cap_moved = base * CAP_DOWN, now
        elif not hot and self._cap is not None and (pressure is None or pressure <= COOL):
            self._cap += CAP_UP_PER_S * elapsed
            if self._cap >= 1.0:
                self._cap = None

    def _fill(
        self,
        since: float,
        thresholds: Mapping[Cell, float],
        protected: Collection[Cell],
        rate: float,
    ) -> tuple[dict[Cell, float], bool]:
        """Water-filling over the recent gated traffic (``water_fill``)."""
        weight = {
            cell: sum(1 for t, _ in samples if t > since) for cell, samples in self._samples.items()
        }
        confs = {cell: [c for _, c in samples] for cell, samples in self._samples.items()}
        return water_fill(confs, weight, thresholds, protected, rate)


def water_fill(
    confs: Mapping[Cell, Sequence[float]],
    weight: Mapping[Cell, int],
    thresholds: Mapping[Cell, float],
    protected: Collection[Cell],
    rate: float,
) -> tuple[dict[Cell, float], bool]:
    """The cuts that make the gated escalation rate ``rate``, cells weighted by ``weight`` and
    each escalating as its ``confs`` do (module docstring), and whether ``protected`` cells
    alone escalate more than that."""
    wants: dict[Cell, float] = {}  # each cell's escalation rate at its own threshold
    for cell, seen in confs.items():
        threshold = thresholds.get(cell)
        if threshold is None or not seen or not weight.get(cell):
            continue
        wants[cell] = sum(c < threshold for c in seen) / len(seen)
    total = sum(weight.values())
    if not total:
        return {}, False
    fixed = sum(weight[c] * wants[c] for c in wants if c in protected) / total
    movable = {c: w for c, w in wants.items() if c not in protected}

    def spend(level: float) -> float:
        return fixed + sum(weight[c] * min(w, level) for c, w in movable.items()) / total

    if spend(1.0) <= rate:
        return {}, False
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spend(mid) < rate else (lo, mid)
    cuts = {
        c: min(thresholds[c], quantile_threshold(confs[c], lo))
        for c, w in movable.items()
        if w > lo
    }
    return cuts, fixed > rate and bool(protected)
