"""``GatewayView``: what the front door reads of a gateway, and nothing it drives.

``/health``, ``/ready``, ``/v1/models``, the start-up line and the per-gateway gauges
(``cascade.http.status``, ``cascade.http.gauges``) read a gateway only through this protocol:
its policy, its tiers' kind, readiness, health and breaker state, its decision log's health,
its fleet link, its novelty reference set, the hashes it serves, its drift, its live gate and
its cache's size. ``cascade.gateway.Gateway`` implements it (the tiers' part and the reference
set in its base, ``cascade.policy.serving.Reconfigurable``).
"""

from __future__ import annotations

from typing import Any, Protocol

from cascade.novelty.reference import ReferenceSet
from cascade.policy.model import Policy
from cascade.policy.serving import TierState


class GatewayView(Protocol):
    @property
    def policy(self) -> Policy: ...

    @property
    def demo(self) -> bool: ...

    @property
    def started(self) -> bool: ...

    def tier_kinds(self) -> dict[str, str]: ...

    def tier_ready(self, tier: str) -> bool: ...

    def breaker_states(self) -> dict[str, str]: ...

    def tier_states(self) -> dict[str, TierState]: ...

    def decision_log_health(self) -> dict[str, Any] | None: ...

    def fleet_status(self) -> dict[str, Any] | None: ...

    def novelty_reference(self) -> ReferenceSet | None: ...

    def hashes(self) -> tuple[str, str]: ...

    def psi(self) -> dict[tuple[str, str], float]: ...

    def fleet_psi(self) -> dict[tuple[str, str], float]: ...

    def gate_thresholds(self) -> dict[tuple[str, str], float]: ...

    def strong_share(self) -> float: ...

    def cache_size(self) -> tuple[int, int]: ...
