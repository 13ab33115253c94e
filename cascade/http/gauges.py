"""The per-gateway gauges, registered on a registry of their own: an app serves its gateway's
next to the process-wide metrics (``/metrics``), so two gateways in one process never overwrite
each other's readings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from cascade.cache.store import MemoryStore
from cascade.http import status
from cascade.metrics import CacheGauges, ConfigInfo, ControlGauges, DriftGauges, GatewayGauges

if TYPE_CHECKING:
    from cascade.gateway import Gateway

_STATE_CODE = {"closed": 0, "half_open": 1, "open": 2}


def registry_of(gateway: Gateway) -> CollectorRegistry:
    """A registry holding ``gateway``'s gauges, read at scrape time."""
    built: dict[str, str] = {}

    def build() -> dict[str, str] | None:
        if gateway.started and not built:  # what was loaded at start-up
            built.update(status.build_info(gateway))
        return built or None

    registry = CollectorRegistry()
    registry.register(GatewayGauges(
        ready=lambda: {n: gateway.started and e.ready() for n, e in gateway.engines.items()},
        breakers=lambda: {n: _STATE_CODE[b.state(gateway.clock())]
                          for n, b in gateway.breakers.items()},
        build=build,
    ))
    registry.register(DriftGauges(lambda: {cell: v for cell, v in gateway.drift.psi().items()}))
    registry.register(ControlGauges(gateway.control.thresholds,
                                    lambda: gateway.control.strong_share))
    store = gateway.cache.store if gateway.cache is not None else None
    registry.register(CacheGauges(
        lambda: (store.bytes, len(store)) if isinstance(store, MemoryStore) else (0, 0)))
    registry.register(ConfigInfo(
        lambda: (gateway.serving.policy_hash, gateway.serving.calibration_hash)))
    return registry
