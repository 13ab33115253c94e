"""A running canary as the gateway serves it, and the ``CanarySplit`` that asks it which
version decides each request.

A ``Canary`` is never changed once built (as a ``Serving`` is not): a new share or the end of
the rollout is a new one, or none, set with ``CanarySplit.run``. The candidate arm decides with
the candidate's policy and its own configured gate; the live control (pacer, refit, drift), the
decision cache and shadow mirroring belong to the current version alone (``Chosen.live``).
While a canary runs, every request is counted by arm and policy hash (``cascade.metrics``
``cascade_rollout_*``); only the two arms' hashes label series.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from cascade import metrics
from cascade.policy.model import Rollout
from cascade.policy.routing import Gate
from cascade.policy.serving import Serving
from cascade.rollout.split import Arm, arm_of


@dataclass(frozen=True, eq=False)
class Canary:
    """The candidate version ``serving`` on ``share`` of the requests against the version whose
    hash is ``current_hash``; ``rollout`` its policy's ``[rollout]``, ``started`` (unix seconds)
    and ``id`` as the rollout's state records them, ``step`` the index of ``share`` in
    ``[share, *steps]``."""

    rollout: Rollout
    serving: Serving
    current_hash: str
    share: float
    started: float
    id: int
    step: int = 0
    gates: dict[bool, Gate] = field(init=False)

    def __post_init__(self) -> None:
        policy = self.serving.policy
        object.__setattr__(self, "gates", {e: Gate.of(policy, escalate=e) for e in (True, False)})

    def next_share(self) -> float | None:
        """The share of the next step (None: the next promotion is to 100 %)."""
        steps = [self.rollout.share, *self.rollout.steps]
        return steps[self.step + 1] if self.step + 1 < len(steps) else None


class Chosen(NamedTuple):
    """What decides one request: its ``arm``, that version's ``serving`` and gate (given
    ``escalate``); ``live``: the current version (it feeds the live control); ``metered``: a
    canary ran when it was chosen (it is counted by arm)."""

    arm: Arm
    serving: Serving
    gate: Callable[[bool], Gate]
    live: bool
    metered: bool


class CanarySplit:
    """The gateway's view of the canary: ``pick`` chooses each request's version, ``meter``
    counts it. ``live_gate``: the live control's gate for the current version."""

    def __init__(self, live_gate: Callable[[bool], Gate]) -> None:
        self.live_gate = live_gate
        self.canary: Canary | None = None
        self._series: dict[tuple[str, str], set[str]] = {}  # (arm, policy hash): its tiers

    def run(self, canary: Canary | None) -> None:
        """Serve ``canary`` from now on (None: no split); series of any other hash go."""
        self.canary = canary
        metrics.ROLLOUT_SHARE.set(0.0 if canary is None else canary.share)
        keep = set() if canary is None else {canary.current_hash, canary.serving.policy_hash}
        for arm, digest in [s for s in self._series if s[1] not in keep]:
            tiers = self._series.pop((arm, digest))
            with contextlib.suppress(KeyError):
                metrics.ROLLOUT_SECONDS.remove(arm, digest)
            for family, values in (
                (metrics.ROLLOUT_REQUESTS, ("ok", "degraded", "error")),
                (metrics.ROLLOUT_QUESTIONS, tiers),
            ):
                for value in values:
                    with contextlib.suppress(KeyError):
                        family.remove(arm, digest, value)

    def pick(self, serving: Serving, tenant: str, request_id: str, *, own: bool) -> Chosen:
        """The version that decides a request of ``tenant`` with ``request_id``; ``serving`` is
        the current one. A tenant's own policy always runs on the current version."""
        canary = self.canary
        if canary is None or own or canary.current_hash != serving.policy_hash:
            return Chosen("current", serving, self.live_gate, True, canary is not None)
        arm = arm_of(tenant, request_id, share=canary.share, sticky=canary.rollout.sticky)
        if arm == "current":
            return Chosen("current", serving, self.live_gate, True, True)
        return Chosen("candidate", canary.serving, canary.gates.__getitem__, False, True)

    @contextlib.contextmanager
    def meter(self, chosen: Chosen) -> Iterator[Callable[[str, Mapping[str, str]], None]]:
        """Time a request on ``chosen``; it calls what this yields with its outcome label and
        its questions' tiers. One that raises is counted as an error."""
        if not chosen.metered:
            yield lambda label, tiers: None
            return
        arm, digest = chosen.arm, chosen.serving.policy_hash
        seen = self._series.setdefault((arm, digest), set())
        started, outcome = time.perf_counter(), ""

        def done(label: str, tiers: Mapping[str, str]) -> None:
            nonlocal outcome
            outcome = label
            for tier in tiers.values():
                seen.add(tier)
                metrics.ROLLOUT_QUESTIONS.labels(arm=arm, policy_hash=digest, tier=tier).inc()

        try:
            yield done
        except Exception:
            outcome = "error"
            raise
        finally:  # a cancelled request (the client went away) is not counted
            if outcome:
                metrics.ROLLOUT_REQUESTS.labels(arm=arm, policy_hash=digest, outcome=outcome).inc()
                seconds = time.perf_counter() - started
                metrics.ROLLOUT_SECONDS.labels(arm=arm, policy_hash=digest).observe(seconds)
