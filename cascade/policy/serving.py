"""The version of the policy a gateway serves, and how a reload swaps it.

A ``Serving`` is never changed once built: a request reads the one serving when it starts, to
its end. ``Reconfigurable.reconfigure`` swaps in the next one on the same engines, all or
nothing: everything it needs is computed first (``prepare``), or it raises ``RestartNeeded``
when the new policy would need other engines, ``ConfigRejected`` when a hook cannot apply it
(nothing changes then); breakers whose settings are unchanged keep their state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from cascade.engines.base import Engine, Previewing
from cascade.errors import ConfigRejected, RestartNeeded
from cascade.novelty.reference import ReferenceSet
from cascade.policy.breaker import CircuitBreaker
from cascade.policy.fingerprint import calibration_hash, policy_hash
from cascade.policy.model import Policy, Tier
from cascade.policy.novelty import load_reference

log = logging.getLogger("cascade")


class Serving:
    """A policy as served: its hashes, its novelty reference set and, when the cheap engine can
    preview rows (Laya), that engine, for exact token counts at pre-routing."""

    def __init__(self, policy: Policy, engines: Mapping[str, Engine]) -> None:
        self.policy = policy
        cheap = engines.get(policy.route.cheap or "")
        self.previewer = cheap if isinstance(cheap, Previewing) else None
        self.policy_hash = policy_hash(policy)
        self.calibration_hash = calibration_hash(policy)
        self.reference = load_reference(policy)  # the novelty gate's (None: off)


def restart_reasons(old: Policy, new: Policy) -> list[str]:
    """Why ``new`` cannot replace ``old`` without a restart: a tier added, removed, or defined
    otherwise (an engine is built from every field of its tier but ``timeout_s``, which calls
    read), or another ``[decision_log]`` or ``[cache]`` (both are opened at boot)."""

    def built_from(tier: Tier) -> Tier:
        return msgspec.structs.replace(tier, timeout_s=0.0)

    changes = [f"tier `{n}` is new" for n in new.tiers if n not in old.tiers]
    changes += [f"tier `{n}` is gone" for n in old.tiers if n not in new.tiers]
    changes += [
        f"tier `{n}` changes what its engine is built from (kind, weights or engine settings)"
        for n, tier in new.tiers.items()
        if n in old.tiers and built_from(tier) != built_from(old.tiers[n])
    ]
    if new.decision_log != old.decision_log:
        changes.append("[decision_log] changes (the log is opened at boot)")
    if new.cache != old.cache:
        changes.append("[cache] changes (the cache and its store are built at boot)")
    return changes


class TierState(msgspec.Struct, frozen=True):
    """One tier as ``/health`` shows it: its engine's class, readiness, health and breaker."""

    kind: str
    ready: bool
    health: dict[str, Any]
    breaker: str


# A reconfiguration hook: given the next ``Serving``, it checks and computes what that version
# needs (a pure function of it) and returns the step that applies it at the swap, or None.
Hook = Callable[[Serving], Callable[[], None] | None]


class NextVersion(msgspec.Struct, frozen=True):
    """A swap computed in full before it is made (``Reconfigurable.prepare``): the version it
    replaces, the next one, its breakers and what its hooks apply."""

    base: Serving
    serving: Serving
    breakers: dict[str, CircuitBreaker]
    steps: list[Callable[[], None]]


class Reconfigurable:
    """The base of ``cascade.gateway.Gateway``: its ``engines`` and ``breakers``, and the
    ``serving`` version, swapped whole by ``reconfigure``. Requests take ``serving`` when they
    start; a breaker whose settings a reconfiguration changes is replaced at the swap.

    A reconfiguration is all or nothing, in two steps. ``prepare`` computes everything the next
    version needs (its hashes, its breakers, and each hook of ``reconfigured`` given the next
    ``Serving``: live state derived from the policy, the cache's identity of the weights) and
    changes nothing: a reload runs it in a worker thread, and any failure refuses the version.
    ``swap`` then makes it serve, on the event loop, with no await and nothing left to fail:
    the steps the hooks returned run before any request can start on it.
    """

    def __init__(
        self,
        policy: Policy,
        engines: Mapping[str, Engine],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock  # the breakers'
        self.engines = dict(engines)
        self.breakers = {name: CircuitBreaker(policy.breaker_for(name)) for name in self.engines}
        self.serving = Serving(policy, self.engines)
        self.reconfigured: list[Hook] = []

    @property
    def policy(self) -> Policy:
        """The policy serving now (a request reads the one it started on)."""
        return self.serving.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.reconfigure(policy)

    def reconfigure(self, policy: Policy) -> Serving:
        """Serve ``policy`` from now on, on the same engines (``prepare``, then ``swap``).
        Requests in flight end on their version."""
        return self.swap(self.prepare(policy))

    def prepare(self, policy: Policy, *, source: str = "<policy>") -> NextVersion:
        """Everything serving ``policy`` needs, computed now; nothing changes. Raises
        ``RestartNeeded`` when it would need other engines, ``ConfigRejected`` (a line naming
        ``source``) when a hook cannot apply it."""
        reasons = restart_reasons(self.serving.policy, policy)
        if reasons:
            raise RestartNeeded(
                [
                    f"restart needed: {why}; a reload applies thresholds, routing, "
                    "models, breakers, shadow, degrade, calibration and timeouts"
                    for why in reasons
                ]
            )
        base, serving = self.serving, Serving(policy, self.engines)
        steps = []
        for hook in self.reconfigured:
            try:
                step = hook(serving)
            except ConfigRejected:
                raise
            except Exception as exc:
                log.exception("a reconfiguration hook refused the new policy")
                raise ConfigRejected(
                    [f"{source}: error: the new policy cannot be applied: {exc}"]
                ) from exc
            if step is not None:
                steps.append(step)
        breakers = {
            name: breaker
            if policy.breaker_for(name) == breaker.config
            else CircuitBreaker(policy.breaker_for(name))
            for name, breaker in self.breakers.items()
        }
        return NextVersion(base=base, serving=serving, breakers=breakers, steps=steps)

    def swap(self, prepared: NextVersion) -> Serving:
        """Serve ``prepared`` from now on (no await: every request starts on one version).
        ``ConfigRejected`` when another version was swapped in since it was prepared."""
        if prepared.base is not self.serving:
            raise ConfigRejected(
                ["the serving policy changed while this one was prepared; reload again"]
            )
        self.breakers, self.serving = prepared.breakers, prepared.serving
        for step in prepared.steps:
            step()
        return prepared.serving

    # ------------------------------------------------------------ what the front door reads
    # of the tiers (``cascade.http.view.GatewayView``)

    def tier_kinds(self) -> dict[str, str]:
        """Each tier's engine class name."""
        return {name: type(engine).__name__ for name, engine in self.engines.items()}

    def tier_ready(self, tier: str) -> bool:
        return self.engines[tier].ready()

    def novelty_reference(self) -> ReferenceSet | None:
        """The novelty gate's reference set the served policy loaded (None: the gate is off)."""
        return self.serving.reference

    def breaker_states(self) -> dict[str, str]:
        now = self.clock()
        return {name: breaker.state(now) for name, breaker in self.breakers.items()}

    def tier_states(self) -> dict[str, TierState]:
        breakers = self.breaker_states()
        return {
            name: TierState(
                kind=type(engine).__name__,
                ready=engine.ready(),
                health=engine.health(),
                breaker=breakers[name],
            )
            for name, engine in self.engines.items()
        }

    def hashes(self) -> tuple[str, str]:
        """The policy and calibration hashes serving now."""
        return self.serving.policy_hash, self.serving.calibration_hash
