"""A reload and the keys file's ``[limits]`` (``cascade.http.reload``): the limits store is built
at boot, so a changed ``[limits]`` is 409 "restart needed" and nothing changes, while a keys
change under the same ``[limits]`` still applies."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from cascade.http.services import services_of
from cascade.tenants.keys import hashed
from tests.http.test_reload import ADMIN, BODY, app_on, policy_text, reloads


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(policy_text(0.0))
    return path


def keys_text(*names: str, limits: str = "") -> str:
    tenants = "".join(
        f'[[tenant]]\nname = "{n}"\nkeys = ["{hashed(n + "-key")}"]\nrequests_per_min = 600\n\n'
        for n in names
    )
    return tenants + (f"[limits]\n{limits}\n" if limits else "")


def status(client: TestClient, name: str) -> int:
    headers = {"authorization": f"Bearer {name}-key"}
    return client.post("/v1/systemone", json=BODY, headers=headers).status_code


@pytest.mark.parametrize(
    ("limits", "changed"),
    [
        ('backend = "redis"\nurl = "redis://127.0.0.1:9/0"', "backend, url"),
        ('on_error = "closed"', "on_error"),
        ("timeout_s = 0.5", "timeout_s"),
    ],
    ids=["redis", "on_error", "timeout_s"],
)
def test_a_changed_limits_table_is_409_restart_needed_and_nothing_changes(
    policy_file: Path, tmp_path: Path, limits: str, changed: str
) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(keys_text("acme"))
    with TestClient(app_on(policy_file, api_keys_file=str(keys))) as client:
        services = services_of(client.app)
        tenants, admission = services.access.tenants, services.tenant_admission
        needed = reloads("restart_needed")
        keys.write_text(keys_text("acme", "beta", limits=limits))
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 409, r.text
        assert r.json()["detail"]["lines"] == [
            f"restart needed: the API keys file's [limits] changes ({changed}; the limits store "
            "is built at boot); a reload applies keys, tenants, their limits and policies"
        ]
        assert reloads("restart_needed") == needed + 1
        assert services.access.tenants is tenants and services.tenant_admission is admission
        assert status(client, "acme") == 200 and status(client, "beta") == 401


def test_a_keys_change_under_the_same_limits_table_applies(
    policy_file: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.toml"
    limits = 'on_error = "closed"\ntimeout_s = 0.2'
    keys.write_text(keys_text("acme", limits=limits))
    with TestClient(app_on(policy_file, api_keys_file=str(keys))) as client:
        admission = services_of(client.app).tenant_admission
        keys.write_text(keys_text("acme", "beta", limits=limits))
        r = client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 200 and r.json()["outcome"] == "applied", r.text
        assert status(client, "beta") == 200 and status(client, "acme") == 200
        assert services_of(client.app).tenant_admission is admission  # counters carry over
