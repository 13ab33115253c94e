"""Drift of the cheap tier's confidences, without labels: the population stability index.

Per (question type x option band) cell, the confidences the gate reads (max p, the calibration's
temperature applied) of the questions that reach the confidence gate are counted over the last
``window_s`` and compared with a reference: the calibration file's ``[snapshot]`` (the fitted
data's confidences, ``cascade calibrate`` writes it) when the policy has one, else the first
``reference_s`` after boot. Both are binned on the reference's edges, ``bins`` equal-count bins
of its confidences (``histogram``), and

    PSI = sum over bins of (w_i - r_i) * ln(w_i / r_i)

with ``w`` and ``r`` the window's and the reference's shares, each bin's count plus 0.5 (an
empty bin never makes it infinite). The usual reading: under 0.1 stable, 0.1 to 0.25 a moderate
shift, over 0.25 a large one (``CascadeConfidenceDrift`` alerts there). Sampling alone gives
about ``(bins - 1) * (1/n_window + 1/n_reference)`` when nothing moved, 0.06 at 10 bins and 300
questions on each side: a cell with fewer than ``min_count`` questions in either has no PSI.

The window is ``SLICES`` slices of ``window_s / SLICES`` each (memory bounded by cells x slices
x bins, whatever the traffic): it covers the last ``window_s`` to within one slice. A boot
reference keeps a uniform sample (reservoir) of at most ``RESERVOIR`` confidences per cell
until it closes (``reference_s`` after boot, later for a cell still short of ``min_count``);
the window counts only what came after it. Sans-IO: the gateway feeds ``observe`` each decided
request; ``psi`` is read at scrape time; time comes from the injected clock.
"""

from __future__ import annotations

import bisect
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence

from cascade.policy.calibration import gate_view
from cascade.policy.flow import Decision
from cascade.policy.model import Drift, Histogram, Policy
from cascade.policy.stats import Cell
from cascade.questions import option_band

SLICES = 12
RESERVOIR = 20_000
SMOOTHING = 0.5  # added to every bin's count before taking shares
# Post-rule signals that escalate whatever the confidence: those questions never reach the gate.
SIGNALS = frozenset({"truncated", "options_collapsed"})


def cell_key(cell: Cell) -> str:
    """The calibration file's name of a cell: ``choice:3-5``."""
    return f"{cell[0]}:{cell[1]}"


def histogram(values: Sequence[float], bins: int) -> Histogram:
    """``values`` counted on ``bins`` equal-count bins of their own (edges midway between
    neighbouring values; ties merge bins, so a sample with few distinct values has fewer)."""
    ordered = sorted(values)
    n = len(ordered)
    edges: list[float] = []
    for i in range(1, bins):
        k = round(i * n / bins)
        if 0 < k < n:
            edge = (ordered[k - 1] + ordered[k]) / 2
            if ordered[k - 1] < ordered[k] and (not edges or edge > edges[-1]):
                edges.append(edge)
    return Histogram(edges=edges, counts=counted(edges, ordered))


def counted(edges: Sequence[float], values: Sequence[float]) -> list[int]:
    """How many of ``values`` fall in each bin of ``edges`` (see ``Histogram``)."""
    counts = [0] * (len(edges) + 1)
    for value in values:
        counts[bisect.bisect_right(edges, value)] += 1
    return counts


def psi(reference: Sequence[int], window: Sequence[int]) -> float:
    """The population stability index of ``window``'s counts against ``reference``'s."""
    k = len(reference)
    r_total, w_total = sum(reference) + SMOOTHING * k, sum(window) + SMOOTHING * k
    total = 0.0
    for r, w in zip(reference, window, strict=True):
        r_share, w_share = (r + SMOOTHING) / r_total, (w + SMOOTHING) / w_total
        total += (w_share - r_share) * math.log(w_share / r_share)
    return total


def gated(policy: Policy, decision: Decision) -> Iterator[tuple[Cell, float]]:
    """The gate confidences of ``decision``'s questions that reached the confidence gate: the
    cascade pre-routed them cheap, the cheap tier answered, and no signal (truncation, option
    collapse) escalated them regardless of confidence."""
    cheap = policy.route.cheap
    answer = decision.answers.get(cheap) if cheap is not None else None
    if answer is None or decision.pre.mode != "cascade":
        return
    for qid, route in decision.pre.questions.items():
        result = answer.results.get(qid)
        if route.tier != cheap or result is None or decision.escalated.get(qid) in SIGNALS:
            continue
        view = gate_view(policy, result)
        yield (view.type, option_band(len(view.probabilities))), max(view.probabilities)


class _Cell:
    """One cell's reference (a histogram, or a boot sample still filling) and its window."""

    def __init__(self, reference: Histogram | None) -> None:
        self.reference = reference
        self.sample: list[float] = []
        self.seen = 0  # confidences offered to the sample
        self.slices: dict[int, list[int]] = {}  # slice number -> counts on the reference's edges

    def window(self, current: int) -> list[int] | None:
        """The counts of the slices still in the window (None before the reference closed)."""
        if self.reference is None:
            return None
        for old in [s for s in self.slices if s <= current - SLICES]:
            del self.slices[old]
        counts = [0] * len(self.reference.counts)
        for part in self.slices.values():
            counts = [a + b for a, b in zip(counts, part, strict=True)]
        return counts


class DriftMonitor:
    """PSI per cell of one policy's cheap tier (see the module docstring).

    ``observe`` takes the policy in force: when its ``[drift]`` table or its calibration
    snapshot changes (a reload), the references and windows start over."""

    def __init__(self, policy: Policy, *, clock: Callable[[], float] = time.monotonic,
                 seed: int = 0) -> None:
        self.clock = clock
        self._rng = random.Random(seed)
        self._reset(policy)

    def _reset(self, policy: Policy) -> None:
        self.config: Drift = policy.drift
        self.snapshot = policy.calibration.snapshot
        self.started = self.clock()
        self.cells: dict[Cell, _Cell] = {}

    def _cell(self, cell: Cell) -> _Cell:
        found = self.cells.get(cell)
        if found is None:
            fitted = self.snapshot.get(cell_key(cell))
            usable = (self.config.reference == "calibration" and fitted is not None
                      and sum(fitted.counts) >= self.config.min_count)
            found = self.cells[cell] = _Cell(fitted if usable else None)
        return found

    def observe(self, policy: Policy, decision: Decision) -> None:
        """Count the confidences of one decided request's gated questions."""
        if policy.drift != self.config or policy.calibration.snapshot != self.snapshot:
            self._reset(policy)
        for cell, confidence in gated(policy, decision):
            self.add(cell, confidence)

    def add(self, cell: Cell, confidence: float) -> None:
        """Count one gate confidence of ``cell`` now."""
        now, state = self.clock(), self._cell(cell)
        if state.reference is None:
            self._sample(state, confidence)
            if (now - self.started >= self.config.reference_s
                    and state.seen >= self.config.min_count):
                state.reference = histogram(state.sample, self.config.bins)
                state.sample = []
            return
        current = self._slice(now)
        counts = state.slices.setdefault(current, [0] * len(state.reference.counts))
        counts[bisect.bisect_right(state.reference.edges, confidence)] += 1

    def _sample(self, state: _Cell, confidence: float) -> None:
        """Keep a uniform sample of the boot reference's confidences (Algorithm R)."""
        state.seen += 1
        if len(state.sample) < RESERVOIR:
            state.sample.append(confidence)
        else:
            slot = self._rng.randrange(state.seen)
            if slot < RESERVOIR:
                state.sample[slot] = confidence

    def _slice(self, now: float) -> int:
        return math.floor(now / (self.config.window_s / SLICES))

    def psi(self) -> dict[Cell, float]:
        """PSI of every cell with at least ``min_count`` questions in its reference and its
        window, now."""
        current = self._slice(self.clock())
        out: dict[Cell, float] = {}
        for cell, state in sorted(self.cells.items()):
            window = state.window(current)
            if (state.reference is not None and window is not None
                    and sum(window) >= self.config.min_count):
                out[cell] = psi(state.reference.counts, window)
        return out
