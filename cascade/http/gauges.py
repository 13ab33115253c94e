"""The per-gateway gauges, registered on a registry of their own: an app serves its gateway's
next to the process-wide metrics (``/metrics``), so two gateways in one process never overwrite
each other's readings. They read the gateway through its view (``cascade.http.view``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from cascade.http import status
from cascade.http.view import GatewayView
from cascade.metrics import CacheGauges, ConfigInfo, ControlGauges, DriftGauges, GatewayGauges

_STATE_CODE = {"closed": 0, "half_open": 1, "open": 2}


def registry_of(gateway: GatewayView) -> CollectorRegistry:
    """A registry holding ``gateway``'s gauges, read at scrape time."""
    built: dict[str, str] = {}

    def build() -> dict[str, str] | None:
        if gateway.started and not built:  # what was loaded at start-up
            built.update(status.build_info(gateway))
        return built or None

    def ready() -> dict[str, bool]:
        return {name: gateway.started and gateway.tier_ready(name) for name in gateway.tier_kinds()}

    registry = CollectorRegistry()
    registry.register(
        GatewayGauges(
            ready=ready,
            breakers=lambda: {
                n: _STATE_CODE[state] for n, state in gateway.breaker_states().items()
            },
            build=build,
        )
    )
    registry.register(DriftGauges(gateway.psi, gateway.fleet_psi))
    registry.register(ControlGauges(gateway.gate_thresholds, gateway.strong_share))
    registry.register(CacheGauges(gateway.cache_size))
    registry.register(ConfigInfo(gateway.hashes))
    return registry
