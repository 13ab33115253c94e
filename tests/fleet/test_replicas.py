"""Three real ``cascade serve`` replicas on one real ``redis-server``: a ConfigMap symlink swap
reaches every replica through its file watcher; ``/admin/fleet`` lists them and the config skew
(and ``cascade_fleet_config_skew``) shows the one serving another policy; a fleet reload with one
replica's file invalid lists it as refused, and a stopped replica as not answered."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from cascade.policy.files import load_policy
from cascade.policy.fingerprint import policy_hash
from tests.fleet.configmap import ConfigMap
from tests.http.test_reload import policy_text
from tests.servers import free_port, run_process, run_redis, scrape

ADMIN = {"authorization": "Bearer admin-key"}
NAMES = ("a", "b", "c")


def replica(
    name: str, policy: Path, redis_url: str, **env: str
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """``cascade serve --policy POLICY`` as replica ``name`` of the fleet on ``redis_url``,
    heartbeat every 0.2 s; ``env``: more ``CASCADE_*`` settings."""
    port = int(env.pop("port"))
    cmd = [
        sys.executable,
        "-m",
        "cascade",
        "serve",
        "--policy",
        str(policy),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    settings = {
        "CASCADE_REPLICA": name,
        "CASCADE_ADMIN_KEYS": "admin-key",
        "CASCADE_FLEET_REDIS": redis_url,
        "CASCADE_FLEET_HEARTBEAT_S": "0.2",
        "CASCADE_PUBLIC_METRICS": "1",
        **env,
    }
    return run_process(
        cmd, ready_url=f"http://127.0.0.1:{port}/health", env={**os.environ, **settings}
    )


@contextlib.contextmanager
def fleet(policies: dict[str, Path], **env: str) -> Iterator[dict[str, tuple[str, Any]]]:
    """The three replicas on a fresh Redis: name -> (base URL, process)."""
    with run_redis() as (url, _), contextlib.ExitStack() as stack:
        found = {}
        for name in NAMES:
            port = free_port()
            proc = stack.enter_context(replica(name, policies[name], url, port=str(port), **env))
            found[name] = (f"http://127.0.0.1:{port}", proc)
        yield found


def serving(base: str) -> str:
    hashed: str = httpx.get(base + "/health", headers=ADMIN).json()["config"]["policy_hash"]
    return hashed


def until(check: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Polls ``check`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def fleet_view(base: str) -> dict[str, Any]:
    response = httpx.get(base + "/admin/fleet", headers=ADMIN)
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def test_a_configmap_swap_reaches_every_replica_and_skew_shows_the_odd_one(tmp_path: Path) -> None:
    volumes = {
        name: ConfigMap(tmp_path / name, {"policy.toml": policy_text(0.0)}) for name in NAMES
    }
    with fleet({n: v.path("policy.toml") for n, v in volumes.items()}, CASCADE_WATCH_S="0.1") as up:
        bases = {name: base for name, (base, _) in up.items()}
        old = serving(bases["a"])
        for volume in volumes.values():
            volume.update({"policy.toml": policy_text(1.0)})
        new = policy_hash(load_policy(volumes["a"].path("policy.toml")))
        assert new != old
        assert until(lambda: all(serving(b) == new for b in bases.values())), {
            n: serving(b) for n, b in bases.items()
        }

        # each replica's entry in the registry moves with its next heartbeat: wait for all three
        assert until(
            lambda: (
                fleet_view(bases["b"])["policy_hash"] == new
                and [r["policy_hash"] for r in fleet_view(bases["b"])["replicas"]] == [new] * 3
            )
        )
        view = fleet_view(bases["b"])
        assert [r["replica"] for r in view["replicas"]] == list(NAMES)
        assert view["skew"] == 0 and view["skewed"] == []
        for seen in view["replicas"]:
            assert seen["policy_hash"] == new and seen["version"]
            assert seen["uptime_s"] > 0 and 0 <= seen["age_s"] <= 60

        volumes["c"].update({"policy.toml": policy_text(0.5)})  # c alone moves on
        assert until(lambda: fleet_view(bases["a"])["skewed"] == ["c"])
        assert fleet_view(bases["a"])["policy_hash"] == new
        gauge = ("cascade_fleet_config_skew", frozenset())
        assert until(lambda: scrape(bases["a"]).get(gauge) == 1.0)
        assert scrape(bases["a"])[("cascade_fleet_replicas", frozenset())] == 3.0

        volumes["c"].update({"policy.toml": policy_text(1.0)})
        assert until(lambda: scrape(bases["a"]).get(gauge) == 0.0)


def test_a_fleet_reload_lists_who_refused_and_who_did_not_answer(tmp_path: Path) -> None:
    files = {name: tmp_path / f"{name}.toml" for name in NAMES}
    for path in files.values():
        path.write_text(policy_text(0.0))
    with fleet(files, CASCADE_FLEET_REPLY_S="3") as up:
        bases = {name: base for name, (base, _) in up.items()}
        old = serving(bases["a"])
        files["a"].write_text(policy_text(1.0))
        files["b"].write_text(policy_text(1.0))
        files["c"].write_text(policy_text(1.0).replace('"2" = 1.0 }', '"2" = "high" }'))
        new = policy_hash(load_policy(files["a"]))
        assert until(lambda: len(fleet_view(bases["a"])["replicas"]) == 3)

        response = httpx.post(bases["a"] + "/admin/reload?scope=fleet", headers=ADMIN, timeout=30)
        assert response.status_code == 200, response.text
        report = response.json()
        outcomes = {r["replica"]: r for r in report["replicas"]}
        assert {n: r["outcome"] for n, r in outcomes.items()} == {
            "a": "applied",
            "b": "applied",
            "c": "rejected",
        }
        assert outcomes["a"]["policy_hash"] == outcomes["b"]["policy_hash"] == new
        assert outcomes["c"]["policy_hash"] == old
        assert any(str(files["c"]) in line for line in outcomes["c"]["errors"])
        assert report["refused"] == ["c"] and report["not_answered"] == []
        assert [serving(bases[n]) for n in NAMES] == [new, new, old]  # c keeps its version
        assert until(lambda: fleet_view(bases["b"])["skewed"] == ["c"])

        proc_c = up["c"][1]
        proc_c.send_signal(signal.SIGSTOP)  # seen (its heartbeat lives 60 s) but silent
        try:
            report = httpx.post(
                bases["b"] + "/admin/reload?scope=fleet", headers=ADMIN, timeout=30
            ).json()
        finally:
            proc_c.send_signal(signal.SIGCONT)
        assert [(r["replica"], r["outcome"]) for r in report["replicas"]] == [
            ("a", "unchanged"),
            ("b", "unchanged"),
        ]
        assert report["not_answered"] == ["c"] and report["refused"] == []
