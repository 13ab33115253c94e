"""The version of the policy a gateway serves, and how a reload swaps it.

A ``Serving`` is never changed once built: a request reads the one serving when it starts, to
its end. ``Reconfigurable.reconfigure`` swaps in the next one on the same engines, or raises
``RestartNeeded`` when the new policy would need other engines (nothing changes then); breakers
whose settings are unchanged keep their state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import msgspec

from cascade.engines.base import Engine, Previewing
from cascade.errors import RestartNeeded
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
    changes += [f"tier `{n}` changes what its engine is built from (kind, weights or engine "
                "settings)" for n, tier in new.tiers.items()
                if n in old.tiers and built_from(tier) != built_from(old.tiers[n])]
    if new.decision_log != old.decision_log:
        changes.append("[decision_log] changes (the log is opened at boot)")
    if new.cache != old.cache:
        changes.append("[cache] changes (the cache and its store are built at boot)")
    return changes


class Reconfigurable:
    """The base of ``cascade.gateway.Gateway``: its ``engines`` and ``breakers``, and the
    ``serving`` version, swapped whole by ``reconfigure``. Requests take ``serving`` when they
    start; a breaker whose settings a reconfiguration changes is replaced at the swap.

    ``reconfigured``: callables given the new ``Serving`` right after each swap, on the event
    loop, before any request can start on it (live state derived from the policy re-bases
    here). The swap is done by then: a hook that raises is logged and the others still run.
    """

    def __init__(self, policy: Policy, engines: Mapping[str, Engine]) -> None:
        self.engines = dict(engines)
        self.breakers = {name: CircuitBreaker(policy.breaker_for(name)) for name in self.engines}
        self.serving = Serving(policy, self.engines)
        self.reconfigured: list[Callable[[Serving], None]] = []

    @property
    def policy(self) -> Policy:
        """The policy serving now (a request reads the one it started on)."""
        return self.serving.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.reconfigure(policy)

    def reconfigure(self, policy: Policy) -> Serving:
        """Serve ``policy`` from now on, on the same engines; raises ``RestartNeeded``, changing
        nothing, when it would need others. Requests in flight end on their version."""
        reasons = restart_reasons(self.serving.policy, policy)
        if reasons:
            raise RestartNeeded([f"restart needed: {why}; a reload applies thresholds, routing, "
                                 "models, breakers, shadow, degrade, calibration and timeouts"
                                 for why in reasons])
        self.breakers = {
            name: breaker if policy.breaker_for(name) == breaker.config
            else CircuitBreaker(policy.breaker_for(name))
            for name, breaker in self.breakers.items()}
        self.serving = serving = Serving(policy, self.engines)
        for hook in self.reconfigured:
            try:
                hook(serving)
            except Exception:
                log.exception("a reconfiguration hook failed (the new policy serves)")
        return serving
