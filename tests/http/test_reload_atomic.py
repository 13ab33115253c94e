"""A reload is all or nothing (``cascade.policy.serving``: prepare, then swap): a hook that
cannot apply the new policy refuses it with everything as it was, and every identity of the new
version is computed before the swap and off the event loop, so the first request after it
hashes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from cascade.cache.decision import DecisionCache
from cascade.cache.store import MemoryStore
from cascade.engines.fake import FakeEngine
from cascade.errors import ConfigRejected
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.policy.files import load_policy
from cascade.policy.model import Policy
from cascade.policy.serving import Serving
from cascade.settings import Settings
from tests.http.test_reload import ADMIN, BODY, policy_text, reloads, slow_answer

CACHE = "\n[cache]\nenabled = true\n"


class TierIds:
    """The cache's tier ids, recording which policies were hashed on an event loop and which
    off it."""

    def __init__(self) -> None:
        self.on_loop: list[Policy] = []
        self.off_loop: list[Policy] = []

    def __call__(self, policy: Policy) -> Mapping[str, str]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.off_loop.append(policy)
        else:
            self.on_loop.append(policy)
        return {name: "weights" for name in policy.tiers}


def cached_app(path: Path, tier_ids: TierIds) -> tuple[Any, Gateway]:
    """The app serving ``path``'s policy with a memory cache, on fake engines."""
    policy = load_policy(path)
    cache = DecisionCache(
        policy.cache,
        MemoryStore(max_bytes=policy.cache.max_bytes, ttl_s=policy.cache.ttl_s),
        tier_ids=tier_ids,
    )
    cache.version(policy)  # hashed at boot, as cascade.build does
    gateway = Gateway(policy, {n: FakeEngine(n, slow_answer) for n in policy.tiers}, cache=cache)
    app = create_app(Settings(policy=str(path), admin_keys=("admin-key",)), gateway)
    return app, gateway


def seen(client: TestClient, gateway: Gateway) -> dict[str, Any]:
    """What a reload would change: the hashes served, the live gate, the cache's identity."""
    config = client.get("/health", headers=ADMIN).json()["config"]
    assert gateway.cache is not None
    return {
        "hashes": (config["policy_hash"], config["calibration_hash"]),
        "control": client.get("/admin/control", headers=ADMIN).json(),
        "policy": gateway.policy,
        "cache": gateway.cache.version(gateway.policy),
        "gate": [
            line
            for line in client.get("/metrics").text.splitlines()
            if line.startswith("cascade_gate_threshold{")
        ],
    }


def test_a_hook_that_cannot_apply_the_new_policy_refuses_it_and_nothing_changes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(policy_text(0.5, extra=CACHE))
    app, gateway = cached_app(path, TierIds())

    def refuse(serving: Serving) -> None:
        raise ValueError(f"no table for {serving.policy.description!r}")

    with TestClient(app) as client:
        assert client.post("/v1/systemone", json=BODY).status_code == 200
        before = seen(client, gateway)
        gateway.reconfigured.append(refuse)  # after the live gate's own hook
        path.write_text(policy_text(0.9, extra=CACHE))
        rejected = reloads("rejected")
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 422, r.text
        assert r.json()["detail"]["lines"] == [
            f"{path}: error: the new policy cannot be applied: no table for 'reload test'"
        ]
        assert reloads("rejected") == rejected + 1
        assert seen(client, gateway) == before
        assert before["control"]["thresholds"]["noul:2"] == 0.5
        gateway.reconfigured.remove(refuse)
        assert client.post("/admin/reload", headers=ADMIN).status_code == 200  # now it applies
        assert client.get("/admin/control", headers=ADMIN).json()["thresholds"]["noul:2"] == 0.9


def test_a_reload_hashes_the_weights_before_the_swap_and_off_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(policy_text(0.5, extra=CACHE))
    tier_ids = TierIds()
    app, gateway = cached_app(path, tier_ids)
    with TestClient(app) as client:
        assert client.post("/v1/systemone", json=BODY).headers["x-cascade-cache"] == "miss"
        path.write_text(policy_text(0.9, extra=CACHE))
        assert client.post("/admin/reload", headers=ADMIN).status_code == 200
        assert tier_ids.off_loop[-1] is gateway.policy  # the new version, hashed in a thread
        hashed = len(tier_ids.off_loop)
        r = client.post("/v1/systemone", json=BODY)  # the first request on the new version
        assert r.status_code == 200 and r.headers["x-cascade-cache"] == "miss"
    assert tier_ids.on_loop == [] and len(tier_ids.off_loop) == hashed == 2


def test_a_version_prepared_on_another_is_never_swapped_in(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(policy_text(0.5, extra=CACHE))
    _, gateway = cached_app(path, TierIds())
    path.write_text(policy_text(0.7, extra=CACHE))
    stale = gateway.prepare(load_policy(path))
    path.write_text(policy_text(0.9, extra=CACHE))
    served = gateway.reconfigure(load_policy(path))
    with pytest.raises(ConfigRejected, match="changed while this one was prepared"):
        gateway.swap(stale)
    assert gateway.serving is served and gateway.control.thresholds()[("noul", "2")] == 0.9
