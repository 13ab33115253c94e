"""Every admin action is one audit record (``cascade.audit``): reloads applied and refused, dry
runs, freeze and unfreeze, by the admin key's name (never the key), with the hashes before and
after; tenant keys a reload adds or removes; SIGHUP as ``signal``; both stores; ``GET
/admin/audit`` and ``cascade audit``; a failing store never fails the admin action."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade import metrics
from cascade.audit.log import read
from cascade.cli import main
from cascade.policy.files import load_policy
from cascade.policy.fingerprint import policy_hash
from tests.audit.helpers import ADMIN_FILE, ALICE, BOB, keys_file, served
from tests.http.test_sighup import served as served_process
from tests.replay.helpers import ask, policy_text
from tests.servers import Postgres, free_port, run_redis


def records(client: httpx.Client, headers: dict[str, str], **query: Any) -> list[dict[str, Any]]:
    r = client.get("/admin/audit", headers=headers, params=query)
    assert r.status_code == 200, r.text
    assert r.json()["stored"] is True
    return r.json()["records"]


def admin_actions(tmp_path: Path, client: httpx.Client, policy: Path) -> None:
    """alice reloads a new policy, bob a broken one, alice dry-runs, bob freezes, alice thaws."""
    for n in range(3):
        ask(client, n)
    policy.write_text(policy_text(0.7))
    assert client.post("/admin/reload", headers=ALICE).status_code == 200
    policy.write_text(policy_text(0.7) + "[tiers\n")
    refused = client.post("/admin/reload", headers=BOB)
    assert refused.status_code == 422, refused.text
    policy.write_text(policy_text(0.7))
    assert (
        client.post(
            "/admin/reload?dry_run=1", headers=ALICE, json={"policy": policy_text(0.2)}
        ).status_code
        == 200
    )
    assert client.post("/admin/control/freeze", headers=BOB).status_code == 200
    assert client.post("/admin/control/unfreeze", headers=ALICE).status_code == 200


def check_records(found: list[dict[str, Any]], old: str, new: str) -> None:
    assert [(r["action"], r["actor"], r["outcome"]) for r in found] == [
        ("reload", "alice", "applied"),
        ("reload", "bob", "refused"),
        ("dry_run", "alice", "replayed"),
        ("freeze", "bob", "applied"),
        ("unfreeze", "alice", "applied"),
    ]
    applied, refused = found[0], found[1]
    assert applied["before"]["policy"] == old and applied["after"]["policy"] == new
    assert applied["changed"] == ["thresholds.confidence"]
    assert refused["before"]["policy"] == refused["after"]["policy"] == new
    assert "policy.toml:" in refused["message"] and "error" in refused["message"]
    assert all(r["client"] == "127.0.0.1" and r["replica"] == "r1" for r in found)
    assert all(r["before"]["policy"] == new for r in found[2:])
    assert all(set(r["before"]) == {"policy", "calibration", "keys", "admin_keys"} for r in found)


def test_each_admin_action_leaves_a_record_with_its_admins_name(
    tmp_path: Path, capsys: Any
) -> None:
    policy, db = tmp_path / "policy.toml", tmp_path / "d.db"
    policy.write_text(policy_text(1.0))
    (tmp_path / "admins.toml").write_text(ADMIN_FILE)
    old, new = policy_hash(load_policy(policy)), None
    with served(policy, db, admin_keys_file=str(tmp_path / "admins.toml")) as client:
        admin_actions(tmp_path, client, policy)
        new = policy_hash(load_policy(policy))
        found = records(client, BOB)
        check_records(found, old, new)
        assert [r["action"] for r in records(client, BOB, limit=2)] == ["freeze", "unfreeze"]
        assert records(client, BOB, since=time.time() + 60) == []
        assert client.get("/admin/audit", headers=BOB, params={"limit": 0}).status_code == 422
        assert client.get("/admin/audit").status_code == 401
    raw = db.read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("d.db-*"))
    assert b"alice-key" not in raw and b"bob-key" not in raw
    # cascade audit: the same records, as a table and as JSON lines
    assert main(["audit", "--from-log", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["time", "(UTC)", "action", "actor"]
    assert [line.split()[2:5] for line in lines[1:]] == [
        ["reload", "alice", "127.0.0.1"],
        ["reload", "bob", "127.0.0.1"],
        ["dry_run", "alice", "127.0.0.1"],
        ["freeze", "bob", "127.0.0.1"],
        ["unfreeze", "alice", "127.0.0.1"],
    ]
    assert f"{old[:12]} -> {new[:12]}" in lines[1] and "thresholds.confidence" in lines[1]
    assert main(["audit", "--from-log", str(db), "--json"]) == 0
    check_records([json.loads(line) for line in capsys.readouterr().out.splitlines()], old, new)
    assert main(["audit", "--from-log", str(db), "--json", "--since", "1h"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5


def test_tenant_keys_a_reload_adds_or_removes_are_recorded(tmp_path: Path) -> None:
    policy, db = tmp_path / "policy.toml", tmp_path / "d.db"
    policy.write_text(policy_text(1.0))
    (tmp_path / "admins.toml").write_text(ADMIN_FILE)
    keys = keys_file(tmp_path / "keys.toml", {"acme": ["k1"]})
    with served(
        policy, db, admin_keys_file=str(tmp_path / "admins.toml"), api_keys_file=str(keys)
    ) as client:
        keys_file(keys, {"acme": ["k1", "k2"], "beta": ["k3"]})
        assert client.post("/admin/reload", headers=ALICE).status_code == 200
        keys_file(keys, {"beta": ["k3"]})
        assert client.post("/admin/reload", headers=BOB).status_code == 200
        found = records(client, ALICE)
    changes = [(r["action"], r["actor"], r["detail"]) for r in found if r["action"] != "reload"]
    assert changes == [
        ("tenant_keys_added", "alice", {"tenant": "acme", "keys_before": 1, "keys_after": 2}),
        ("tenant_keys_added", "alice", {"tenant": "beta", "keys_before": 0, "keys_after": 1}),
        ("tenant_keys_removed", "bob", {"tenant": "acme", "keys_before": 2, "keys_after": 0}),
    ]
    reloads = [r for r in found if r["action"] == "reload"]
    assert [r["outcome"] for r in reloads] == ["applied", "applied"]
    assert (
        reloads[0]["before"]["keys"]
        != reloads[0]["after"]["keys"]
        == reloads[1]["before"]["keys"]
        != reloads[1]["after"]["keys"]
    )
    assert reloads[0]["before"]["policy"] == reloads[0]["after"]["policy"]
    assert b"k1" not in db.read_bytes()


def test_old_one_key_per_line_admin_files_and_inline_keys_are_named_by_position(
    tmp_path: Path,
) -> None:
    policy, db = tmp_path / "policy.toml", tmp_path / "d.db"
    policy.write_text(policy_text(1.0))
    (tmp_path / "admin-keys").write_text("# the operators\nfirst-key\nsecond-key\n")
    with served(
        policy, db, admin_keys_file=str(tmp_path / "admin-keys"), admin_keys=("inline-key",)
    ) as client:
        for key in ("second-key", "first-key", "inline-key"):
            # from a trusted proxy (uvicorn's default: loopback) X-Forwarded-For names the client
            forwarded = {"x-forwarded-for": "203.0.113.7"} if key == "inline-key" else {}
            r = client.post(
                "/admin/control/freeze", headers={"authorization": f"Bearer {key}", **forwarded}
            )
            assert r.status_code == 200, r.text
        assert (
            client.post(
                "/admin/control/freeze", headers={"authorization": "Bearer third-key"}
            ).status_code
            == 401
        )
        found = records(client, {"authorization": "Bearer first-key"})
    assert [(r["actor"], r["client"]) for r in found] == [
        ("admin-2", "127.0.0.1"),
        ("admin-1", "127.0.0.1"),
        ("admin-env-1", "203.0.113.7"),
    ]


def test_without_a_decision_log_records_go_to_the_log_only(tmp_path: Path, caplog: Any) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text(1.0))
    logged = metrics.AUDIT_RECORDS.labels(outcome="log_only")._value.get()
    with served(policy, None, admin_keys=("admin-key",)) as client:
        with caplog.at_level("INFO", logger="cascade.audit"):
            r = client.post("/admin/control/freeze", headers={"authorization": "Bearer admin-key"})
        assert r.status_code == 200
        page = client.get("/admin/audit", headers={"authorization": "Bearer admin-key"}).json()
    assert page["stored"] is False and page["records"] == [] and "log only" in page["note"]
    assert metrics.AUDIT_RECORDS.labels(outcome="log_only")._value.get() == logged + 1
    line = next(r.getMessage() for r in caplog.records if r.name == "cascade.audit")
    record = json.loads(line.removeprefix("audit "))
    assert (record["action"], record["actor"], record["outcome"]) == (
        "freeze",
        "admin-env-1",
        "applied",
    )
    assert "admin-key" not in line.replace("admin-keys", "")


def test_a_failing_audit_store_never_fails_the_admin_action(tmp_path: Path) -> None:
    policy, db = tmp_path / "policy.toml", tmp_path / "d.db"
    policy.write_text(policy_text(1.0))
    failed = metrics.AUDIT_RECORDS.labels(outcome="failed")._value.get()
    with served(policy, db, admin_keys=("admin-key",)) as client:
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TABLE audit")
        admin = {"authorization": "Bearer admin-key"}
        assert client.post("/admin/control/freeze", headers=admin).json()["frozen"] is True
        policy.write_text(policy_text(0.5))
        r = client.post("/admin/reload", headers=admin)
        assert r.status_code == 200 and r.json()["outcome"] == "applied"
        unreadable = client.get("/admin/audit", headers=admin)  # after the writes, on their thread
        assert unreadable.status_code == 503, unreadable.text
        assert "retry-after" in unreadable.headers
    assert metrics.AUDIT_RECORDS.labels(outcome="failed")._value.get() == failed + 2


def test_a_sighup_reload_is_recorded_as_signal(tmp_path: Path) -> None:
    policy, db = tmp_path / "policy.toml", tmp_path / "d.db"
    policy.write_text(policy_text(1.0))
    (tmp_path / "admins.toml").write_text(ADMIN_FILE)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    env |= {"CASCADE_ADMIN_KEYS_FILE": str(tmp_path / "admins.toml"), "CASCADE_REPLICA": "r9"}
    cmd = [
        sys.executable,
        "-m",
        "cascade",
        "serve",
        "--policy",
        str(policy),
        "--port",
        str(port),
        "--decision-log",
        str(db),
    ]
    with served_process(cmd, url, tmp_path / "serve.log", env) as proc:
        policy.write_text(policy_text(0.5))
        proc.send_signal(signal.SIGHUP)
        found: list[dict[str, Any]] = []
        for _ in range(300):  # bounded: the reload runs in a moment
            found = httpx.get(url + "/admin/audit", headers=ALICE, timeout=30).json()["records"]
            if found:
                break
            time.sleep(0.1)
    assert [
        (r["action"], r["actor"], r["outcome"], r.get("client"), r["replica"]) for r in found
    ] == [("reload", "signal", "applied", None, "r9")]
    assert found[0]["before"]["policy"] != found[0]["after"]["policy"]
    assert [r.actor for r in read(str(db))] == ["signal"]


def test_postgres_keeps_the_audit_log_of_a_fleet(
    postgres: Postgres, tmp_path: Path, capsys: Any
) -> None:
    url = postgres.database("audit")
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text(1.0))
    (tmp_path / "admins.toml").write_text(ADMIN_FILE)
    old = policy_hash(load_policy(policy))
    with served(
        policy, url, tmp_path / "spool", admin_keys_file=str(tmp_path / "admins.toml")
    ) as client:
        admin_actions(tmp_path, client, policy)
        new = policy_hash(load_policy(policy))
        check_records(records(client, ALICE), old, new)
    check_records([_plain(r) for r in read(url)], old, new)
    assert main(["audit", "--from-log", url, "--json"]) == 0
    check_records([json.loads(line) for line in capsys.readouterr().out.splitlines()], old, new)


def _plain(record: Any) -> dict[str, Any]:
    import msgspec

    return msgspec.to_builtins(record)  # type: ignore[no-any-return]


@pytest.mark.parametrize("limit", ["0", "1001", "x"])
def test_a_bad_limit_is_a_422(tmp_path: Path, limit: str) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text(1.0))
    with served(policy, tmp_path / "d.db", admin_keys=("admin-key",)) as client:
        r = client.get(
            "/admin/audit", headers={"authorization": "Bearer admin-key"}, params={"limit": limit}
        )
    assert r.status_code == 422, r.text
    assert "limit" in r.text


def test_a_fleet_reload_is_recorded_by_its_admin_and_each_replica_by_fleet(tmp_path: Path) -> None:
    policy, db = tmp_path / "policy.toml", tmp_path / "d.db"
    policy.write_text(policy_text(1.0))
    (tmp_path / "admins.toml").write_text(ADMIN_FILE)
    with (
        run_redis() as (url, _),
        served(
            policy, db, admin_keys_file=str(tmp_path / "admins.toml"), fleet_redis=url
        ) as client,
    ):
        policy.write_text(policy_text(0.5))
        r = client.post("/admin/reload?scope=fleet", headers=ALICE)
        assert r.status_code == 200 and r.json()["refused"] == [], r.text
        found = records(client, ALICE)
    assert sorted((r["action"], r["actor"], r["outcome"]) for r in found) == [
        ("fleet_reload", "alice", "applied"),
        ("reload", "fleet", "applied"),
    ]
    fleet = next(r for r in found if r["action"] == "fleet_reload")
    assert list(fleet["detail"]["replicas"].values()) == ["applied"]  # this one, by hostname
    assert fleet["detail"]["not_answered"] == []
    assert fleet["client"] == "127.0.0.1"


def test_a_fleet_reload_with_the_fleet_off_is_recorded_as_failed(tmp_path: Path) -> None:
    policy, db = tmp_path / "policy.toml", tmp_path / "d.db"
    policy.write_text(policy_text(1.0))
    with served(policy, db, admin_keys=("admin-key",)) as client:
        admin = {"authorization": "Bearer admin-key"}
        assert client.post("/admin/reload?scope=fleet", headers=admin).status_code == 409
        found = records(client, admin)
    assert [(r["action"], r["actor"], r["outcome"]) for r in found] == [
        ("fleet_reload", "admin-env-1", "failed")
    ]
    assert "CASCADE_FLEET_REDIS" in found[0]["message"]
