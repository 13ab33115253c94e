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

The fleet's PSI (``[control] scope = "fleet"``): each confidence of a cell whose reference is
the snapshot's is also tallied (``tally``, ``cascade.fleet.histograms``); the fleet's sync adds
it to shared histograms and hands the fleet's window back (``shared``), and ``fleet_psi`` is the
PSI of those merged counts per cell, by the same ``min_count`` rule. A boot reference differs
per replica, so cells without a snapshot have no fleet PSI. The last one read is kept while
younger than ``window_s`` (the fleet's Redis down: its age grows), then dropped.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
import time
from collections.abc import Callable, Sequence

import msgspec
import numpy as np

from cascade.fleet.histograms import ConfidenceTally, Merged
from cascade.policy.flow import Decision
from cascade.policy.model import ConfidenceHistogram, Drift, Policy
from cascade.policy.stats import Cell

SLICES = 12
RESERVOIR = 20_000
SMOOTHING = 0.5  # added to every bin's count before taking shares


def cell_key(cell: Cell) -> str:
    """The calibration file's name of a cell: ``choice:3-5``."""
    return f"{cell[0]}:{cell[1]}"


def histogram(values: Sequence[float], bins: int) -> ConfidenceHistogram:
    """``values`` counted on ``bins`` equal-count bins of their own (edges midway between
    neighbouring values; ties merge bins, so a sample with few distinct values has fewer).
    Linear time: only the order statistics at the edges are selected, nothing is sorted."""
    data = np.asarray(values, dtype=np.float64)
    n = len(data)
    ks = sorted(k for k in {round(i * n / bins) for i in range(1, bins)} if 0 < k < n)
    if ks:  # the neighbours of each edge in place, the rest unordered around them
        data = np.partition(data, sorted({*ks, *(k - 1 for k in ks)}))
    edges: list[float] = []
    for k in ks:
        low, high = float(data[k - 1]), float(data[k])
        edge = (low + high) / 2
        if low < high and (not edges or edge > edges[-1]):
            edges.append(edge)
    return ConfidenceHistogram(edges=edges, counts=counted(edges, data))


def counted(edges: Sequence[float], values: Sequence[float] | np.ndarray) -> list[int]:
    """How many of ``values`` fall in each bin of ``edges`` (see ``ConfidenceHistogram``)."""
    at = np.searchsorted(np.asarray(edges, dtype=np.float64), values, side="right")
    return [int(c) for c in np.bincount(at, minlength=len(edges) + 1)]


def psi(reference: Sequence[int], window: Sequence[int] | np.ndarray) -> float:
    """The population stability index of ``window``'s counts against ``reference``'s."""
    r = np.asarray(reference, dtype=np.float64) + SMOOTHING
    w = np.asarray(window, dtype=np.float64) + SMOOTHING
    r, w = r / r.sum(), w / w.sum()
    return float(np.sum((w - r) * np.log(w / r)))


class _Cell:
    """One cell's reference (a histogram, or a boot sample still filling) and its window."""

    def __init__(self, reference: ConfidenceHistogram | None) -> None:
        self.reference = reference
        self.sample: list[float] = []
        self.seen = 0  # confidences offered to the sample
        # a ring of SLICES slots: counts on the reference's edges, and the slice each holds
        self.ring: np.ndarray | None = None
        self.slots = np.full(SLICES, np.iinfo(np.int64).min, dtype=np.int64)

    def count(self, current: int, at: int) -> None:
        """Count a confidence in bin ``at`` of slice ``current`` (the reference has closed)."""
        assert self.reference is not None, "the window counts after the reference closed"
        if self.ring is None:
            self.ring = np.zeros((SLICES, len(self.reference.counts)), dtype=np.int64)
        slot = current % SLICES
        if self.slots[slot] != current:  # the slot's old slice has left the window
            self.ring[slot] = 0
            self.slots[slot] = current
        self.ring[slot, at] += 1

    def window(self, current: int) -> np.ndarray | None:
        """The counts of the slices still in the window (None before the reference closed)."""
        if self.reference is None:
            return None
        if self.ring is None:
            return np.zeros(len(self.reference.counts), dtype=np.int64)
        return self.ring[self.slots > current - SLICES].sum(axis=0)


class DriftMonitor:
    """PSI per cell of one policy's cheap tier (see the module docstring).

    ``observe`` takes the policy in force: when its ``[drift]`` table or its calibration
    snapshot changes (a reload), the references and windows start over."""

    def __init__(
        self, policy: Policy, *, clock: Callable[[], float] = time.monotonic, seed: int = 0
    ) -> None:
        self.clock = clock
        self._rng = random.Random(seed)
        self._reset(policy)

    def _reset(self, policy: Policy) -> None:
        self.config: Drift = policy.drift
        self.snapshot = policy.calibration.snapshot
        self.started = self.clock()
        self.cells: dict[Cell, _Cell] = {}
        self._control = policy.control
        self.tally = self._tally(policy)
        self._fleet: dict[Cell, float] = {}
        self._fleet_at = -math.inf  # when ``_fleet`` was read (clock)

    def _tally(self, policy: Policy) -> ConfidenceTally | None:
        """The fleet's tally: the fleet scope, and snapshot cells the reference takes."""
        control = policy.control
        usable = {
            key: hist
            for key, hist in self.snapshot.items()
            if sum(hist.counts) >= self.config.min_count
        }
        if (
            control is None
            or control.scope != "fleet"
            or self.config.reference != "calibration"
            or not usable
        ):
            return None
        reference = hashlib.sha256(
            msgspec.json.encode([self.config.bins, usable], order="sorted")
        ).hexdigest()[:16]
        return ConfidenceTally(
            self.config.window_s, reference, {key: len(hist.counts) for key, hist in usable.items()}
        )

    def _cell(self, cell: Cell) -> _Cell:
        found = self.cells.get(cell)
        if found is None:
            fitted = self.snapshot.get(cell_key(cell))
            usable = (
                self.config.reference == "calibration"
                and fitted is not None
                and sum(fitted.counts) >= self.config.min_count
            )
            found = self.cells[cell] = _Cell(fitted if usable else None)
        return found

    def observe(self, policy: Policy, decision: Decision) -> None:
        """Count the confidences of one decided request's gated questions."""
        if policy.drift != self.config or policy.calibration.snapshot != self.snapshot:
            self._reset(policy)
        elif policy.control != self._control:  # the scope may have changed; the window stays
            self._control, wanted = policy.control, self._tally(policy)
            if (wanted is None) != (self.tally is None):
                self.tally = wanted
        for read in decision.gate.values():
            self.add(read.cell, read.confidence)

    def add(self, cell: Cell, confidence: float) -> None:
        """Count one gate confidence of ``cell`` now."""
        now, state = self.clock(), self._cell(cell)
        if state.reference is None:
            self._sample(state, confidence)
            if (
                now - self.started >= self.config.reference_s
                and state.seen >= self.config.min_count
            ):
                state.reference = histogram(state.sample, self.config.bins)
                state.sample = []
            return
        at = bisect.bisect_right(state.reference.edges, confidence)
        state.count(self._slice(now), at)
        if self.tally is not None and (key := cell_key(cell)) in self.tally.bins:
            self.tally.add(now, key, at)

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
            if (
                state.reference is not None
                and window is not None
                and int(window.sum()) >= self.config.min_count
            ):
                out[cell] = psi(state.reference.counts, window)
        return out

    def shared(self, window: Merged) -> None:
        """The fleet's window on the snapshot's bins, read now (``cascade.control.fleet``)."""
        out: dict[Cell, float] = {}
        for key, counts in sorted(window.items()):
            reference = self.snapshot.get(key)
            if reference is not None and sum(counts) >= self.config.min_count:
                qtype, band = key.split(":", 1)
                out[(qtype, band)] = psi(reference.counts, counts)
        self._fleet, self._fleet_at = out, self.clock()

    def fleet_psi(self) -> dict[Cell, float]:
        """The fleet's PSI per cell, as last read while younger than ``window_s``."""
        return self._fleet if self.fleet_age() is not None else {}

    def fleet_age(self) -> float | None:
        """Seconds since the fleet's PSI was read; None: none, or older than ``window_s``."""
        age = self.clock() - self._fleet_at
        return age if age <= self.config.window_s else None
