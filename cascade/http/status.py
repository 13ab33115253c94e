"""What a gateway reports about itself: readiness, ``/health``, its one-line description, the
``cascade_build`` info and the ``/v1/models`` cards. Reads the gateway through its view
(``cascade.http.view``); decides nothing about requests."""

from __future__ import annotations

from typing import Any

from cascade import __version__
from cascade.answers import DEMO_WARNING
from cascade.http.view import GatewayView
from cascade.schema import ModelCard


def ready(gateway: GatewayView) -> bool:
    """Whether this replica can serve: its cheap tier (or its only tier) is loaded. A strong
    tier that is down only degrades answers; ``/health`` and ``cascade_tier_ready`` show it."""
    route = gateway.policy.route
    first = route.cheap or route.strong
    return first is not None and gateway.tier_ready(first)


def health(gateway: GatewayView) -> dict[str, Any]:
    """``/health`` details. ``loaded`` and ``revisions`` are the keys Laya's remote client
    reads: the checkpoints (Laya tiers) and models (other tiers) resident right now."""
    tiers = {
        name: {**tier.health, "ready": tier.ready, "breaker": tier.breaker}
        for name, tier in gateway.tier_states().items()
    }
    resident = [
        (name, detail)
        for detail in tiers.values()
        if detail.get("ready")
        for name in detail.get("checkpoints") or [detail.get("model") or ""]
        if name
    ]
    route, log = gateway.policy.route, gateway.decision_log_health()
    return {
        "demo": gateway.demo,
        **({"warning": DEMO_WARNING} if gateway.demo else {}),
        "ready": ready(gateway),
        "loaded": [name for name, _ in resident],
        "revisions": {name: detail.get("revision") for name, detail in resident},
        "route": {"cheap": route.cheap, "strong": route.strong},
        "tiers": tiers,
        **({"decision_log": log} if log is not None else {}),
        **({"fleet": fleet} if (fleet := gateway.fleet_status()) is not None else {}),
        "novelty": novelty(gateway),
    }


def novelty(gateway: GatewayView) -> dict[str, Any]:
    """The novelty gate: the cells it covers and their memory, or why it is off."""
    policy, reference = gateway.policy, gateway.novelty_reference()
    if reference is not None:
        return {
            "on": True,
            "cells": sorted(reference.cells),
            "bytes": reference.nbytes,
            "max_flag_rate": reference.max_flag_rate,
        }
    why = (
        "[novelty] enabled = false"
        if not policy.novelty.enabled
        else "no calibration"
        if policy.calibration.file is None
        else f"calibration {policy.calibration.file} has no reference set"
    )
    return {"on": False, "why": why}


def client_health(gateway: GatewayView) -> dict[str, Any]:
    """What a client key sees of ``health``: the names Laya's remote client reads, no paths."""
    found = health(gateway)
    return {"loaded": found["loaded"], "revisions": found["revisions"]}


def describe(gateway: GatewayView) -> str:
    tiers = ", ".join(f"{n}={kind}" for n, kind in gateway.tier_kinds().items())
    return f"{'DEMO (random weights) ' if gateway.demo else ''}tiers: {tiers}"


def build_info(gateway: GatewayView) -> dict[str, str]:
    """The ``cascade_build`` labels: version, tiers, the checkpoints and revisions loaded."""
    found = health(gateway)
    return {
        "version": __version__,
        "tiers": ",".join(f"{n}={kind}" for n, kind in gateway.tier_kinds().items()),
        "checkpoints": ",".join(found["loaded"]),
        "revisions": ",".join(f"{k}={v}" for k, v in found["revisions"].items() if v),
        "demo": "true" if gateway.demo else "false",
    }


def model_cards(gateway: GatewayView) -> list[ModelCard]:
    """``/v1/models``: the policy's exact model names (patterns such as ``jev-*`` are not
    names), dated by its ``[models] release_date``."""
    models, route = gateway.policy.models, gateway.policy.route
    only = route.cheap if route.strong is None else route.strong if route.cheap is None else None
    described = [
        (
            models.cascade,
            f"one tier ({only}), no escalation"
            if only
            else "cascade: the cheap tier first, escalating to the strong tier",
        ),
        (models.cheap_only, f"the cheap tier only ({route.cheap})"),
        (models.strong_only, f"the strong tier only ({route.strong})"),
    ]
    prefix = "DEMO, random weights: " if gateway.demo else ""
    released = models.release_date.isoformat()
    return [
        ModelCard(name=name, description=prefix + text, release_date=released)
        for names, text in described
        for name in names
        if "*" not in name and "?" not in name
    ]
