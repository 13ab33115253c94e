"""The refit: each cell's confidence threshold from labelled cheap answers, for an accuracy target.

Sans-IO and clock-free: ``cascade.control.live`` hands it ``Labelled`` answers (``observe``,
the ``Learner`` the feedback route feeds; shadow answers of the strong tier too where the policy
lets the strong tier teach) and calls ``fit`` on its schedule. Per cell (type x band) with a
target, over the cell's last ``LABELS`` labels (``pool``: else its band's, ``all``: else
everyone's, as ``cascade calibrate`` pools): the lowest threshold whose kept answers
(confidence at or above it) reach the target at the one-sided 95 % Clopper-Pearson lower bound
(``cascade.policy.stats.accuracy_threshold``), clamped to ``[min_threshold, max_threshold]``;
1.0 (escalate everything) when no threshold does. A cell without ``min_labels`` labels (in its
pool) gets no fit and keeps its configured threshold.

The labels say nothing about confidences below the least confident one judged (shadow rows
exist only for answers the gate kept), so a fit never goes below it: where every label is
kept, the threshold is the lowest confidence judged, not 0.

One judged answer per asked question: a label of a question already labelled (``Labelled.asked``)
replaces the earlier one, never adds to it, so relabelling moves nothing but that answer's own
verdict. And no tenant outweighs the others: a cell's evidence keeps of each named tenant's
labels at most ``max_tenant_share`` of the labels it keeps (``capped``: the tenant's most
recent; labels without a tenant, keyless or the strong tier's, are never dropped): under a
share of 1, one tenant's labels alone, however many, move no threshold.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from cascade.control.evidence import Labelled
from cascade.policy.model import Control
from cascade.policy.stats import ALL_CELLS, Cell, accuracy_threshold, lower_bound, pool_of

LABELS = 2000  # labels kept per cell, the most recent


@dataclass(frozen=True)
class Fitted:
    """One cell's refit and its evidence."""

    cell: Cell
    threshold: float
    n: int  # labels fitted on
    kept: int  # of which at or above the threshold
    bound: float  # the 95 % lower bound of the kept answers' accuracy
    pooled: bool  # fitted on the cell's band (or everything): too few labels of its own
    sources: str  # "feedback", "shadow" or "feedback+shadow"


def capped(members: Sequence[Labelled], share: float) -> list[Labelled]:
    """``members`` (oldest first) less the oldest labels of each named tenant beyond ``share``
    of those kept: the largest such set (labels without a tenant all kept), in order."""
    counts = Counter(m.tenant for m in members if m.tenant)
    free = len(members) - sum(counts.values())
    total = len(members)
    while True:  # the kept total only falls, so this ends (at most len(members) rounds)
        each = math.floor(share * total + 1e-9)
        kept = free + sum(min(n, each) for n in counts.values())
        if kept == total:
            break
        total = kept
    left = {tenant: min(n, each) for tenant, n in counts.items()}
    out = []
    for member in reversed(members):  # a tenant's most recent labels first
        if member.tenant and left[member.tenant] == 0:
            continue
        if member.tenant:
            left[member.tenant] -= 1
        out.append(member)
    return out[::-1]


@dataclass
class Refit:
    control: Control
    # per cell, its labels by asked question (oldest first; an answer judged once by a number)
    _labels: dict[Cell, OrderedDict[str | int, Labelled]] = field(default_factory=dict)
    _once: itertools.count[int] = field(default_factory=itertools.count)

    def observe(self, answers: Sequence[Labelled]) -> None:
        """Keep the labels the policy's ``teacher`` counts; a label of a question already
        labelled replaces the earlier one (and counts as the most recent)."""
        shadow = self.control.teacher == "feedback+shadow"
        for answer in answers:
            if answer.source == "feedback" or shadow:
                labels = self._labels.setdefault((answer.type, answer.band), OrderedDict())
                key = next(self._once) if answer.asked is None else answer.asked
                labels.pop(key, None)
                labels[key] = answer
                if len(labels) > LABELS:
                    labels.popitem(last=False)

    def forget(self) -> None:
        """Drop every label (read on temperatures no longer in force)."""
        self._labels.clear()

    def labels(self, cell: Cell) -> int:
        return len(self._labels.get(cell, ()))

    def fit(self) -> list[Fitted]:
        """A fit for every cell with a target and enough labels."""
        control = self.control

        def enough(members: Sequence[Labelled]) -> bool:
            return len(members) >= control.min_labels

        cells = {
            cell: capped(list(labels.values()), control.max_tenant_share)
            for cell, labels in self._labels.items()
        }
        out = []
        for cell in ALL_CELLS:
            target = control.target(cell[0])
            if target is None:
                continue
            members, pooled = pool_of(cells, cell, enough, across_bands=control.pool == "all")
            if not enough(members) or (pooled and control.pool == "none"):
                continue
            out.append(self._fit(cell, members, target, pooled))
        return out

    def _fit(self, cell: Cell, members: list[Labelled], target: float, pooled: bool) -> Fitted:
        scored = [(m.confidence, m.correct) for m in members]
        threshold, kept, right = accuracy_threshold(scored, target)
        if kept == len(scored):  # certified down to the least confident label, no further
            threshold = min(c for c, _ in scored)
        c = self.control
        threshold = min(max(threshold, c.min_threshold), c.max_threshold)
        kept = sum(conf >= threshold for conf, _ in scored)
        right = sum(ok for conf, ok in scored if conf >= threshold)
        sources = "+".join(sorted({m.source for m in members}))
        return Fitted(cell, threshold, len(scored), kept, lower_bound(right, kept), pooled, sources)
