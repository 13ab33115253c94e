"""Reload without restart (``POST /admin/reload``, ``cascade.http.reload``): under load on a real
server with zero failed requests, each request on one version; refused reloads (a bad policy,
a calibration for other weights, a tier change) leave the running version serving; admin keys;
key files read again; engines and breakers kept."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import TestClient

from cascade import metrics
from cascade.build import fingerprints
from cascade.calls import EngineAnswer, EngineCall
from cascade.engines.fake import FakeEngine, deterministic_answer
from cascade.gateway import Gateway
from cascade.http.app import create_app
from cascade.http.services import services_of
from cascade.laya.tiny import make_tiny
from cascade.policy.calibration import CalibrationFile, CalibrationStamp, write_calibration
from cascade.policy.files import load_policy
from cascade.policy.fingerprint import policy_hash
from cascade.policy.model import Policy, TypeBands, UpstreamTier
from cascade.policy.serving import Serving
from cascade.settings import Settings
from tests.servers import free_port, run_process, serve_app

ADMIN = {"authorization": "Bearer admin-key"}
BODY = {
    "model": "jev-latest",
    "state": "I was charged twice",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": ["billing", "technical", "sales"],
        },
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
        "anger": {
            "type": "score",
            "instructions": "How angry?",
            "criteria": ["calm", "upset", "furious"],
        },
    },
}


def policy_text(threshold: float, url: str = "http://127.0.0.1:9", extra: str = "") -> str:
    """Two upstream tiers; every cell's confidence threshold is ``threshold``: 0 keeps every
    cheap answer, 1 escalates every question."""
    cells = ", ".join(f'"{band}" = {threshold}' for band in ("2", "3-5", "6-10", "11+"))
    return f"""description = "reload test"

[tiers.cheap]
kind = "upstream"
urls = ["{url}"]

[tiers.strong]
kind = "upstream"
urls = ["http://127.0.0.1:9"]

[route]
cheap = "cheap"
strong = "strong"

[thresholds.confidence]
choice = {{ {cells} }}
score = {{ {cells} }}
noul = {{ "2" = {threshold} }}
{extra}"""


async def slow_answer(call: EngineCall) -> EngineAnswer:
    await asyncio.sleep(0.003)  # requests overlap the swaps
    return deterministic_answer(call)


def gateway_of(policy: Policy) -> Gateway:
    return Gateway(policy, {name: FakeEngine(name, slow_answer) for name in policy.tiers})


def app_on(path: Path, **settings: Any) -> Any:
    """The app serving ``path``'s policy on fake engines, reloading from ``path``."""
    options: dict[str, Any] = {"admin_keys": ("admin-key",), **settings}
    return create_app(Settings(policy=str(path), **options), gateway_of(load_policy(path)))


def reloads(outcome: str) -> float:
    return metrics.CONFIG_RELOADS.labels(outcome=outcome)._value.get()


def tiers_of(response: httpx.Response | Any) -> set[str]:
    return set(response.json()["x_cascade"]["tiers"].values())


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(policy_text(0.0))
    return path


@pytest.fixture
def client(policy_file: Path) -> Iterator[TestClient]:
    with TestClient(app_on(policy_file)) as c:
        yield c


def test_reloads_under_load_fail_no_request_and_each_runs_on_one_version(policy_file: Path) -> None:
    """8 clients against a real server while the policy flips 8 times between "all cheap" and
    "all strong", 0.3 s apart: every response is a 200 answered wholly by one version, and a
    request that started after a reload returned and ended before the next began is on that
    reload's version."""
    texts = {"cheap": policy_text(0.0), "strong": policy_text(1.0)}
    done: list[tuple[float, float, int, frozenset[str]]] = []
    swaps: list[tuple[float, float, str]] = [(0.0, 0.0, "cheap")]  # (sent, answered, version)

    async def load(url: str) -> None:
        finished = asyncio.Event()

        async def client() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                while not finished.is_set():
                    started = time.monotonic()
                    r = await http.post("/v1/systemone", json=BODY)
                    seen = frozenset(tiers_of(r)) if r.status_code == 200 else frozenset()
                    done.append((started, time.monotonic(), r.status_code, seen))

        async def reloader() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=30, headers=ADMIN) as http:
                for version in ["strong", "cheap"] * 4:
                    await asyncio.sleep(0.3)
                    policy_file.write_text(texts[version])
                    sent = time.monotonic()
                    r = await http.post("/admin/reload")
                    assert r.status_code == 200, r.text
                    assert r.json()["outcome"] == "applied"
                    swaps.append((sent, time.monotonic(), version))
                await asyncio.sleep(0.3)
            finished.set()

        async with asyncio.timeout(60):
            await asyncio.gather(*(client() for _ in range(8)), reloader())

    applied = reloads("applied")
    with serve_app(app_on(policy_file)) as url:
        asyncio.run(load(url))
    assert reloads("applied") - applied == len(swaps) - 1 == 8
    assert [status for *_, status, _ in done if status != 200] == []
    assert {seen for *_, seen in done} == {frozenset({"cheap"}), frozenset({"strong"})}
    pinned = 0
    for (_, answered, version), (sent_next, *_) in zip(swaps, [*swaps[1:], (1e18,)], strict=True):
        inside = [seen for start, end, _, seen in done if answered < start and end < sent_next]
        assert all(seen == {version} for seen in inside), version
        pinned += len(inside)
    assert pinned > 0
    print(f"\n{len(done)} requests, {len(swaps) - 1} reloads, 0 failed, {pinned} pinned")


def test_a_bad_policy_is_422_with_file_line_errors_and_the_old_version_keeps_serving(
    client: TestClient, policy_file: Path
) -> None:
    before = client.get("/health", headers=ADMIN).json()["config"]["policy_hash"]
    rejected = reloads("rejected")
    lines = policy_text(0.0, extra="\n[shadow]\nfraction = 2.0\nbogus = 1\n").splitlines()
    policy_file.write_text("\n".join(lines))
    r = client.post("/admin/reload", headers=ADMIN)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail["error_type"] == "config_error"
    bogus = lines.index("bogus = 1") + 1
    assert detail["lines"] == [
        f"{policy_file}:{bogus - 1}: error: `shadow.fraction`: Expected `float` <= 1.0",
        f"{policy_file}:{bogus}: error: unknown key `bogus` (known: fraction, max_concurrent, "
        "seed)",
    ]
    assert detail["lines"][0] in detail["message"] and before[:12] in detail["message"]
    assert reloads("rejected") == rejected + 1
    health = client.get("/health", headers=ADMIN).json()["config"]
    assert health["policy_hash"] == before
    assert health["last_reload"]["outcome"] == "rejected"
    assert health["last_reload"]["errors"] == detail["lines"]
    assert tiers_of(client.post("/v1/systemone", json=BODY)) == {"cheap"}
    policy_file.write_text(policy_text(1.0))  # fixed: the next reload applies it
    r = client.post("/admin/reload", headers=ADMIN)
    assert r.status_code == 200 and r.json()["outcome"] == "applied"
    assert r.json()["policy_hash"] == policy_hash(load_policy(policy_file)) != before
    assert tiers_of(client.post("/v1/systemone", json=BODY)) == {"strong"}


def test_config_info_names_what_serves_and_drops_the_old_series(
    client: TestClient, policy_file: Path
) -> None:
    old = policy_hash(load_policy(policy_file))
    assert f'policy_hash="{old}"' in client.get("/metrics", headers=ADMIN).text
    policy_file.write_text(policy_text(1.0))
    assert client.post("/admin/reload", headers=ADMIN).status_code == 200
    info = [
        line
        for line in client.get("/metrics", headers=ADMIN).text.splitlines()
        if line.startswith("cascade_config_info{")
    ]
    new = policy_hash(load_policy(policy_file))
    assert len(info) == 1 and f'policy_hash="{new}"' in info[0] and info[0].endswith(" 1.0")
    unchanged = reloads("unchanged")
    r = client.post("/admin/reload", headers=ADMIN)
    assert r.json()["outcome"] == "unchanged" and reloads("unchanged") == unchanged + 1
    assert r.json()["read"] == [f"policy: {policy_file}"]


def test_a_threshold_reload_keeps_engines_and_breakers_and_runs_the_hooks(
    client: TestClient, policy_file: Path
) -> None:
    gateway: Gateway = services_of(client.app).gateway
    engines, breakers = dict(gateway.engines), dict(gateway.breakers)
    seen: list[Serving] = []
    gateway.reconfigured.append(seen.append)
    policy_file.write_text(policy_text(1.0))
    assert client.post("/admin/reload", headers=ADMIN).status_code == 200
    assert all(gateway.engines[n] is e for n, e in engines.items())
    assert all(gateway.breakers[n] is b for n, b in breakers.items())
    assert seen == [gateway.serving] and seen[0].policy.thresholds.confidence.noul.two == 1.0
    policy_file.write_text(policy_text(1.0, extra="\n[breaker.strong]\nmin_calls = 7\n"))
    assert client.post("/admin/reload", headers=ADMIN).status_code == 200
    assert gateway.breakers["cheap"] is breakers["cheap"]
    assert gateway.breakers["strong"] is not breakers["strong"]  # its settings changed
    assert gateway.breakers["strong"].config.min_calls == 7


def test_a_tier_change_is_409_restart_needed_and_nothing_changes(
    client: TestClient, policy_file: Path
) -> None:
    gateway: Gateway = services_of(client.app).gateway
    serving = gateway.serving
    needed = reloads("restart_needed")
    policy_file.write_text(policy_text(1.0, url="http://127.0.0.1:10"))
    r = client.post("/admin/reload", headers=ADMIN)
    assert r.status_code == 409, r.text
    assert r.json()["detail"]["lines"] == [
        "restart needed: tier `cheap` changes what its engine is built from (kind, weights or "
        "engine settings); a reload applies thresholds, routing, models, breakers, shadow, "
        "degrade, calibration and timeouts"
    ]
    assert gateway.serving is serving and reloads("restart_needed") == needed + 1
    policy_file.write_text(
        policy_text(1.0).replace(
            'urls = ["http://127.0.0.1:9"]\n\n[route]',
            'urls = ["http://127.0.0.1:9"]\ntimeout_s = 2.5\n\n[route]',
        )
    )
    assert client.post("/admin/reload", headers=ADMIN).status_code == 200  # a timeout reloads
    assert gateway.policy.tiers["strong"].timeout_s == 2.5
    policy_file.write_text(policy_text(1.0, extra='\n[decision_log]\nstate = "text"\n'))
    r = client.post("/admin/reload", headers=ADMIN)
    assert r.status_code == 409 and "[decision_log] changes" in r.json()["detail"]["message"]


def test_a_calibration_made_for_other_weights_is_refused(tmp_path: Path) -> None:
    checkpoint = make_tiny(tmp_path / "laya")
    path = tmp_path / "laya.toml"
    path.write_text(
        f'[tiers.laya]\nkind = "laya"\ncheckpoints = {{ english = "{checkpoint}" }}\n'
        '[tiers.strong]\nkind = "upstream"\nurls = ["http://127.0.0.1:9"]\n'
        '[route]\ncheap = "laya"\nstrong = "strong"\n'
    )
    calibration = tmp_path / "calibration.toml"

    def calibrate(weights: str, threshold: float) -> None:
        stamp = CalibrationStamp(
            checkpoints={"laya": weights}, items=10, questions=10, target="escalation", value=0.1
        )
        write_calibration(
            calibration,
            CalibrationFile(
                stamp=stamp,
                thresholds=TypeBands(noul={"2": threshold}),
                temperatures=TypeBands(noul={"2": 1.0}),
            ),
        )

    real = fingerprints(load_policy(path))["laya"]
    calibrate(real, 0.5)
    app = create_app(
        Settings(policy=str(path), calibration=str(calibration), admin_keys=("admin-key",)),
        gateway_of(load_policy(path)),
    )
    with TestClient(app) as client:
        before = client.get("/health", headers=ADMIN).json()["config"]
        calibrate("0" * 64, 0.6)
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 422, r.text
        assert r.json()["detail"]["lines"] == [
            f"{calibration}: error: tier `laya`: the calibration was made for {'0' * 64}, the "
            f"configured weights are {real}; refit it with `cascade calibrate` for these weights"
        ]
        health = client.get("/health", headers=ADMIN).json()
        assert health["config"]["policy_hash"] == before["policy_hash"]
        calibrate(real, 0.6)
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["calibration_hash"] != before["calibration_hash"]
        assert services_of(client.app).gateway.policy.thresholds.confidence.noul.two == 0.6


def test_admin_routes_take_admin_keys_only(policy_file: Path) -> None:
    with TestClient(app_on(policy_file, api_keys=("client-key",))) as client:
        r = client.post("/admin/reload", headers={"authorization": "Bearer client-key"})
        assert r.status_code == 403 and r.json()["detail"]["error_type"] == "permission_error"
        r = client.post("/admin/reload")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert (
            client.post("/admin/reload", headers={"authorization": "Bearer nope"}).status_code
            == 401
        )
        assert client.post("/admin/reload", headers=ADMIN).status_code == 200
        # an admin key is no client key
        assert client.post("/v1/systemone", json=BODY, headers=ADMIN).status_code == 401
    with TestClient(app_on(policy_file, admin_keys=())) as client:  # no admin key: off
        for headers in ({}, ADMIN, {"authorization": "Bearer client-key"}):
            r = client.post("/admin/reload", headers=headers)
            assert r.status_code == 403, r.text
            assert "CASCADE_ADMIN_KEYS" in r.json()["detail"]["message"]
        assert "/admin" not in client.get("/docs/openapi.json").text


def test_the_key_files_are_read_again(policy_file: Path, tmp_path: Path) -> None:
    keys, admin = tmp_path / "keys", tmp_path / "admin-keys"
    keys.write_text("first\n")
    admin.write_text("# operators\nadmin-key\n")
    app = app_on(policy_file, api_keys_file=str(keys), admin_keys=(), admin_keys_file=str(admin))
    with TestClient(app) as client:

        def status(key: str) -> int:
            headers = {"authorization": f"Bearer {key}"}
            return client.post("/v1/systemone", json=BODY, headers=headers).status_code

        assert status("first") == 200 and status("second") == 401
        keys.write_text("second\n")
        admin.write_text("admin-key\nnew-admin\n")
        assert status("first") == 200  # until the reload
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 200 and r.json()["outcome"] == "applied"
        assert r.json()["read"] == [
            f"policy: {policy_file}",
            f"api keys: {keys}",
            f"admin keys: {admin}",
        ]
        assert status("first") == 401 and status("second") == 200
        keys.unlink()
        r = client.post("/admin/reload", headers={"authorization": "Bearer new-admin"})
        assert r.status_code == 422
        assert r.json()["detail"]["lines"][0].startswith(f"CASCADE_API_KEYS_FILE={keys}: ")
        assert status("second") == 200  # the refused reload changed nothing


def test_without_a_policy_file_a_reload_says_what_it_cannot_read() -> None:
    policy = Policy.single_tier("upstream", UpstreamTier(urls=["http://127.0.0.1:9"]))
    app = create_app(
        Settings(upstream="http://127.0.0.1:9", admin_keys=("admin-key",)), gateway_of(policy)
    )
    with TestClient(app) as client:
        r = client.post("/admin/reload", headers=ADMIN)
    assert r.status_code == 200 and r.json()["outcome"] == "unchanged"
    assert r.json()["note"].startswith("no policy file") and r.json()["read"] == []


def test_sighup_reloads_a_served_process(policy_file: Path) -> None:
    """``python -m cascade serve --policy FILE``: edit the file, SIGHUP, and /health names the
    new policy; a broken file on SIGHUP is logged and refused, and the process keeps serving."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "cascade",
        "serve",
        "--policy",
        str(policy_file),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]

    def config() -> dict[str, Any]:
        return dict(httpx.get(url + "/health", timeout=5).json()["config"])

    def after_sighup(proc: subprocess.Popen[bytes], outcome: str) -> dict[str, Any]:
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = config()
            if found.get("last_reload", {}).get("outcome") == outcome:
                return found
            time.sleep(0.1)
        raise AssertionError(f"no {outcome} reload within 20 s: {config()}")

    with run_process(cmd, ready_url=url + "/health", env=dict(os.environ)) as proc:
        assert config()["policy_hash"] == policy_hash(load_policy(policy_file))
        policy_file.write_text(policy_text(1.0))
        found = after_sighup(proc, "applied")
        serving = policy_hash(load_policy(policy_file))
        assert found["policy_hash"] == serving
        policy_file.write_text(policy_text(1.0, extra="\n[route]\n"))  # a second [route] table
        found = after_sighup(proc, "rejected")
        assert found["policy_hash"] == serving
        assert found["last_reload"]["errors"][0].startswith(f"{policy_file}:")
        assert proc.poll() is None


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
