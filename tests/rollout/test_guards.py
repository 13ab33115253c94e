"""The guards on a real server with a decision log and synthetic feedback labels: a candidate
that sends everything strong is rolled back on its own, one that decides as well as the current
version is promoted through its step to 100 %; the rollout's state survives a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.audit.helpers import served
from tests.replay.helpers import policy_text
from tests.rollout.served import ALICE, ALL_STRONG, hashes, send, write

GUARDS = {
    "auto": True,
    "max_strong_share_delta": 0.2,
    "max_error_rate": 0.2,
    "min_labelled_accuracy_delta": -0.3,
}
LABELS = {"urgent": True, "team": "billing"}  # synthetic truth, the same for both arms


def drive(client: httpx.Client, candidate: str, limit: int = 3000) -> dict[str, Any]:
    """Requests with labels, ten at a time, until the rollout is decided (at most ``limit``):
    the rollout's status then, the requests sent and how many of them the candidate served."""
    sent = exposed = 0
    status = client.get("/admin/rollout", headers=ALICE).json()
    while status["status"] == "running" and sent < limit:
        for n in range(sent, sent + 10):
            exposed += send(client, n).headers["x-cascade-policy"] == candidate
            r = client.post("/v1/feedback", json={"request_id": f"r{n}", "labels": LABELS})
            assert r.status_code == 200, r.text
        sent += 10
        status = client.get("/admin/rollout", headers=ALICE).json()
    return {**status, "sent": sent, "exposed": exposed}


def audited(client: httpx.Client) -> list[tuple[str, str]]:
    records = client.get("/admin/audit", headers=ALICE).json()["records"]
    return [(r["action"], r["actor"]) for r in records if r["action"].startswith("rollout")]


def test_a_candidate_that_sends_everything_strong_is_rolled_back(tmp_path: Path) -> None:
    policy = write(tmp_path, ALL_STRONG, share=0.3, **GUARDS)
    current, candidate = hashes(tmp_path)
    with served(policy, tmp_path / "d.db", admin_keys_file=str(tmp_path / "admins.toml")) as client:
        found = drive(client, candidate)
        print(
            f"\nbad candidate: rolled back after {found['sent']} requests, {found['exposed']} ",
            end="",
        )
        print("of them served by the candidate")
        assert found["status"] == "rolled_back", found
        assert "strong" in found["reason"]
        after = {send(client, n).headers["x-cascade-policy"] for n in range(5000, 5020)}
        assert after == {current}
        assert audited(client) == [("rollout_start", "boot"), ("rollout_rollback", "auto")]


def test_a_candidate_as_good_as_the_current_is_promoted_through_its_step(tmp_path: Path) -> None:
    good = 'description = "the same thresholds, another version"\n' + policy_text(0.0)
    policy = write(tmp_path, good, share=0.2, extra="steps = [0.5]", **GUARDS)
    _, candidate = hashes(tmp_path)
    with served(policy, tmp_path / "d.db", admin_keys_file=str(tmp_path / "admins.toml")) as client:
        found = drive(client, candidate)
        print(
            f"\ngood candidate: promoted after {found['sent']} requests, {found['exposed']} ",
            end="",
        )
        print("of them served by the candidate")
        assert found["status"] == "promoted", found
        assert found["serving_hash"] == candidate
        assert audited(client) == [
            ("rollout_start", "boot"),
            ("rollout_step", "auto"),
            ("rollout_promote", "auto"),
        ]


def test_the_state_survives_a_restart(tmp_path: Path) -> None:
    policy = write(tmp_path, ALL_STRONG, share=0.5)
    current, _ = hashes(tmp_path)
    db, keys = tmp_path / "d.db", str(tmp_path / "admins.toml")
    with served(policy, db, admin_keys_file=keys) as client:
        first = client.get("/admin/rollout", headers=ALICE).json()
    with served(policy, db, admin_keys_file=keys) as client:
        again = client.get("/admin/rollout", headers=ALICE).json()
        assert (again["status"], again["id"], again["started"]) == (
            "running",
            first["id"],
            first["started"],
        )
        assert client.post("/admin/rollout/abort", headers=ALICE).status_code == 200
    with served(policy, db, admin_keys_file=keys) as client:
        ended = client.get("/admin/rollout", headers=ALICE).json()
        assert (ended["status"], ended["id"]) == ("aborted", first["id"])
        assert {send(client, n).headers["x-cascade-policy"] for n in range(20)} == {current}


def test_a_promoted_candidate_serves_after_a_restart(tmp_path: Path) -> None:
    policy = write(tmp_path, ALL_STRONG, share=0.5)
    _, candidate = hashes(tmp_path)
    db, keys = tmp_path / "d.db", str(tmp_path / "admins.toml")
    with served(policy, db, admin_keys_file=keys) as client:
        assert client.post("/admin/rollout/promote", headers=ALICE).status_code == 200
    with served(policy, db, admin_keys_file=keys) as client:
        found = client.get("/admin/rollout", headers=ALICE).json()
        assert (found["status"], found["serving_hash"]) == ("promoted", candidate)
        assert {send(client, n).headers["x-cascade-policy"] for n in range(20)} == {candidate}
